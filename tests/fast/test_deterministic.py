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
import fast.segments as segments
from fast.batching import SMALL_GRAPH_COUNT, check_batch
from fast.graphs import as_graph
from fast.nodeformer import _EdgeLogSumExp, _node_major
from fast.segments import Segments, add_into, index_sum
from tests.helpers import gen, randn

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


@pytest.mark.parametrize("graphs", [3, SMALL_GRAPH_COUNT + 6])  # the per-graph loop and the blocked route
def test_batch_index_forward_and_backward(cuda_backend, monkeypatch, graphs):
    import fast.batching as fb

    monkeypatch.setattr(fb, "OUTER_BLOCK_ELEMENTS", 64)  # several node blocks, graphs cut between them
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
    labels = torch.repeat_interleave(torch.arange(SMALL_GRAPH_COUNT + 2), 2)
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
    """The edge log-sum-exp's hand-written backward (fast.nodeformer, edge blocks of 5 edges)."""
    graph = as_graph(_ring(7), n=7)
    g = gen(10)
    zq, zk = randn((2, 7, 3), g), randn((2, 7, 3), g)
    _run_both(lambda zq, zk: _EdgeLogSumExp.apply(_node_major(zq), _node_major(zk), graph.row, graph.col, 5), zq, zk)


# ------------------------------------------------------------------------------ verify's side


def test_reproducibility_check_sees_an_occasional_race():
    """A fast path whose output moves by one ulp on every third call (a race that shows now and then,
    as atomics do): reproducibility/<id> compares SAME_SEED_RUNS same-seed runs, so it fails."""
    from verify.checks import reproducibility as R
    from verify.mechanisms import get
    from verify.result import Context

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
