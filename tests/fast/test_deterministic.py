"""No atomic accumulation on the fast paths fixed in issue 21 (fast.segments), checked on CPU.

On CUDA a floating index_add / scatter_add / index_put(accumulate=True) / scatter_reduce(sum,
mean) adds with atomics, so the same inputs give other bits from run to run (the H100 run's
``reproducibility/packing``). The autograd backward of index_select, gather and advanced
indexing calls them too. ``NoAtomicAccumulation`` is a TorchDispatchMode that raises on any of
them with floating data, forward or backward (it sees the aten ops the autograd engine runs);
with fast.segments' backend forced to its CUDA one ("segment_reduce", which runs on CPU too), a
mechanism's forward and backward must run through without one. A future index_add_ on these
paths fails here, in CI, without a GPU.

The last test is the verify side: reproducibility/<id> compares several same-seed runs, so an
occasional race (every third run) is reported.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fast
import fast.masks.tree.separator_plan as plan_mod
import fast.latent.nodeformer as F
import fast.segments as segments
from fast.batching import check_batch
from fast.segments import FEW_SEGMENTS
from fast.graphs import as_graph
from fast.masks.diffusion import KINDS, DiffusionMask
from fast.masks.power_series import PowerSeriesMask, convolve
from fast.masks.tree import Forest, TreeDCMask, TreeDiamMask, TreeExpMask
from fast.latent.nodeformer import _EdgeLogSumExp, _node_major
from fast.segments import IndexAdd, Segments, add_into, index_sum
from tests.helpers import gen, positive, randn
from verify.problems import mixed_forest, random_forest

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning")]

#: aten ops that accumulate with atomics on CUDA (torch.use_deterministic_algorithms's list), and
#: the argument that makes the accumulating overloads accumulate (None: always).
_ATOMIC = {"index_add": None, "index_add_": None, "scatter_add": None, "scatter_add_": None,
           "index_put": "accumulate", "index_put_": "accumulate", "_index_put_impl_": "accumulate",
           "_unsafe_index_put": "accumulate", "put": "accumulate", "put_": "accumulate",
           "scatter_reduce": "reduce", "scatter_reduce_": "reduce", "index_reduce": "reduce",
           "index_reduce_": "reduce", "scatter": "reduce", "scatter_": "reduce"}
#: where the argument is positional: (position, values that accumulate); index_put(self, indices,
#: values, accumulate), scatter_reduce(self, dim, index, src, reduce), scatter(self, dim, index, src, reduce)
_POSITION = {"accumulate": 3, "reduce": 4}
_ACCUMULATING = {"accumulate": (True,), "reduce": ("sum", "mean", "add", "prod", "multiply")}


class AtomicAccumulation(AssertionError):
    pass


class NoAtomicAccumulation(TorchDispatchMode):
    """Raise on a floating atomic accumulation (module doc); ``seen`` lists the ops that ran."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.seen.add(name)
        weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
        if name == "bincount" and isinstance(weights, torch.Tensor) and weights.is_floating_point():
            raise AtomicAccumulation(f"{func} with {weights.dtype} weights: atomics on CUDA, other bits at every run")
        if name in _ATOMIC and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            arg = _ATOMIC[name]
            if arg is None:
                accumulates = True
            else:
                value = kwargs.get(arg, args[_POSITION[arg]] if len(args) > _POSITION[arg] else None)
                accumulates = value in _ACCUMULATING[arg]
            if accumulates:
                raise AtomicAccumulation(f"{func} on {args[0].dtype} data: atomics on CUDA, other bits at every run")
        return func(*args, **kwargs)


@pytest.fixture
def cuda_backend(monkeypatch):
    """fast.segments' CUDA backend on CPU, so that the library itself calls no index_add_."""
    monkeypatch.setattr(segments, "backend", lambda device: "segment_reduce")


def _grads(out: torch.Tensor, inputs) -> list[torch.Tensor]:
    w = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    return list(torch.autograd.grad((out * w).sum(), inputs))


