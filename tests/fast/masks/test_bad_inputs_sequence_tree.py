"""Bad inputs to the sequence and tree masks (issue 10's list): each raises the documented
exception type with a message that names the argument (and, where it helps, the fix)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

import fast
from fast import CausalMask, Forest, PackingMask, PaddingMask, TreeDCMask, TreeDiamMask, TreeExpMask
from tests.helpers import gen, positive, randn

G = gen(0)


def _favor(lead, n=8, d=4, m=6):
    g = gen(1)
    return (randn((*lead, n, d), g), randn((*lead, n, d), g), randn((*lead, n, 3), g),
            fast.gaussian_projection(m, d, generator=g, dtype=torch.float64))


def _features(lead, n=8, m=5, d=3):
    g = gen(2)
    return positive((*lead, n, m), g), positive((*lead, n, m), g), randn((*lead, n, d), g)


# -------------------------------------------------------------------- the batching rule


def _ids(shape):
    return torch.arange(int(np.prod(shape))).reshape(shape) % 3


def _keys(shape):
    km = torch.ones(shape, dtype=torch.bool)
    km[..., -1] = False
    return km


MASK_DATA = {"segment_ids": lambda shape: PackingMask(_ids(shape)), "key_mask": lambda shape: PaddingMask(_keys(shape))}


@pytest.mark.parametrize("name", list(MASK_DATA))
@pytest.mark.parametrize("heads", [2, 3])  # B == H was silently applied per head; B != H a broadcast error
@pytest.mark.parametrize("call", ["favor", "linear"])
def test_a_b_n_mask_against_b_h_n_d_inputs_is_refused(name, heads, call):
    mask = MASK_DATA[name]((2, 8))
    with pytest.raises(ValueError) as err:
        if call == "favor":
            fast.favor_attention(*_favor((2, heads)), mask)
        else:
            fast.masked_linear_attention(*_features((2, heads)), mask)
    text = str(err.value)
    assert name in text and "(2, 8)" in text and f"(2, {heads}, 8" in text and f"{name}[:, None, :]" in text


@pytest.mark.parametrize("name", list(MASK_DATA))
def test_the_suggested_b_1_n_mask_works(name):
    data = (_ids if name == "segment_ids" else _keys)((2, 8))
    mask = PackingMask(data[:, None, :]) if name == "segment_ids" else PaddingMask(data[:, None, :])
    out = fast.favor_attention(*_favor((2, 3)), mask)
    assert out.shape == (2, 3, 8, 3)


@pytest.mark.parametrize("name", list(MASK_DATA))
@pytest.mark.parametrize("call", ["favor", "linear"])
def test_a_batched_mask_with_unbatched_inputs_is_refused(name, call):
    mask = MASK_DATA[name]((2, 8))
    with pytest.raises(ValueError, match=name) as err:
        if call == "favor":
            fast.favor_attention(*_favor(()), mask)
        else:
            fast.masked_linear_attention(*_features(()), mask)
    assert "(N,)" in str(err.value)


@given(mask_lead=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       x_lead=st.lists(st.integers(1, 3), min_size=0, max_size=3), which=st.sampled_from(list(MASK_DATA)))
def test_batching_rule(mask_lead, x_lead, which):
    """Accepted iff the mask's leading dims are as many as the input's and broadcast with them;
    otherwise ValueError naming the mask's argument."""
    mask = MASK_DATA[which]((*mask_lead, 8))
    x = randn((*x_lead, 8, 2), G)
    ok = len(mask_lead) == len(x_lead) and all(a == b or 1 in (a, b) for a, b in zip(mask_lead, x_lead))
    if ok:
        out = mask.matmul(x)
        assert out.shape == (*[max(a, b) for a, b in zip(mask_lead, x_lead)], 8, 2)
    else:
        with pytest.raises(ValueError, match=which):
            mask.matmul(x)
        with pytest.raises(ValueError, match=which):
            mask.key_stabilizer(x)


def test_unbatched_masks_broadcast_over_any_leading_dims():
    x = randn((2, 3, 8, 2), G)
    assert PackingMask(_ids((8,))).matmul(x).shape == x.shape
    assert PaddingMask(_keys((8,))).matmul(x).shape == x.shape


# -------------------------------------------------------------------------------- causal


@pytest.mark.parametrize("which", ["phi_q", "phi_k", "v"])
def test_causal_attend_with_the_wrong_n(which):
    pq, pk, v = _features((), n=8)
    args = {"phi_q": pq, "phi_k": pk, "v": v}
    args[which] = args[which][:6]
    with pytest.raises(ValueError, match=rf"{which} must have shape \(\.\.\., N, c\) with N = 8"):
        CausalMask(8).attend(**args)


def test_causal_attend_with_mismatched_widths_or_leading_dims():
    pq, pk, v = _features((2,), n=8)
    with pytest.raises(ValueError, match="phi_q, phi_k"):
        CausalMask(8).attend(pq[..., :3], pk, v)
    with pytest.raises(ValueError, match="leading dims"):
        CausalMask(8).attend(pq, pk[:1], v)


@pytest.mark.parametrize("bad, kind, match", [
    (torch.zeros(8), ValueError, r"key_log_scale must be a floating tensor \(\.\.\., N, 1\)"),
    (torch.zeros(7, 1), ValueError, "key_log_scale"),
    (torch.zeros(3, 8, 1), ValueError, "key_log_scale"),
    (torch.zeros(8, 1, dtype=torch.int64), ValueError, "key_log_scale"),
    ([0.0] * 8, ValueError, "key_log_scale"),
    (torch.full((8, 1), float("nan")), ValueError, "key_log_scale contains non-finite"),
])
def test_causal_attend_refuses_a_bad_key_log_scale(bad, kind, match):
    pq, pk, v = _features((2,), n=8)
    with pytest.raises(kind, match=match):
        CausalMask(8).attend(pq, pk, v, key_log_scale=bad)


