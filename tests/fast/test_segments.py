"""fast/segments.py: segment sums and maxima against a dense loop, SortedSegments' outer products and
gathered states on both sides of the one few-large vs many-small dispatch (few_segments), gradients
in float64. Determinism on the CUDA backend is tests/fast/test_deterministic.py's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fast.segments as segments
from fast.segments import Segments, SortedSegments, few_segments, segment_max
from tests.helpers import gen


def _loop_sum(x: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    """Segment sums along -2 by a Python loop over segments (the obvious twin)."""
    out = x.new_zeros(*x.shape[:-2], num, x.shape[-1])
    for s in range(num):
        rows = (index == s).nonzero().flatten()
        if rows.numel():
            out[..., s, :] = x[..., rows, :].sum(-2)
    return out


def _loop_max(x: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    out = x.new_full((*x.shape[:-2], num, x.shape[-1]), -torch.inf)
    for s in range(num):
        rows = (index == s).nonzero().flatten()
        if rows.numel():
            out[..., s, :] = x[..., rows, :].amax(-2)
    return out


def _sorted_index(sizes: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def test_few_segments_is_the_threshold(monkeypatch):
    assert few_segments(0) and few_segments(segments.FEW_SEGMENTS) and not few_segments(segments.FEW_SEGMENTS + 1)
    monkeypatch.setattr(segments, "FEW_SEGMENTS", 0)
    assert not few_segments(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_and_max_against_a_dense_loop(dtype):
    g = gen(0)
    index = torch.randint(0, 7, (40,), generator=g)
    index[index == 3] = 4  # segment 3 empty
    x = torch.randn(2, 3, 40, 5, generator=g, dtype=dtype)
    seg = Segments(index, 8)  # segment 7 empty too
    torch.testing.assert_close(seg.sum(x), _loop_sum(x, index, 8))
    assert torch.equal(seg.max(x), _loop_max(x, index, 8))
    assert torch.equal(segment_max(x, index, 8, dim=-2), _loop_max(x, index, 8))


def test_segment_max_along_any_axis_and_with_a_batched_index():
    g = gen(1)
    x = torch.randn(3, 10, generator=g)
    index = torch.randint(0, 4, (10,), generator=g)
    assert torch.equal(segment_max(x, index, 4, dim=-1), _loop_max(x.T, index, 4).T)
    assert torch.equal(segment_max(x.T, index, 4, dim=0), _loop_max(x.T, index, 4))
    batched = torch.randint(0, 4, (3, 10), generator=g)  # one index per row of x
    out = segment_max(x, batched, 4, dim=-1)
    for r in range(3):
        assert torch.equal(out[r], _loop_max(x[r, :, None], batched[r], 4)[:, 0])


def test_segment_max_refuses_a_floating_index():
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        segment_max(torch.ones(3, 1), torch.zeros(3), 1, dim=0)


def test_segment_max_gradient_reaches_the_maxima():
    x = torch.tensor([[1.0], [3.0], [2.0], [5.0]], dtype=torch.float64, requires_grad=True)
    segment_max(x, torch.tensor([0, 0, 1, 1]), 2, dim=0).sum().backward()
    assert x.grad.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_segments_bad_arguments_name_them():
    with pytest.raises(TypeError, match="index must be a 1-D integer tensor"):
        Segments(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="num_segments must be an int >= 0, got -1"):
        Segments(torch.zeros(3, dtype=torch.int64), -1)
    with pytest.raises(ValueError, match=r"x must have P = 3 entries on axis -2"):
        Segments(torch.zeros(3, dtype=torch.int64), 1).max(torch.ones(4, 1))
    assert Segments(torch.zeros(3, dtype=torch.int64), np.int64(2)).num_segments == 2


SIZES = [3, 0, 1, 5, 2, 0, 4]  # two empty segments between others


@pytest.fixture(params=["few", "many"])
def side(request, monkeypatch):
    """Both sides of the dispatch: the per-segment loop (few) and the row blocks (many, blocks of a
    few rows so that segments are cut between blocks)."""
    if request.param == "many":
        monkeypatch.setattr(segments, "FEW_SEGMENTS", 0)
        monkeypatch.setattr(segments, "OUTER_BLOCK_ELEMENTS", 40)
    return request.param


def test_sorted_segments_pointers_and_blocks():
    seg = SortedSegments(_sorted_index(SIZES), len(SIZES))
    assert seg.pointers() == np.concatenate([[0], np.cumsum(SIZES)]).tolist()
    blocks = seg.blocks(4)
    assert [(s, e) for s, e, *_ in blocks] == [(0, 4), (4, 8), (8, 12), (12, 15)]
    for s, e, g0, g1, local in blocks:
        want = _sorted_index(SIZES)[s:e] - g0
        assert local.num_segments == g1 - g0 and torch.equal(local.index, want)
    assert seg.blocks(4) is blocks


def test_outer_against_a_dense_loop(side):
    g = gen(2)
    index = _sorted_index(SIZES)
    seg = SortedSegments(index, len(SIZES))
    a = torch.randn(2, 15, 3, generator=g, dtype=torch.float64)
    b = torch.randn(15, 4, generator=g, dtype=torch.float64)  # broadcast against a's leading dim
    want = torch.stack([sum((a[:, u, :, None] * b[u, None, :] for u in range(15) if index[u] == s),
                            torch.zeros(2, 3, 4, dtype=torch.float64)) for s in range(len(SIZES))], dim=1)
    torch.testing.assert_close(seg.outer(a, b), want, rtol=1e-12, atol=1e-12)


def test_apply_against_a_dense_loop(side):
    g = gen(3)
    index = _sorted_index(SIZES)
    seg = SortedSegments(index, len(SIZES))
    x = torch.randn(2, 15, 3, generator=g, dtype=torch.float64)
    state = torch.randn(2, len(SIZES), 3, 4, generator=g, dtype=torch.float64)
    want = torch.stack([torch.stack([x[i, u] @ state[i, index[u]] for u in range(15)]) for i in range(2)])
    torch.testing.assert_close(seg.apply(x, state), want, rtol=1e-12, atol=1e-12)


def test_outer_and_apply_gradients(side):
    g = gen(4)
    seg = SortedSegments(_sorted_index(SIZES), len(SIZES))
    a = torch.randn(15, 2, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(15, 3, generator=g, dtype=torch.float64, requires_grad=True)
    state = torch.randn(len(SIZES), 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(seg.outer, (a, b))
    torch.autograd.gradcheck(seg.apply, (a, state))


def test_both_sides_agree(monkeypatch):
    """The loop and the row blocks compute the same sums (to round-off: the orders differ), at the
    default thresholds: 70 segments are many."""
    g = gen(5)
    sizes = [int(s) for s in torch.randint(0, 6, (70,), generator=g)]
    index = _sorted_index(sizes)
    a = torch.randn(1, int(index.numel()), 4, generator=g)
    b = torch.randn(1, int(index.numel()), 3, generator=g)
    assert not few_segments(len(sizes))
    blocks_side = SortedSegments(index, len(sizes)).outer(a, b)
    monkeypatch.setattr(segments, "FEW_SEGMENTS", 100)
    loop_side = SortedSegments(index, len(sizes)).outer(a, b)
    torch.testing.assert_close(blocks_side, loop_side, rtol=1e-5, atol=1e-5)