def _run_both(fn, *inputs):
    """fn(*inputs) and its gradients under NoAtomicAccumulation with the CUDA backend, and again with
    the CPU backend (index_add_, allowed there): the two agree to round-off."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    with NoAtomicAccumulation():
        out = fn(*leaves)
        grads = _grads(out, leaves)
    real = segments.backend
    try:
        segments.backend = lambda device: "index_add"
        leaves2 = [t.detach().clone().requires_grad_(True) for t in inputs]
        out2 = fn(*leaves2)
        grads2 = _grads(out2, leaves2)
    finally:
        segments.backend = real
    for a, b in zip([out, *grads], [out2, *grads2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    return out


# ------------------------------------------------------------------------------ the guard itself


def test_the_guard_sees_forward_and_backward_atomics():
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen(0), requires_grad=True)
    idx = torch.tensor([0, 2, 2])
    with NoAtomicAccumulation():
        with pytest.raises(AtomicAccumulation):
            torch.zeros(3, 3, dtype=torch.float64).index_add_(0, idx, x[:3])
        with pytest.raises(AtomicAccumulation):
            torch.zeros(3, 3, dtype=torch.float64).index_put_((idx,), x[:3], accumulate=True)
        with pytest.raises(AtomicAccumulation):
            torch.zeros(3, 3, dtype=torch.float64).scatter_reduce(0, idx[:, None].expand(3, 3), x[:3], "sum")
        with pytest.raises(AtomicAccumulation):
            torch.bincount(idx, weights=torch.ones(3, dtype=torch.float64))
        for forward in (lambda: x.index_select(0, idx), lambda: x[idx],
                        lambda: torch.gather(x, 0, idx[:, None].expand(3, 3))):
            y = forward()  # a gather forward is fine; its backward accumulates
            with pytest.raises(AtomicAccumulation):
                y.sum().backward()
        # what stays allowed: integer accumulation, accumulate=False, amax
        torch.zeros(3, dtype=torch.int64).index_add_(0, idx, torch.ones(3, dtype=torch.int64))
        torch.bincount(idx, minlength=4)
        torch.zeros(3, 3, dtype=torch.float64).index_put_((torch.tensor([0, 1]),), x[:2].detach())
        torch.zeros(3, 3, dtype=torch.float64).scatter_reduce(0, idx[:, None].expand(3, 3), x[:3].detach(), "amax")


def _scatter_packing(self, x):
    """PackingMask.matmul as it was before issue 21: scatter_add, then gather (atomics on CUDA)."""
    lead = torch.broadcast_shapes(x.shape[:-2], self.segment_index.shape[:-1])
    x = x.expand(*lead, *x.shape[-2:])
    idx = self.segment_index.expand(*lead, self.n).unsqueeze(-1).expand(x.shape)
    sums = torch.zeros(*lead, self.num_segments, x.shape[-1], dtype=x.dtype).scatter_add(-2, idx, x)
    return torch.gather(sums, -2, idx)


def test_the_guard_catches_the_packing_mask_before_issue_21(monkeypatch, cuda_backend):
    monkeypatch.setattr(fast.PackingMask, "matmul", _scatter_packing)
    mask = fast.PackingMask(torch.tensor([3, 3, 1, 1, 1, 7]))
    with NoAtomicAccumulation(), pytest.raises(AtomicAccumulation, match="scatter_add"):
        mask.matmul(torch.ones(6, 2, dtype=torch.float64))


# ------------------------------------------------------------------------------ fast.segments


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("longest", [5, 300])  # 300 > SPLIT_ABOVE: the two-pass CUDA plan
def test_segments_sum_and_expand_are_adjoint_and_match_index_add(cuda_backend, ordered, longest):
    g = gen(1)
    index = torch.cat([torch.full((longest,), 2), torch.randint(0, 6, (40,), generator=g)])
    index[index == 4] = 5  # segment 4 stays empty: its sum is 0
    if ordered:
        index = index.sort().values
    else:
        index = index[torch.randperm(index.numel(), generator=g)]
    seg = Segments(index, 6)
    x = randn((2, 3, index.numel(), 4), g)
    with NoAtomicAccumulation():
        s = seg.sum(x, dim=-2)
        e = seg.expand(s, dim=-2)
    expected = torch.zeros(2, 3, 6, 4, dtype=torch.float64).index_add(-2, index, x)
    torch.testing.assert_close(s, expected, rtol=1e-13, atol=1e-13)
    assert torch.equal(s[:, :, 4], torch.zeros(2, 3, 4, dtype=torch.float64))
    assert torch.equal(e, s.index_select(-2, index))
    # adjoint: <sum x, y> = <x, expand y>
    y = randn((2, 3, 6, 4), g)
    torch.testing.assert_close((s * y).sum(), (x * seg.expand(y, dim=-2)).sum(), rtol=1e-13, atol=0)
    # the same bits on every run
    assert torch.equal(seg.sum(x, dim=-2), s)


def test_segments_gradients_twice(cuda_backend):
    index = torch.tensor([1, 0, 1, 1, 3, 0])
    seg = Segments(index, 4)
    x = randn((6, 2), gen(2)).requires_grad_(True)
    y = randn((4, 2), gen(3)).requires_grad_(True)
    with NoAtomicAccumulation():
        assert torch.autograd.gradcheck(lambda t: seg.sum(t, dim=0), (x,))
        assert torch.autograd.gradgradcheck(lambda t: seg.sum(t, dim=0) ** 2, (x,))
        assert torch.autograd.gradgradcheck(lambda t: seg.expand(t, dim=0) ** 2, (y,))


def test_index_sum_and_add_into(cuda_backend):
    g = gen(4)
    index = torch.randint(0, 9, (50,), generator=g)
    x = randn((50, 3), g)
    out = randn((9, 3), g)
    with NoAtomicAccumulation():
        s = index_sum(x, index, 9)
        a = add_into(out.clone(), index, x)
    torch.testing.assert_close(s, torch.zeros(9, 3, dtype=torch.float64).index_add(0, index, x))
    torch.testing.assert_close(a, out.index_add(0, index, x))
    with pytest.raises(ValueError, match="x must have P = 7 entries on axis 0"):
        Segments(torch.zeros(7, dtype=torch.int64), 1).sum(torch.zeros(6, 2), dim=0)
    with pytest.raises(TypeError, match="index must be a 1-D integer tensor"):
        Segments(torch.zeros(3), 1)


@pytest.mark.parametrize("lead", [(), (2, 3)])
def test_index_add_plan_matches_index_add_and_index_select(cuda_backend, lead):
    """IndexAdd: add_into = index_add_ in place and take = index_select, forward and (twice) backward,
    with the CUDA backend (no atomics) and, on CPU, with index_add_ and index_select themselves."""
    g = gen(11)
    index = torch.randint(0, 7, (30,), generator=g)
    index[index == 3] = 4  # row 3 is no target: it stays as it was
    plan = IndexAdd(index)
    out, src, x = randn((*lead, 7, 2), g), randn((*lead, 30, 2), g), randn((*lead, 7, 2), g)
    with NoAtomicAccumulation():
        added = plan.add_into(out.clone(), src, dim=-2)
        taken = plan.take(x, dim=-2)
    torch.testing.assert_close(added, out.index_add(-2, index, src), rtol=1e-13, atol=1e-13)
    assert torch.equal(added[..., 3, :], out[..., 3, :])
    assert torch.equal(taken, x.index_select(-2, index))
    o = out.clone().requires_grad_(True)
    s = src.clone().requires_grad_(True)
    y = x.clone().requires_grad_(True)
    with NoAtomicAccumulation():
        assert torch.autograd.gradcheck(lambda o, s: plan.add_into(o.clone(), s, dim=-2), (o, s))
        assert torch.autograd.gradgradcheck(lambda o, s: plan.add_into(o.clone(), s, dim=-2) ** 2, (o, s))
        assert torch.autograd.gradgradcheck(lambda y: plan.take(y, dim=-2) ** 2, (y,))
    real = segments.backend
    try:  # the CPU backend is index_add_ / index_select themselves: the same bits
        segments.backend = lambda device: "index_add"
        assert torch.equal(IndexAdd(index).add_into(out.clone(), src, dim=-2), out.index_add(-2, index, src))
    finally:
        segments.backend = real


# ------------------------------------------------------------------------------ the mechanisms


@pytest.mark.parametrize("ids", ["shared", "batched-scattered"])
def test_packing_attention_forward_and_backward(cuda_backend, ids):
    g = gen(5)
    n, m, d = 23, 8, 3
    if ids == "shared":
        seg = torch.tensor([0] * 9 + [1] * 10 + [2] * 4)
    else:  # labels reappearing in non-adjacent runs, one packing per sample
        seg = torch.randint(-3, 3, (2, 1, n), generator=g)
    mask = fast.PackingMask(seg)
    q, k, v = randn((2, 3, n, 4), g), randn((2, 3, n, 4), g), randn((2, 3, n, d), g)
    w = randn((m, 4), g)
    out = _run_both(lambda q, k, v: fast.favor_attention(q, k, v, w, mask=mask), q, k, v)
    assert out.shape == (2, 3, n, d)


@pytest.mark.parametrize("graphs", [3, FEW_SEGMENTS + 6])  # the per-graph loop and the blocked route
def test_batch_index_forward_and_backward(cuda_backend, monkeypatch, graphs):
    monkeypatch.setattr(segments, "OUTER_BLOCK_ELEMENTS", 64)  # several node blocks, graphs cut between them
    g = gen(6)
    sizes = torch.randint(1, 5, (graphs,), generator=g)
    sizes[1] = 0  # an empty graph
    batch = check_batch(torch.repeat_interleave(torch.arange(graphs), sizes), int(sizes.sum()))
    n = batch.n
    a, b, x = randn((2, n, 3), g), randn((2, n, 2), g), randn((2, n, 4), g)

    def everything(a, b, x):
        state = batch.segment_outer(a, b)  # (2, G, 3, 2)
        return (batch.apply_state(a, state).sum(-1) + batch.gather(batch.segment_sum(x)).sum(-1)
                + batch.gather(state.flatten(-2)).sum(-1))

    _run_both(everything, a, b, x)


@pytest.mark.parametrize("fn", [fast.difformer_attention, fast.sgformer_attention])
def test_simple_attention_with_a_batch(cuda_backend, fn):
    g = gen(7)
    labels = torch.repeat_interleave(torch.arange(FEW_SEGMENTS + 2), 2)
    n = labels.numel()
    q, k, v = randn((n, 4), g), randn((n, 4), g), randn((n, 3), g)
    _run_both(lambda q, k, v: fn(q, k, v, batch=labels), q, k, v)


def test_graph_building_sums_duplicates_and_degrees(cuda_backend):
    ei = torch.tensor([[0, 1, 1, 2, 0, 1], [1, 0, 2, 1, 1, 0]])  # (0, 1) given twice each way
    w = torch.tensor([0.5, 0.5, 1.0, 1.0, 0.25, 0.25], dtype=torch.float64)
    with NoAtomicAccumulation():
        graph = as_graph(ei, edge_weight=w, n=4)
        deg = graph.weighted_degree
    assert graph.weight.tolist() == [0.75, 0.75, 1.0, 1.0]
    assert deg.tolist() == [0.75, 1.75, 1.0, 0.0]


def _ring(n: int):
    idx = torch.arange(n)
    return torch.stack([torch.cat([idx, (idx + 1) % n]), torch.cat([(idx + 1) % n, idx])])


def test_grf_forward_and_backward_in_f(cuda_backend):
    graph = as_graph(_ring(9), n=9)
    walks = fast.sample_walks(graph, 3, p_halt=0.3, generator=torch.Generator().manual_seed(0))
    g = gen(8)
    phi_q, phi_k, v = randn((9, 4), g).exp(), randn((9, 4), g).exp(), randn((9, 2), g)
    f0 = torch.tensor([1.0, 0.5, 0.25, 0.125], dtype=torch.float64)

    def attend(f, phi_q, phi_k, v):
        mask = fast.GRFMask(fast.grf_features(graph, walks, f))
        return fast.masked_linear_attention(phi_q, phi_k, v, mask)

    _run_both(attend, f0, phi_q, phi_k, v)


@pytest.mark.parametrize("alpha", [0, 1])
def test_rwgnk_forward_and_backward(cuda_backend, alpha):
    graph = as_graph(_ring(8), n=8)
    walks = fast.sample_walks(graph, 4, p_halt=0.25, generator=torch.Generator().manual_seed(1))
    with NoAtomicAccumulation():
        mask = fast.RWGNKMask(graph, walks, lam=0.7, alpha=alpha)
    g = gen(9)
    phi_q, phi_k, v = randn((8, 3), g).exp(), randn((8, 3), g).exp(), randn((8, 2), g)
    _run_both(lambda phi_q, phi_k, v: fast.masked_linear_attention(phi_q, phi_k, v, mask), phi_q, phi_k, v)


def test_nodeformer_edge_terms_backward(cuda_backend):
    """The edge log-sum-exp's hand-written backward (fast.latent.nodeformer, edge blocks of 5 edges)."""
    graph = as_graph(_ring(7), n=7)
    g = gen(10)
    zq, zk = randn((2, 7, 3), g), randn((2, 7, 3), g)
    _run_both(lambda zq, zk: _EdgeLogSumExp.apply(_node_major(zq), _node_major(zk), graph.row, graph.col, 5), zq, zk)


