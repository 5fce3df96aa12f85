"""fast/batching.py: the PyG batch vector, its checks and its per-graph reductions."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fast.segments as segments
from fast.batching import BatchIndex, check_batch
from tests.helpers import gen, randn

#: three graphs of uneven sizes and one empty label (2) between them
LABELS = [0, 0, 0, 1, 1, 1, 1, 1, 3, 3]


def _dense_same(labels) -> torch.Tensor:
    b = torch.as_tensor(labels)
    return (b[:, None] == b[None, :]).double()


def test_check_batch_builds_the_index():
    b = check_batch(torch.tensor(LABELS), len(LABELS))
    assert isinstance(b, BatchIndex)
    assert b.n == 10 and b.num_graphs == 4
    assert b.index.dtype == b.ptr.dtype == b.sizes.dtype == torch.int64
    assert b.ptr.tolist() == [0, 3, 8, 8, 10]
    assert b.sizes.tolist() == [3, 5, 0, 2]
    assert check_batch(None, 5) is None
    # NumPy arrays and lists of ints work as well; num_graphs can add trailing empty graphs
    assert check_batch(np.array(LABELS, dtype=np.int32), 10).ptr.tolist() == [0, 3, 8, 8, 10]
    assert check_batch(LABELS, 10, num_graphs=6).num_graphs == 6
    assert check_batch(b, 10) is b


@pytest.mark.parametrize("batch, n, err, match", [
    (torch.tensor([0.0, 1.0]), 2, TypeError, "batch must be an integer"),
    (torch.tensor([True, False]), 2, TypeError, "batch must be an integer"),
    (np.array([0.5, 1.0]), 2, TypeError, "batch must be an integer"),
    (torch.zeros(37, dtype=torch.int64), 38, ValueError, r"batch has 37 entries but the inputs have N = 38 nodes"),
    (torch.zeros(2, 19, dtype=torch.int64), 38, ValueError, r"batch must have shape \(N,\)"),
    (torch.tensor([0, -1, 1]), 3, ValueError, r"batch labels must be >= 0.*batch\[1\] = -1"),
    (torch.tensor([0] * 8 + [2] * 4 + [0]), 13,
     ValueError, r"batch must be sorted \(PyG convention: each graph's nodes are contiguous\); "
                 r"batch\[12\] = 0 follows batch\[11\] = 2"),
    ("abc", 3, TypeError, "batch must be an integer"),
])
def test_check_batch_errors(batch, n, err, match):
    with pytest.raises(err, match=match):
        check_batch(batch, n)


def test_huge_labels_are_refused():
    """max label + 1 > N would allocate G per-graph rows for at most N non-empty graphs: refused."""
    with pytest.raises(ValueError, match=r"batch labels must be < N = 4 .*got max label 8589934592"):
        check_batch(torch.tensor([0, 0, 1, 2 ** 33]), 4)
    assert check_batch(torch.tensor([0, 0, 1, 3]), 4).num_graphs == 4  # max label N - 1: allowed (gaps)
    assert check_batch(torch.tensor([0, 0, 1, 5]), 4, num_graphs=6).num_graphs == 6  # explicit G


def test_check_batch_other_errors():
    with pytest.raises(ValueError, match="labels must be < num_graphs = 2"):
        check_batch(torch.tensor([0, 1, 2]), 3, num_graphs=2)
    with pytest.raises(ValueError, match="n .* must be a positive integer"):
        check_batch(torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="segs has 10 entries but the inputs have N = 9"):
        check_batch(check_batch(torch.tensor(LABELS), 10), 9, name="segs")


def test_segment_sum_gather_max_against_dense():
    b = check_batch(torch.tensor(LABELS), 10)
    x = randn((2, 3, 10, 4), gen(0))
    onehot = torch.nn.functional.one_hot(b.index, 4).double()  # (N, G)
    expected = onehot.T @ x
    torch.testing.assert_close(b.segment_sum(x), expected, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(b.gather(b.segment_sum(x)), _dense_same(LABELS) @ x, rtol=1e-14, atol=1e-14)
    mx = b.segment_max(x)
    assert torch.isinf(mx[..., 2, :]).all() and (mx[..., 2, :] < 0).all()  # the empty graph
    for g, (s, e) in enumerate([(0, 3), (3, 8), (8, 10)]):
        gid = [0, 1, 3][g]
        torch.testing.assert_close(mx[..., gid, :], x[..., s:e, :].amax(-2))


def _route(small: bool, monkeypatch) -> BatchIndex:
    """LABELS' BatchIndex, on the slice loop (small) or forced onto the blocked route (several blocks)."""
    if not small:
        monkeypatch.setattr(segments, "FEW_SEGMENTS", 0)
        monkeypatch.setattr(segments, "OUTER_BLOCK_ELEMENTS", 50)  # several blocks of a few rows
    return check_batch(torch.tensor(LABELS), 10)


@pytest.mark.parametrize("small", [True, False])
def test_apply_state_both_routes(small, monkeypatch):
    """Row u of apply_state is x_u^T state[batch[u]] on the slice loop and on the gathered blocks."""
    b = _route(small, monkeypatch)
    x = randn((2, 10, 3), gen(5))
    state = randn((2, 4, 3, 5), gen(6))
    want = torch.einsum("...nm,...nmd->...nd", x, state[:, b.index])
    torch.testing.assert_close(b.apply_state(x, state), want, rtol=1e-13, atol=1e-13)
    torch.autograd.gradcheck(lambda y, s: b.apply_state(y, s),
                             (x.clone().requires_grad_(), state.clone().requires_grad_()))


