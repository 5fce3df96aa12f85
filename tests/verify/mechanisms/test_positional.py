"""verify/mechanisms/positional.py and Mechanism.size_rule: grid shapes, admissible sizes,
problems whose dense and fast masks are the same matrix, batched problems, and the option and
protocol variants (each option is really exercised; the mask parameters reach the operator).

The protocol helpers (``protocol_*``, ``CallCounter``) live in helpers.py, shared with test_tree.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fast
from tests.verify.mechanisms.helpers import (
    CallCounter,
    protocol_held_case,
    protocol_learnable_case,
    protocol_per_slice_case,
    protocol_update_case,
    variant_reasons,
)
from verify.mechanisms import positional as MP
from verify.mechanisms import get, mechanisms
from verify.registry import EQUIVALENCE_BATCH

POSITIONAL = ("toeplitz-1d", "block-toeplitz", "low-rank", "hypercube-gdk")


def test_grid_shape_is_the_most_square_factorisation():
    for n in range(1, 501):
        a, b = MP.grid_shape(n)
        assert a * b == n and a <= b
        best = max(d for d in range(1, n + 1) if n % d == 0 and d * d <= n)  # brute force
        assert a == best, n


def test_grid_shape_documented_examples():
    assert MP.grid_shape(2**20) == (1024, 1024)
    assert MP.grid_shape(2**17) == (256, 512)
    assert MP.grid_shape(300) == (15, 20)
    assert MP.grid_shape(997) == (1, 997)
    assert MP.grid_shape(300, 3) == (5, 6, 10) and MP.grid_shape(64, 3) == (4, 4, 4)
    assert MP.grid_shape(37, 3) == (1, 1, 37) and MP.grid_shape(1, 3) == (1, 1, 1)
    assert MP.grid_shape(12, 1) == (12,)


def test_grid_shape_in_three_dims_factorises_and_is_near_cube():
    for n in range(1, 400):
        shape = MP.grid_shape(n, 3)
        assert len(shape) == 3 and math.prod(shape) == n and list(shape) == sorted(shape), n
        assert shape[0] ** 3 <= n  # the smallest side is at most the cube root
    with pytest.raises(ValueError, match="dims"):
        MP.grid_shape(8, 0)


def test_hypercube_admissible_is_the_largest_power_of_two_at_most_n():
    mech = get("hypercube-gdk")
    for n in range(1, 3000):
        got = mech.admissible(n)
        assert got <= n and got & (got - 1) == 0 and 2 * got > n, n
    assert mech.admissible(2**20) == 2**20 and mech.admissible(2**20 - 1) == 2**19


def test_other_mechanisms_admit_every_n():
    for mech in mechanisms():
        if mech.id != "hypercube-gdk":
            assert mech.size_rule is None
            assert [mech.admissible(n) for n in (1, 7, 300)] == [1, 7, 300]


@pytest.mark.parametrize("n", [3, 6, 12, 100, 1000])
def test_hypercube_problem_refuses_non_powers_of_two(n):
    with pytest.raises(ValueError, match="power of two"):
        get("hypercube-gdk").make_problem(n, 0)


FAST_MASKS = {
    "toeplitz-1d": MP._toeplitz_fast,
    "block-toeplitz": MP._block_fast,
    "low-rank": MP._low_rank_fast,
    "hypercube-gdk": MP._hypercube_fast,
}


def test_records_name_their_fast_masks():
    for mech_id, make in FAST_MASKS.items():
        assert get(mech_id).fast_mask is make and get(mech_id).linear


@pytest.mark.parametrize("mech_id, n", [(m, n) for m in POSITIONAL for n in (1, 16, 12) if m != "hypercube-gdk" or n != 12])
def test_dense_mask_is_the_fast_operator_and_positive(mech_id, n):
    """The gallery's dense mask and the operator the fast path uses are one matrix (float64)."""
    mech = get(mech_id)
    p = mech.make_problem(n, 3)
    dense = mech.dense_mask(p)
    assert dense.shape == (n, n) and np.all(dense > 0)
    got = FAST_MASKS[mech_id](p, "cpu").matmul(torch.eye(n, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(got, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())


@pytest.mark.parametrize("mech_id", POSITIONAL)
def test_fast_equals_reference_float64(mech_id):
    mech = get(mech_id)
    p = mech.make_problem(32, 1)
    out = mech.fast(p, dtype=torch.float64)
    ref = mech.reference(p)
    assert out.shape == ref.shape == (32, 16)
    assert np.linalg.norm(out.numpy() - ref) <= 1e-10 * np.linalg.norm(ref)


def test_problem_extras():
    p = MP.toeplitz_problem(10, 0)
    assert set(p.extras) == {"coeffs"} and p.extras["coeffs"].shape == (19,) and np.all(p.extras["coeffs"] > 0)
    b = MP.block_toeplitz_problem(12, 0)
    assert set(b.extras) == {"grid_shape", "table"} and tuple(b.extras["grid_shape"]) == (3, 4)
    assert b.extras["table"].shape == (5, 7) and np.all(b.extras["table"] > 0)
    lr = MP.low_rank_problem(9, 0)
    assert lr.extras["encodings"].shape == (9, 2 * MP.RPE_FREQS)
    assert lr.extras["rpe_projection"].shape == (MP.RPE_FEATURES, 2 * MP.RPE_FREQS)
    # deterministic in the seed, and the seed matters
    np.testing.assert_array_equal(MP.toeplitz_problem(10, 0).extras["coeffs"], p.extras["coeffs"])
    assert not np.array_equal(MP.toeplitz_problem(10, 1).extras["coeffs"], p.extras["coeffs"])
    # keys after the query (negative offsets) decay twice as fast: far ahead is smaller on average
    far = np.log(MP.toeplitz_problem(400, 0).extras["coeffs"])
    assert far[:100].mean() < far[-100:].mean() - 1.0
    assert math.isclose(float(MP.hypercube_problem(8, 0).extras["lam"]), MP.HYPERCUBE_LAMBDA)
    with pytest.raises(ValueError, match="build must be one of"):
        MP.toeplitz_problem(10, 0, build="nope")
    with pytest.raises(ValueError, match="build must be one of"):
        MP.block_toeplitz_problem(10, 0, build="causal-function")  # 1-D only


# ------------------------------------------------------------------- batched problems, per slice


PLAIN_CASES = [(m, v.name) for m in POSITIONAL for v in get(m).all_variants if v.protocol == "plain"]


@pytest.mark.parametrize("mech_id, variant", PLAIN_CASES)
@pytest.mark.parametrize("n", [1, 37, 300])
def test_batched_problem_fast_equals_reference_per_slice(mech_id, variant, n):
    mech = get(mech_id)
    protocol_per_slice_case(mech, mech.variant(variant), mech.admissible(n))


# ------------------------------------------------------------------------------ option variants


def test_variants_and_protocols_declared():
    names = {m: [v.name for v in get(m).all_variants] for m in POSITIONAL}
    assert names == {
        "toeplitz-1d": ["default", "from-log-coefficients", "causal-function", "update", "learnable"],
        "block-toeplitz": ["default", "cls-token", "grid-3d", "chunked", "from-log-table", "update", "learnable"],
        "low-rank": ["default", "learnable"],
        "hypercube-gdk": ["default", "update", "learnable", "backward"],
    }
    for m in POSITIONAL:
        mech = get(m)
        assert mech.default_variant.sweep and not any(v.sweep for v in mech.all_variants[1:])  # same cost class
        assert all(v.protocol == v.name for v in mech.all_variants if v.name in ("update", "learnable", "backward"))
        assert all(v.protocol == "plain" for v in mech.all_variants
                   if v.name not in ("update", "learnable", "backward"))
    assert [get(m).mask_params for m in POSITIONAL] == [("coeffs",), ("table",), ("encodings", "rpe_projection"),
                                                         ("lam",)]


@pytest.mark.parametrize("mech_id", POSITIONAL)
def test_every_variant_holds_the_mask_params(mech_id):
    mech = get(mech_id)
    for v in mech.all_variants:
        p = mech.problem(mech.admissible(16), 0, v)
        assert all(np.issubdtype(np.asarray(p.extras[k]).dtype, np.floating) for k in mech.mask_params), v.name


def test_cls_token_variant_has_a_cls_token():
    mech = get("block-toeplitz")
    p = mech.problem(37, 0, "cls-token")
    assert p.n == 37 and p.extras["cls_token"] and tuple(p.extras["grid_shape"]) == (6, 6)  # 36 grid tokens + CLS
    dense = mech.dense_mask(p)
    assert np.all(dense[0] == 1) and np.all(dense[:, 0] == 1) and not np.all(dense[1:, 1:] == 1)
    op = mech.fast_mask(p, "cpu")
    assert op.cls_token and op.n == 37
    np.testing.assert_allclose(op.matmul(torch.eye(37, dtype=torch.float64)).numpy(), dense, rtol=1e-12, atol=1e-14)
    # one token leaves no room for a grid beside the CLS token: the plain 1-node grid (documented)
    one = mech.problem(1, 0, "cls-token")
    assert "cls_token" not in one.extras and not mech.fast_mask(one, "cpu").cls_token


def test_grid_3d_variant_is_three_dimensional():
    mech = get("block-toeplitz")
    p = mech.problem(300, 0, "grid-3d")
    assert tuple(p.extras["grid_shape"]) == (5, 6, 10) and p.extras["table"].shape == (9, 11, 19)
    assert mech.fast_mask(p, "cpu").grid_shape == (5, 6, 10)


@pytest.mark.parametrize("n", [1, 37, 300])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_variant_runs_several_chunks(n, dtype):
    """The chunked operator splits every product into several transforms (the default does one)."""
    mech = get("block-toeplitz")
    counts = {}
    for variant in ("default", "chunked"):
        runner = mech.fast_setup(mech.problem(n, 0, variant, batch=EQUIVALENCE_BATCH), "cpu", dtype)
        with CallCounter() as counter:
            runner()
        counts[variant] = counter.calls["fft_rfftn"]
    op = mech.fast_mask(mech.problem(n, 0, "chunked"), "cpu")
    assert op.max_chunk_bytes == MP.CHUNK_COLUMNS * MP._spectrum_bytes(op.grid_shape)
    assert op.max_chunk_bytes < fast.masks.toeplitz.DEFAULT_MAX_CHUNK_BYTES
    # default: three products (gradient_inputs' one-column probe, M phi_k, the one numerator block),
    # each the table's spectrum (recomputed per product: never stale) and one transform
    assert counts["default"] <= 6 and counts["chunked"] >= 3 * counts["default"], counts


def _spy(monkeypatch, cls, name) -> list[dict]:
    """Record the keyword arguments of every call of classmethod ``cls.name`` (the original runs)."""
    calls = []
    original = getattr(cls, name)

    def spy(*args, **kw):
        calls.append(kw)
        return original(*args, **kw)

    monkeypatch.setattr(cls, name, spy)
    return calls


@pytest.mark.parametrize("mech_id, variant, cls, method", [
    ("toeplitz-1d", "from-log-coefficients", fast.ToeplitzMask, "from_log_coefficients"),
    ("toeplitz-1d", "causal-function", fast.ToeplitzMask, "from_function"),
    ("block-toeplitz", "from-log-table", fast.BlockToeplitzMask, "from_log_table"),
])
def test_construction_variants_use_their_constructor(monkeypatch, mech_id, variant, cls, method):
    mech = get(mech_id)
    calls = _spy(monkeypatch, cls, method)
    mech.fast_mask(mech.problem(37, 0), "cpu")
    assert calls == []  # the default builds the operator from the positive values directly
    mech.fast_mask(mech.problem(37, 0, variant), "cpu")
    assert len(calls) == 1
    if method == "from_function":
        assert calls[0]["causal"] is True


def test_causal_function_variant_is_causal():
    mech = get("toeplitz-1d")
    dense = mech.dense_mask(mech.problem(37, 0, "causal-function"))
    assert np.all(np.triu(dense, 1) == 0) and np.all(dense[np.tril_indices(37)] > 0)  # no key after the query
    default = mech.dense_mask(mech.problem(37, 0))
    np.testing.assert_array_equal(np.tril(dense), np.tril(default))  # the same weights up to the diagonal


def test_low_rank_draw_redraws_the_rpe_projection():
    mech = get("low-rank")
    p = mech.problem(37, 0)
    state = torch.get_rng_state()
    a, b, c = (mech.draw(p, torch.Generator().manual_seed(s)) for s in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), state)  # no global RNG
    np.testing.assert_array_equal(a.extras["rpe_projection"], b.extras["rpe_projection"])
    np.testing.assert_array_equal(a.projection, b.projection)
    assert a.extras["rpe_projection"].shape == p.extras["rpe_projection"].shape
    assert not np.array_equal(a.extras["rpe_projection"], c.extras["rpe_projection"])
    assert not np.array_equal(a.extras["rpe_projection"], p.extras["rpe_projection"])
    assert not np.array_equal(a.extras["rpe_projection"], a.projection)  # its own draw, not the FAVOR+ one
    np.testing.assert_array_equal(a.extras["encodings"], p.extras["encodings"])


# ------------------------------------------------------------------------------ protocols


@pytest.mark.parametrize("mech_id", POSITIONAL)
def test_mask_params_reach_the_operator(mech_id):
    mech = get(mech_id)
    protocol_held_case(mech, mech.admissible(37), derived=mech_id == "low-rank")


@pytest.mark.parametrize("mech_id", ["toeplitz-1d", "block-toeplitz", "hypercube-gdk"])
def test_update_variant(mech_id):
    mech = get(mech_id)
    protocol_update_case(mech, mech.variant("update"), mech.admissible(37))


@pytest.mark.parametrize("mech_id", POSITIONAL)
def test_learnable_variant(mech_id):
    mech = get(mech_id)
    protocol_learnable_case(mech, mech.variant("learnable"), mech.admissible(37))


# planted bugs: the protocol tests above can fail


def test_planted_stale_spectrum_fails_the_update_case(monkeypatch):
    """A spectrum cached per mask whatever the table holds: the second call is the old mask's."""
    spectrum, cache = fast.BlockToeplitzMask.spectrum, {}
    monkeypatch.setattr(fast.BlockToeplitzMask, "spectrum", lambda self, device, dtype: cache.setdefault(
        (id(self), str(device), dtype), spectrum(self, device, dtype).detach()))
    with pytest.raises(AssertionError):
        protocol_update_case(get("block-toeplitz"), get("block-toeplitz").variant("update"), 37)


def test_planted_detached_spectrum_fails_the_learnable_case(monkeypatch):
    """A spectrum cut from the table's graph: the forward is right, the gradient is not."""
    spectrum = fast.BlockToeplitzMask.spectrum
    monkeypatch.setattr(fast.BlockToeplitzMask, "spectrum",
                        lambda self, device, dtype: spectrum(self, device, dtype).detach())
    mech = get("toeplitz-1d")
    details, reasons = variant_reasons(mech, mech.variant("learnable"), 37, seed=2)
    assert reasons and all("gradient" in r for r in reasons), reasons
    assert details["worst_component"] == "gradient" and details["normalised_error"] > 1


def test_planted_copied_parameter_fails_the_held_case(monkeypatch):
    """A fast mask that copies its parameter: updates and gradients would not reach the operator."""
    monkeypatch.setattr(MP, "mask_tensor", lambda value, device: torch.tensor(np.asarray(
        value.detach() if isinstance(value, torch.Tensor) else value, dtype=np.float64), device=device))
    with pytest.raises(AssertionError):
        protocol_held_case(get("toeplitz-1d"), 37)