def _mixed_forest(n: int = 90) -> Forest:
    return Forest.from_parent(mixed_forest(n, 4))  # a tree of every family, ids not in level order


@pytest.mark.parametrize("ratio", [0, 10**9])  # the cross rows by FFT, by dense Hankel GEMMs
@pytest.mark.parametrize("kw", [{"dense_threshold": 8}, {"dense_threshold": 3, "max_chunk_bytes": 3000}],
                         ids=["one-step-per-key", "many-steps"])
def test_tree_dc_forward_and_backward(cuda_backend, monkeypatch, ratio, kw):
    """TreeDCMask with x and f requiring grad: its scatters, gathers of x (by node, by bin) and gathers
    of f (dense blocks by distance, Hankel blocks by a + b) have backward passes without atomics."""
    monkeypatch.setattr(plan_mod, "HANKEL_DENSE_RATIO", ratio)
    forest = _mixed_forest()
    plan = TreeDCMask(forest, np.ones(forest.n), **kw).plan  # one plan for every call below
    assert plan.num_dense_blocks > 0 and len(plan.row_key) > 0
    assert plan.num_fft_rows == (len(plan.row_key) if ratio == 0 else 0)
    g = gen(12)
    x, f = randn((2, forest.n, 3), g), randn((forest.n,), g)
    _run_both(lambda x, f: TreeDCMask(forest, f, plan=plan).matmul(x), x, f)