@pytest.mark.parametrize("small", [True, False])
def test_segment_outer_both_routes(small, monkeypatch):
    b = _route(small, monkeypatch)
    a = randn((2, 10, 3), gen(1)).requires_grad_()
    v = randn((2, 1, 10, 5), gen(2))  # leading dims broadcast
    out = b.segment_outer(a, v)
    assert out.shape == (2, 2, 4, 3, 5)
    dense = torch.einsum("ng,...nm,...nd->...gmd", torch.nn.functional.one_hot(b.index, 4).double(), a, v)
    torch.testing.assert_close(out, dense.expand_as(out), rtol=1e-13, atol=1e-13)
    assert torch.equal(out[..., 2, :, :], torch.zeros_like(out[..., 2, :, :]))
    out.sum().backward()  # d/da_u of the sum of out: a[i] meets v[j] for every j
    torch.testing.assert_close(a.grad, v.sum(-1, keepdim=True).sum(0).expand(2, 10, 3))
    torch.autograd.gradcheck(lambda x, y: b.segment_outer(x, y),
                             (randn((10, 2), gen(3)).requires_grad_(), randn((10, 2), gen(4)).requires_grad_()))


@pytest.mark.parametrize("block", [1, 2, 3, 4, 7, 10, 20])
def test_node_blocks_tile_the_nodes_with_their_graphs(block):
    """node_blocks(block): blocks s:e of at most ``block`` nodes tiling 0..N, each with the graphs
    g0:g1 its nodes lie in and its rows grouped by graph - g0 (empty graphs between and at the end)."""
    b = check_batch(torch.tensor([0, 0, 2, 2, 2, 2, 2, 4, 4, 6]), 10, num_graphs=8)  # empty 1, 3, 5, 7
    blocks = b.node_blocks(block)
    assert [s for s, *_ in blocks] == list(range(0, 10, block)) and blocks[-1][1] == 10
    for s, e, g0, g1, local in blocks:
        assert e - s == min(block, 10 - s) and local.n == e - s and local.num_segments == g1 - g0
        assert torch.equal(local.index + g0, b.index[s:e])
        assert int(b.index[s]) == g0 and int(b.index[e - 1]) == g1 - 1
    assert b.node_blocks(block) is blocks  # cached


def test_graphs_never_mix():
    """Perturbing one graph's rows leaves the other graphs' sums bit for bit unchanged."""
    b = check_batch(torch.tensor(LABELS), 10)
    x = randn((3, 10, 4), gen(5))
    y = x.clone()
    y[..., 3:8, :] += 1.0
    for f in (b.segment_sum, b.segment_max, lambda t: b.segment_outer(t, t)):
        p, r = f(x), f(y)
        assert torch.equal(p[:, [0, 3]], r[:, [0, 3]])
        assert not torch.equal(p[:, 1], r[:, 1])


def test_reduction_shape_errors():
    b = check_batch(torch.tensor(LABELS), 10)
    with pytest.raises(ValueError, match=r"x must have shape \(..., N, c\) with N = 10"):
        b.segment_sum(torch.zeros(9, 2))
    with pytest.raises(ValueError, match=r"y must have shape \(..., G, c\) with G = 4"):
        b.gather(torch.zeros(3, 2))
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        b.segment_outer(np.zeros((10, 2)), torch.zeros(10, 2))


# ------------------------------------------------------------------ apply_state's arguments (issue 24)


def test_apply_state_checks_its_arguments():
    """A wrong graph count used to raise IndexError (or pass quietly), a wrong width a matmul shape error."""
    from fast.batching import check_batch

    b = check_batch(torch.tensor([0, 0, 0, 1, 1, 1]), 6)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., G, m, d\) with G = 2 graphs \(the batch's\) "
                                         r"and m = 3 \(x's width\), got \(3, 3, 2\)"):
        b.apply_state(x, torch.randn(3, 3, 2))
    with pytest.raises(ValueError, match=r"m = 3 \(x's width\), got \(2, 4, 2\)"):
        b.apply_state(x, torch.randn(2, 4, 2))
    with pytest.raises(ValueError, match=r"state must have shape .* got \(3, 2\)"):
        b.apply_state(x, torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., N, c\) with N = 6 nodes"):
        b.apply_state(x[:5], torch.randn(2, 3, 2))
    with pytest.raises(ValueError, match=r"x's and state's leading dims \(4,\) and \(3,\) do not broadcast"):
        b.apply_state(torch.randn(4, 6, 3), torch.randn(3, 2, 3, 2))
    with pytest.raises(TypeError, match=r"x and state must have one dtype, got torch.float32 and torch.float64"):
        b.apply_state(x, torch.randn(2, 3, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"state must be a torch.Tensor"):
        b.apply_state(x, [[1.0]])
    state = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(1))
    want = torch.cat([x[:3] @ state[0], x[3:] @ state[1]])
    torch.testing.assert_close(b.apply_state(x, state), want)


def test_absurd_graph_counts_are_refused_before_allocating():
    from fast.batching import check_batch

    with pytest.raises(MemoryError, match=r"num_graphs = 1000000000000000 asks for 2 x the per-graph sizes"):
        check_batch(torch.zeros(3, dtype=torch.long), 3, num_graphs=10**15)


def test_segment_max_needs_floating_values():
    from fast.batching import check_batch

    with pytest.raises(TypeError, match=r"x must be a floating tensor \(the maxima are stabilising constants\), got "
                                        r"torch.int64"):
        check_batch([0, 0, 1], 3).segment_max(torch.ones(3, 2, dtype=torch.long))
