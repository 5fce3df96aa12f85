"""Bad input raises a clear error naming the argument (docs/design.md "Errors")."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fast
from fast import CausalMask, PackingMask, PaddingMask, favor_attention, masked_linear_attention
from fast.validation import check_same_device
from tests.helpers import gen, positive, randn

G = gen(0)
PQ, PK, V = positive((6, 4), G), positive((6, 4), G), randn((6, 3), G)
Q, K = randn((6, 4), G), randn((6, 4), G)
W = fast.gaussian_projection(8, 4, generator=G, dtype=torch.float64)


def _nan(t, value=float("nan")):
    t = t.clone()
    t[2, 1] = value
    return t


CASES = {
    # masked_linear_attention: shapes
    "m-mismatch": (lambda: masked_linear_attention(PQ, positive((6, 5), G), V), ValueError, "phi_q and phi_k"),
    "v-wrong-N": (lambda: masked_linear_attention(PQ, PK, randn((7, 3), G)), ValueError, r"phi_k .* and v"),
    "N-mismatch-masked": (lambda: masked_linear_attention(positive((5, 4), G), PK, V, CausalMask(6)), ValueError, "mask"),
    "batch-mismatch": (lambda: masked_linear_attention(positive((2, 6, 4), G), positive((3, 6, 4), G), randn((3, 6, 3), G)),
                       ValueError, "phi_q and phi_k"),
    "1-D": (lambda: masked_linear_attention(PQ[0], PK[0], V[0]), ValueError, "phi_q must have shape"),
    "non-tensor": (lambda: masked_linear_attention(PQ.numpy(), PK, V), TypeError, "phi_q must be a torch.Tensor"),
    "list": (lambda: masked_linear_attention(PQ, PK, V.tolist()), TypeError, "v must be a torch.Tensor"),
    "int-dtype": (lambda: masked_linear_attention(PQ, PK, torch.ones(6, 3, dtype=torch.int64)), TypeError, "v must be a floating"),
    "bool-dtype": (lambda: masked_linear_attention(PQ > 0.5, PK, V), TypeError, "phi_q must be a floating"),
    "N=0": (lambda: masked_linear_attention(PQ[:0], PK[:0], V[:0]), ValueError, "N >= 1"),
    "m=0": (lambda: masked_linear_attention(PQ[:, :0], PK[:, :0], V), ValueError, "phi_q must have a non-empty feature"),
    "nan": (lambda: masked_linear_attention(PQ, _nan(PK), V), ValueError, "phi_k contains non-finite"),
    "inf": (lambda: masked_linear_attention(PQ, PK, _nan(V, float("inf"))), ValueError, "v contains non-finite"),
    "mask-N": (lambda: masked_linear_attention(PQ, PK, V, PaddingMask(torch.ones(5, dtype=torch.bool))), ValueError, "mask is for N=5"),
    "mask-not-square": (lambda: masked_linear_attention(PQ, PK, V, torch.ones(6, 5)), ValueError, "mask must be a square"),
    "mask-dense-N": (lambda: masked_linear_attention(PQ, PK, V, torch.ones(5, 5)), ValueError, "mask is for N=5"),
    "not-a-mask": (lambda: masked_linear_attention(PQ, PK, V, "causal"), TypeError, "mask must be a MaskOperator .* got str"),
    "favor-not-a-mask": (lambda: favor_attention(Q, K, V, W, [[1.0]]), TypeError, "mask must be a MaskOperator .* got list"),
    "block_cols=0": (lambda: masked_linear_attention(PQ, PK, V, PackingMask(torch.zeros(6, dtype=torch.int64)), block_cols=0),
                     ValueError, "block_cols must be a positive integer"),
    "block_cols=-3": (lambda: masked_linear_attention(PQ, PK, V, block_cols=-3), ValueError, "block_cols"),
    "block_cols-float": (lambda: masked_linear_attention(PQ, PK, V, block_cols=2.0), ValueError, "block_cols"),
    "block_cols-bool": (lambda: masked_linear_attention(PQ, PK, V, block_cols=True), ValueError, "block_cols"),
    # favor_attention / feature maps
    "favor-q-nan": (lambda: favor_attention(_nan(Q), K, V, W), ValueError, "q contains non-finite"),
    "favor-k-int": (lambda: favor_attention(Q, K.long(), V, W), TypeError, "k must be a floating"),
    "favor-v-N": (lambda: favor_attention(Q, K, V[:5], W), ValueError, "v"),
    "favor-projection-d": (lambda: favor_attention(Q, K, V, W[:, :3]), ValueError, "projection expects d=3"),
    "favor-projection-nan": (lambda: favor_attention(Q, K, V, _nan(W)), ValueError, "projection contains non-finite"),
    "favor-projection-1D": (lambda: favor_attention(Q, K, V, W[0]), ValueError, "projection"),
    "favor-projection-3D": (lambda: favor_attention(Q, K, V, W[None]), ValueError, "projection must have shape"),
    "feature-x-width": (lambda: fast.FavorPlus(W)(randn((3, 5), G)), ValueError, "x has feature width 5"),
    # softmax
    "softmax-dqk": (lambda: fast.softmax_attention(Q, K[:, :3], V), ValueError, "q and k"),
    "softmax-N": (lambda: fast.softmax_attention(Q, K, V[:5]), ValueError, "k and v"),
    "softmax-bool-mask": (lambda: fast.softmax_attention(Q, K, V, torch.ones(6, 6, dtype=torch.bool)), TypeError, "logits_mask"),
    "softmax-non-tensor": (lambda: fast.softmax_attention(Q.numpy(), K, V), TypeError, "q must be a torch.Tensor"),
    # gaussian_projection
    "projection-m=0": (lambda: fast.gaussian_projection(0, 4, generator=gen(0)), ValueError, "m must be a positive integer"),
    "projection-m=-1": (lambda: fast.gaussian_projection(-1, 4, generator=gen(0)), ValueError, "m must be a positive integer"),
    "projection-d=0": (lambda: fast.gaussian_projection(4, 0, generator=gen(0)), ValueError, "d must be a positive integer"),
    "projection-m-float": (lambda: fast.gaussian_projection(4.0, 4, generator=gen(0)), ValueError, "m must be a positive integer"),
    # mask constructors
    "causal-chunk=0": (lambda: CausalMask(6, chunk=0), ValueError, "chunk must be a positive integer"),
    "causal-n=0": (lambda: CausalMask(0), ValueError, "n must be a positive integer"),
    "causal-matmul-N": (lambda: CausalMask(6).matmul(randn((5, 2), G)), ValueError, "x must have N=6"),
    "segment_ids-float": (lambda: PackingMask(torch.zeros(6)), TypeError, "segment_ids must be an integer tensor"),
    "segment_ids-bool": (lambda: PackingMask(torch.zeros(6, dtype=torch.bool)), TypeError, "segment_ids"),
    "segment_ids-numpy": (lambda: PackingMask(np.zeros(6, dtype=np.int64)), TypeError, "segment_ids"),
    "segment_ids-empty": (lambda: PackingMask(torch.zeros(0, dtype=torch.int64)), ValueError, "segment_ids must have shape"),
    "segment_ids-0d": (lambda: PackingMask(torch.tensor(3)), ValueError, "segment_ids must have shape"),
    "packing-matmul-N": (lambda: PackingMask(torch.zeros(6, dtype=torch.int64)).matmul(randn((5, 2), G)), ValueError, "x must have N=6"),
    "key_mask-int": (lambda: PaddingMask(torch.ones(6, dtype=torch.int64)), TypeError, "key_mask must be a bool tensor"),
    "key_mask-float": (lambda: PaddingMask(torch.ones(6)), TypeError, "key_mask"),
    "key_mask-empty": (lambda: PaddingMask(torch.ones(0, dtype=torch.bool)), ValueError, "key_mask must have shape"),
    "lengths-above": (lambda: PaddingMask.from_lengths(torch.tensor([3, 7]), 6), ValueError, "lengths must lie in"),
    "lengths-negative": (lambda: PaddingMask.from_lengths(torch.tensor([-1, 2]), 6), ValueError, "lengths must lie in"),
    "lengths-float": (lambda: PaddingMask.from_lengths(torch.tensor([1.0, 2.0]), 6), TypeError, "lengths must be a 1-D integer"),
    "lengths-2D": (lambda: PaddingMask.from_lengths(torch.tensor([[1, 2]]), 6), TypeError, "lengths must be a 1-D"),
    "lengths-n=0": (lambda: PaddingMask.from_lengths(torch.tensor([0]), 0), ValueError, "n must be a positive integer"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_clear_error(case):
    call, exc, match = CASES[case]
    with pytest.raises(exc, match=match):
        call()


def test_favor_attention_non_tensor_projection_is_a_type_error():
    with pytest.raises(TypeError, match="projection"):
        favor_attention(Q, K, V, W.numpy())


def test_cross_attention_is_allowed_without_a_mask():
    """Only a mask ties N_q to N: without one, N_q != N is valid (power check for 'N-mismatch-masked')."""
    assert masked_linear_attention(positive((5, 4), G), PK, V).shape == (5, 3)


def test_mixed_devices_refused_by_validation():
    # simulated with the meta device (no data, so the finiteness check cannot run on it; the device
    # check is called directly); a real CPU/CUDA mix is tested in test_dtype_device.py under CUDA
    with pytest.raises(ValueError, match="one device"):
        check_same_device(phi_q=PQ, phi_k=torch.empty(6, 4, device="meta"))
    check_same_device(phi_q=PQ, phi_k=PK)  # same device: no error


# ------------------------------------------------------------------ check_allocation (issue 24)


def test_check_allocation_counts_bytes_with_python_ints_and_names_the_argument(monkeypatch):
    import fast.validation as fv

    assert fv.check_allocation("n = 3", (3, 4), torch.float32) == 48
    assert fv.check_allocation("n = 3", 3, torch.float64, copies=2) == 48
    monkeypatch.setattr(fv, "memory_limit", lambda device=None: 1000)
    assert fv.check_allocation("k = 125", (125,), torch.float64) == 1000  # at the limit: allowed
    with pytest.raises(MemoryError, match=r"k = 126 asks for the noise of shape \(126,\) \(torch.float64\): 1008 bytes, "
                                          r"more than this machine's memory \(RAM\), 1000 bytes"):
        fv.check_allocation("k = 126", (126,), torch.float64, what="the noise")
    # a product past int64 (2^100 entries) is a Python int here, never an overflow
    with pytest.raises(MemoryError, match="TiB"):
        fv.check_allocation("shape", (2**50, 2**50), torch.float32)


def test_memory_limit_is_the_machines_ram():
    import os

    import fast.validation as fv

    assert fv.memory_limit() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") == fv.memory_limit("cpu")


@pytest.mark.parametrize("bad, error", [("gpu0", ValueError), ([0], TypeError), (1.5, TypeError), (True, TypeError)])
def test_check_device_names_the_argument(bad, error):
    from fast.validation import check_device

    assert check_device("device", "cpu") == torch.device("cpu")
    with pytest.raises(error, match=r"^where must"):
        check_device("where", bad)


def test_memory_limit_on_cuda_is_the_devices_memory(monkeypatch):
    """On a CUDA device the limit is the device's total memory and the message says so (faked here)."""
    import types

    import fast.validation as fv

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=4096))
    assert fv.memory_limit("cuda:0") == 4096
    with pytest.raises(MemoryError, match=r"samples = 1000 asks for .* 7.81 KiB, more than the device's memory, 4 KiB"):
        fv.check_allocation("samples = 1000", (1000, 2), torch.float32, "cuda:0")