@pytest.mark.parametrize("kw", [{}, {"max_chunk_bytes": 1}], ids=["default", "column-chunks"])
def test_tree_diam_forward_and_backward(cuda_backend, kw):
    forest = _mixed_forest()
    g = gen(13)
    x, f = randn((2, forest.n, 3), g), randn((forest.n,), g)
    _run_both(lambda x, f: TreeDiamMask(forest, f, **kw).matmul(x), x, f)


def test_tree_exp_forward_and_backward(cuda_backend):
    parent, weights = random_forest(80, 5)
    forest = Forest.from_parent(parent, weights)
    _run_both(lambda x: TreeExpMask(forest, -0.4, 0.3).matmul(x), randn((2, 80, 3), gen(14)))


@pytest.mark.parametrize("cls", [TreeExpMask, TreeDiamMask, TreeDCMask])
def test_tree_attention_forward_and_backward(cuda_backend, cls):
    """favor_attention on each tree mask (the forest's per-tree key stabiliser included); with a learnable
    f the driver's backward differentiates the mask's own product."""
    forest = _mixed_forest(60)
    g = gen(15)
    q, k, v, w = randn((2, 60, 4), g), randn((2, 60, 4), g), randn((2, 60, 3), g), randn((6, 4), g)
    f0 = positive((60,), g)

    if cls is TreeExpMask:
        _run_both(lambda q, k, v: fast.favor_attention(q, k, v, w, mask=TreeExpMask(forest, -0.5)), q, k, v)
    else:
        _run_both(lambda q, k, v, f: fast.favor_attention(q, k, v, w, mask=cls(forest, f)), q, k, v, f0)