def test_causal_key_stabilizer_with_the_wrong_n():
    with pytest.raises(ValueError, match="z must have N=8"):
        CausalMask(8).key_stabilizer(randn((6, 4), G))


# ------------------------------------------------------------------------------ padding


@pytest.mark.parametrize("lengths", [torch.tensor([True, False]), np.array([True, True]), [True, False]])
def test_from_lengths_refuses_bool_lengths(lengths):
    with pytest.raises(TypeError, match="lengths must be a 1-D integer tensor"):
        PaddingMask.from_lengths(lengths, 4)


def test_from_lengths_refuses_complex_lengths():
    with pytest.raises(TypeError, match="lengths"):
        PaddingMask.from_lengths(torch.tensor([1 + 0j]), 4)


# -------------------------------------------------------------------------- TreeExpMask


@pytest.mark.parametrize("b", [710.0, 1e4, -1e4])
def test_tree_exp_large_b_is_no_overflow_error(b):
    fo = Forest.from_parent(np.array([-1, 0, 0, 1]))
    op = TreeExpMask(fo, -0.5, b)  # used to raise OverflowError (math.exp) in matmul
    out = op.matmul(torch.ones(4, 2, dtype=torch.float64))
    assert bool((torch.isinf(out) if b > 0 else out == 0).all())
    att = fast.masked_linear_attention(*_features((), n=4), op)
    assert bool(torch.isfinite(att).all())


@pytest.mark.parametrize("value, kind", [(-1e-6, ValueError), (0.0, ValueError), (float("nan"), ValueError),
                                         (float("inf"), ValueError), ("1e-6", TypeError), (True, TypeError)])
def test_tree_exp_refuses_a_bad_max_amplified_roundoff(value, kind):
    fo = Forest.from_parent(np.array([-1, 0]))
    for a in (-0.5, 0.5):  # checked whatever the sign of a (it is only used for a > 0)
        with pytest.raises(kind, match="max_amplified_roundoff"):
            TreeExpMask(fo, a, max_amplified_roundoff=value)


@pytest.mark.parametrize("name", ["a", "b"])
@pytest.mark.parametrize("value, kind", [("x", TypeError), (None, TypeError), (True, TypeError),
                                         (float("nan"), ValueError), (float("-inf"), ValueError)])
def test_tree_exp_refuses_bad_a_b(name, value, kind):
    fo = Forest.from_parent(np.array([-1, 0]))
    kw = {"a": -0.5, "b": 0.0, name: value}
    with pytest.raises(kind, match=rf"^{name} must be a finite real number"):
        TreeExpMask(fo, **kw)


# ------------------------------------------------------------------------------ Forest


@pytest.mark.parametrize("build", [
    lambda w: Forest.from_parent(np.array([-1, 0, 0]), w),
    lambda w: Forest.from_edge_index(np.array([[0, 0], [1, 2]]), weights=w[:2]),
])
def test_forest_refuses_string_weights(build):
    with pytest.raises(TypeError, match="weights .* must be real numbers"):
        build(np.array(["1", "2", "3"]))
    with pytest.raises(TypeError, match="weights"):
        build(["a", "b", "c"])
    with pytest.raises(TypeError, match="weights"):
        build(np.array([True, False, True]))


@pytest.mark.parametrize("build", [
    lambda w: Forest.from_parent(np.array([-1, 0, 0]), w),
    lambda w: Forest.from_edge_index(np.array([[0, 0], [1, 2]]), weights=w[1:]),
    lambda w: Forest.from_edge_index(np.array([[0, 0, 1], [1, 2, 0]]), weights=w),
])
def test_forest_says_nan_for_a_nan_weight(build):
    with pytest.raises(ValueError, match="weights.*NaN"):
        build(np.array([1.0, np.nan, 2.0]))


def test_from_scipy_says_nan_not_symmetric():
    a = sp.csr_matrix(np.array([[0.0, np.nan], [np.nan, 0.0]]))
    with pytest.raises(ValueError, match="adjacency entries .* finite, got NaN"):
        Forest.from_scipy(a)


def test_from_edge_index_refuses_both_directions_with_conflicting_weights():
    e = np.array([[0, 1, 1, 2], [1, 0, 2, 1]])
    with pytest.raises(ValueError, match=r"weights: edge 0-1 is listed twice .* different lengths 1\.0 and 2\.5"):
        Forest.from_edge_index(e, weights=[1.0, 2.5, 3.0, 3.0])
    fo = Forest.from_edge_index(e, weights=[1.0, 1.0, 3.0, 3.0])  # both ways with one length: fine
    assert fo.n == 3 and sorted(fo.weight.tolist()) == [0.0, 1.0, 3.0]


# ------------------------------------------------------------------- NumPy integer sizes


def test_numpy_integer_sizes_are_accepted():
    assert CausalMask(np.int64(8), chunk=np.int32(4)).n == 8
    assert PaddingMask.from_lengths(torch.tensor([2, 3]), np.int64(5)).n == 5
    assert Forest.from_edge_index(np.array([[0], [1]]), n=np.int64(3)).n == 3
    fo = Forest.from_parent(np.array([-1, 0, 0, 1]))
    assert TreeDCMask(fo, np.ones(4), dense_threshold=np.int64(2), max_chunk_bytes=np.int64(2**16)).n == 4
    assert TreeDiamMask(fo, np.ones(4), max_chunk_bytes=np.uint32(2**16)).n == 4
    assert TreeExpMask(fo, np.float32(-0.5), np.int64(1)).b == 1.0