def test_the_guard_catches_the_tree_masks_before_issue_21(cuda_backend, monkeypatch):
    """TreeDiamMask's children-into-parents sum as it was (index_add_ whatever the device): the guard raises."""
    forest = _mixed_forest(30)
    mask = TreeDiamMask(forest, np.ones(30))
    monkeypatch.setattr(IndexAdd, "add_into", lambda self, out, src, dim=-2: out.index_add_(dim, self.index, src))
    with NoAtomicAccumulation(), pytest.raises(AtomicAccumulation, match="index_add"):
        mask.matmul(torch.ones(30, 2, dtype=torch.float64))


def _ring_with_loop(n: int):
    ei = _ring(n)
    return torch.cat([ei, torch.tensor([[0], [0]])], dim=1)  # a self-loop: laplacian's off-diagonal degrees


@pytest.mark.parametrize("kind", KINDS)
def test_diffusion_mask_forward_and_backward(cuda_backend, kind):
    """DiffusionMask's set-up (weighted and off-diagonal degrees) and its product, learnable lam."""
    w = torch.linspace(0.5, 2.0, 9, dtype=torch.float64)  # edge (i, i + 1) both ways, then the loop
    graph = as_graph(_ring_with_loop(9), edge_weight=torch.cat([w, w, torch.tensor([3.0], dtype=w.dtype)]), n=9)
    g = gen(16)
    _run_both(lambda x, lam: DiffusionMask(graph, lam, kind).matmul(x), randn((2, 9, 3), g),
              torch.tensor(0.7, dtype=torch.float64))


def test_power_series_forward_and_backward(cuda_backend):
    """alpha = convolve(f) learnable, through the product and the per-key stabilised attention."""
    graph = as_graph(_ring(9), n=9)
    g = gen(17)
    f0 = torch.tensor([1.0, 0.5, 0.25, 0.125], dtype=torch.float64)
    q, k, v, w = randn((2, 9, 4), g), randn((2, 9, 4), g), randn((2, 9, 3), g), randn((5, 4), g)
    _run_both(lambda f, x: PowerSeriesMask(graph, convolve(f)).matmul(x), f0, randn((2, 9, 3), g))
    _run_both(lambda f, q, k, v: fast.favor_attention(q, k, v, w, mask=PowerSeriesMask(graph, convolve(f))),
              f0, q, k, v)


def _chain_graphs(sizes: torch.Tensor):
    """A batch vector and an edge_index joining consecutive nodes inside each graph (both directions)."""
    batch = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    u = torch.nonzero(batch[1:] == batch[:-1]).reshape(-1)
    return batch, torch.cat([torch.stack([u, u + 1]), torch.stack([u + 1, u])], dim=1)


def _nodeformer_inputs(graphs: str):
    """(batch or None, graph, q, k, v, w) on one graph, 3 graphs, or more than FEW_SEGMENTS graphs
    of uneven sizes ("padded": the features go through the zero-padded layout and its unpad gather)."""
    g = gen(18)
    if graphs == "one":
        batch, edges = None, _ring(12)
    else:
        count = 3 if graphs == "few" else FEW_SEGMENTS + 6
        batch, edges = _chain_graphs(torch.randint(2, 4, (count,), generator=g))
    n = 12 if batch is None else batch.numel()
    if graphs == "padded":
        assert F._Layout.of(check_batch(batch, n)).kind == "padded"
    return batch, as_graph(edges, n=n), randn((2, n, 4), g), randn((2, n, 4), g), randn((2, n, 3), g), randn((6, 4), g)


@pytest.mark.parametrize("graphs", ["one", "few", "padded"])
def test_nodeformer_attention_forward_and_backward(cuda_backend, graphs):
    """Gumbel noise, a relational bias of order 2 with a learnable b, gradients in q, k, v, b."""
    batch, graph, q, k, v, w = _nodeformer_inputs(graphs)
    noise = F.gumbel_noise((2, *q.shape[:-1]), generator=gen(19), dtype=torch.float64)
    b = torch.tensor([0.3, -0.2], dtype=torch.float64)
    _run_both(lambda q, k, v, b: F.nodeformer_attention(q, k, v, w, graph=graph, b=b, order=2, noise=noise,
                                                        batch=batch), q, k, v, b)


@pytest.mark.parametrize("graphs", ["one", "few", "padded"])
def test_edge_loss_forward_and_backward(cuda_backend, graphs):
    """The per-node sums of the edges' log pi and the gather of the denominators to the edges."""
    batch, graph, q, k, _, w = _nodeformer_inputs(graphs)
    _run_both(lambda q, k: F.edge_loss(q, k, w, graph, tau=0.5, batch=batch).reshape(1), q, k)


@pytest.mark.parametrize("graphs", ["one", "few"])
def test_attention_rows_forward_and_backward(cuda_backend, graphs):
    """kernelized_attention_rows with a repeated row: its gathers of the rows sum their gradients."""
    batch, graph, q, k, _, w = _nodeformer_inputs(graphs)
    _run_both(lambda q, k: F.kernelized_attention_rows(q, k, w, [0, 3, 3, 1], tau=0.5, batch=batch), q, k)


# ------------------------------------------------------------------------------ verify's side


def test_reproducibility_check_sees_an_occasional_race():
    """A fast path whose output moves by one ulp on every third call (a race that shows now and then,
    as atomics do): reproducibility/<id> compares SAME_SEED_RUNS same-seed runs, so it fails."""
    from verify.checks import reproducibility as R
    from verify.mechanisms import get
    from results.check import Context

    assert R.SAME_SEED_RUNS >= 3
    real = get("packing")
    calls = {"n": 0}

    def setup(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype, requires_grad)

        def runner():
            out = run()
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                out = out.clone()
                out.view(-1)[0] = float(np.nextafter(out.view(-1)[0].item(), np.inf))
            return out
        return runner

    res = R.check_for(dataclasses.replace(real, fast_setup=setup)).evaluate(Context(quick=True))
    assert res.status == "fail"
    assert res.details["same_seed_differs"] == ["fast output"]
    assert res.details["global_states_moved"] == []
