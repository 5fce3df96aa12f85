"""Simple attention with Frobenius-normalised queries and keys: DIFFormer and SGFormer, O(N d^2).

Shapes: q, k (..., N, d_qk); v (..., N, d) -> (..., N, d). Leading dims are (batch, heads) and
must be equal in q, k and v (no broadcasting: with ``joint_heads`` the heads share one norm, so
their layout matters); N is the number of nodes (self-attention over the nodes: queries, keys
and values are the same nodes). Nodes of several graphs are concatenated along N with a batch
vector (PyG convention): ``batch`` None (one graph) or an integer tensor (N,), sorted
nondecreasing, values in [0, G) (fast.batching.check_batch; gaps, i.e. empty graphs, allowed).

The formulas (the tutorial "DIFFormer: simplified attention computation", docs/papers.md; the
SGFormer paper for the second). Per graph g with N_g nodes, and per leading slice:

    q~ = Q_g / ||Q_g||_F,   k~ = K_g / ||K_g||_F                      (frobenius_normalize)
    DIFFormer:  z_u = (sum_{v in g} v_v + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w)
    SGFormer:   z_u = (N_g v_u         + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w)

i.e. attention with the scores 1 + q~_u . k~_v (the first-order Taylor expansion of exp) within
each graph; SGFormer replaces the sum of the values in the constant term by N_g times the node's
own value. Computed in O(N d_qk d): per graph the (d_qk, d) state K~_g^T V_g and the key sum
K~_g^T 1 (fast.batching.BatchIndex.segment_outer / segment_sum; plain GEMMs when batch is None),
then each node's query against its graph's state. The N x N score matrix is never formed.

The norm (``joint_heads``). The Frobenius norm runs over the graph's nodes and the features and,
with joint_heads=True (the default, the authors' code, which normalises the whole [N, H, D]
tensor) and q.dim() >= 3, over the head dim -3 as well (layout (*batch, H, N, d): the H heads
of one sample share one norm). joint_heads=False: one norm per leading slice (per head). Graphs
never share a norm: every output depends on its own graph's nodes only. (The public batched
DIFFormer code normalises across the whole batch, so graphs leak into each other; the tutorial's
snippet divides [N, H, D] by [N, H] without unsqueeze and uses the query count for N: neither is
copied here.)

A zero norm (a graph whose q, or k, is all zero) gives q~ = 0 (k~ = 0): the score term vanishes
and the output is the constant term's average (DIFFormer: the graph's mean value; SGFormer: v_u),
the limit of the formulas as Q -> 0. x / ||x|| has no derivative at x = 0 (its limit depends on
the direction), so there the normalised tensor is treated as the constant 0: its gradient is 0,
never NaN. Norms whose squares would overflow or underflow (entries beyond ~1e19 or below ~1e-19
in float32) are computed after a per-graph rescaling by the largest entry, so q~ is right there
too (the rare path, below).

The denominator guard. By Cauchy-Schwarz |q~_u . sum_w k~_w| <= |q~_u| |sum_w k~_w| <= sqrt(N_g),
so den_u >= N_g - sqrt(N_g) > 0 for N_g >= 2: only a one-node graph whose q is a negative
multiple of its k can make den_u vanish (its output, v_u for any other q, is then 0/0). A den_u
that is not finite, below the compute dtype's smallest normal number, or not above the round-off
floor 8 u sqrt(N_g d_qk) (N_g + sqrt(N_g)) (u the unit round-off; N_g + sqrt(N_g) bounds the sum
of the absolute terms) raises fast.DenominatorError naming the first such row (never divided by).
For N_g >= 2 the floor is far below the lower bound N_g - sqrt(N_g), so it can only refuse the
one-node case.

What is checked when (as fast.attention: no extra pass over the data on the common path). Before
anything is computed: metadata (types, dtypes, shapes, devices, the batch vector, which is read
once by check_batch). On the way: the per-graph sums of squares of q and k (every NaN or inf in
q or k reaches them; a zero, subnormal or overflowing norm sends the call to the rare path), the
denominators (guard above) and the output (one aminmax pass: a NaN or inf in v reaches it), as
0-dim device flags read ONCE per call. Only when that read fails: q, k, v are scanned (ValueError
naming the first non-finite one), the norms recomputed with rescaling, and the guard's per-row
analysis run. With a batch vector, check_batch reads the device once and the per-graph GEMMs
read the graph boundaries once (cached on the BatchIndex). Finite inputs whose output overflows
(values near the dtype's maximum) return inf in those rows, as fast.attention does.

float16 / bfloat16 inputs compute in float32 and the result is cast back (v's dtype, after
promotion of q, k, v as fast.masked_linear_attention). Differentiable in q, k and v (the
normalisation included).
"""
from __future__ import annotations

import math

import torch

from fast.algebra import guard_flag
from fast.batching import BatchIndex, check_batch
from fast.errors import DenominatorError
from fast.validation import check_same_device, check_tensor, compute_dtype, finite_flag, raise_if_non_finite

__all__ = ["frobenius_normalize", "difformer_attention", "sgformer_attention"]

#: Up to this many graphs, each node's query meets its graph's (d_qk, d) state through one GEMM
#: per graph (a Python loop over the graphs); beyond it, through batched matrix-vector products on
#: blocks of nodes with their graph's state gathered (memory-bound, but no loop over graphs).
LOOP_GRAPHS = 64

#: Elements of gathered state per block of nodes on the many-graphs path (32 MiB of float64).
BLOCK_ELEMS = 1 << 22


# ------------------------------------------------------------------------------ normalisation


def _joint(x: torch.Tensor, joint_heads: bool) -> bool:
    return bool(joint_heads) and x.dim() >= 3


def _node_reduce(t: torch.Tensor, joint: bool) -> torch.Tensor:
    """(..., N, c) -> (..., N) summed over the features (and the head dim -3, kept as 1, if joint)."""
    s = t.sum(-1)
    return s.sum(-2, keepdim=True) if joint else s


def _per_graph(s: torch.Tensor, bi: BatchIndex | None) -> torch.Tensor:
    """Per-node values (..., N) -> per-graph sums (..., G, 1) (G = 1 when bi is None)."""
    if bi is None:
        return s.sum(-1, keepdim=True).unsqueeze(-1)
    return bi.segment_sum(s.unsqueeze(-1))


def _to_nodes(per_graph: torch.Tensor, bi: BatchIndex | None) -> torch.Tensor:
    """Per-graph (..., G, c) -> per-node (..., N, c) (broadcastable (..., 1, c) when bi is None)."""
    return per_graph if bi is None else bi.gather(per_graph)


def _empty_graphs(bi: BatchIndex | None, like: torch.Tensor) -> torch.Tensor | float:
    """1 for the graphs with no node (gaps in the batch labels), 0 elsewhere, as (G, 1)."""
    if bi is None:
        return 0.0
    return (bi.sizes == 0).to(like.dtype).unsqueeze(-1)


def _norm_ok(sumsq: torch.Tensor, bi: BatchIndex | None) -> torch.Tensor:
    """0-dim flag: every nonempty graph's sum of squares is finite and a normal number (a zero,
    subnormal, overflowed or NaN one takes the rare path)."""
    info = torch.finfo(sumsq.dtype)
    with torch.no_grad():
        lo, hi = torch.aminmax((sumsq.detach() + _empty_graphs(bi, sumsq)))
        return (lo >= info.tiny) & (hi <= info.max)


def _normalize_plain(x: torch.Tensor, bi: BatchIndex | None, joint: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The common path: x / ||x_g||_F from the plain per-graph sums of squares (returned too,
    for the flag)."""
    sumsq = _per_graph(_node_reduce(x * x, joint), bi)
    inv = torch.rsqrt(sumsq)  # a zero norm gives inf here: only used when the flag passes
    return x * _to_nodes(inv, bi), sumsq


def _normalize_robust(x: torch.Tensor, bi: BatchIndex | None, joint: bool) -> torch.Tensor:
    """The rare path: rescale each graph by its largest |entry| s_g (detached: x / ||x|| is scale
    invariant, so s_g carries no gradient), then normalise; a zero graph gives 0 with gradient 0."""
    with torch.no_grad():
        lo, hi = torch.aminmax(x.detach(), dim=-1)
        node_max = torch.maximum(-lo, hi)  # (..., N)
        if joint:
            node_max = node_max.amax(-2, keepdim=True)
        if bi is None:
            graph_max = node_max.amax(-1, keepdim=True).unsqueeze(-1)  # (..., 1, 1)
        else:
            graph_max = bi.segment_max(node_max.unsqueeze(-1))  # (..., G, 1); -inf for an empty graph
        scale = _to_nodes(torch.where(graph_max > 0, graph_max, torch.ones_like(graph_max)), bi)
    y = x / scale  # largest entry of each nonzero graph is exactly 1: no overflow, no underflow to 0
    sumsq = _per_graph(_node_reduce(y * y, joint), bi)  # in [1, N_g H c] for a nonzero graph, else 0
    nonzero = sumsq > 0
    inv = torch.rsqrt(torch.where(nonzero, sumsq, torch.ones_like(sumsq)))
    nonzero_nodes = _to_nodes(nonzero.to(y.dtype), bi) > 0
    return torch.where(nonzero_nodes, y * _to_nodes(inv, bi), torch.zeros_like(y))


def frobenius_normalize(x: torch.Tensor, *, batch=None, joint_heads: bool = True) -> torch.Tensor:
    """x / ||x_g||_F per graph g (the tutorial's q~ = Q / ||Q||_F, per graph).

    x: (..., N, c) -> the same shape and dtype. batch: None (one graph) or the sorted batch
    vector (N,) (module doc). The norm runs over each graph's nodes and the features, and with
    joint_heads=True and x.dim() >= 3 over the head dim -3 too (layout (*batch, H, N, c), the
    authors' code); joint_heads=False: per leading slice. A graph whose x is all zero gives 0
    (gradient 0: x / ||x|| has no derivative at 0, module doc). Never NaN from finite input.

    Raises:
        TypeError / ValueError: not a floating tensor, fewer than 2 dims, N = 0, a bad batch
            vector (naming batch), NaN or inf in x (naming x).
    """
    check_tensor("x", x, check_finite=False)
    bi = check_batch(batch, x.shape[-2], name="batch", device=x.device)
    joint = _joint(x, joint_heads)
    work = x.to(compute_dtype(x.dtype))
    out, sumsq = _normalize_plain(work, bi, joint)
    if not bool(_norm_ok(sumsq, bi)):
        raise_if_non_finite(x=x)
        out = _normalize_robust(work, bi, joint)
    return out.to(x.dtype)


# ---------------------------------------------------------------------------------- attention


def _check_qkv(q: object, k: object, v: object) -> None:
    """Shapes, dtypes and devices only (metadata): finiteness is checked on the way."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, check_finite=False)
    check_same_device(q=q, k=k, v=v)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., N, d_qk) (self-attention over the nodes, equal "
                         f"leading (batch, head) dims), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v must have shape (..., N, d) with the leading dims and N of q and k {tuple(q.shape[:-1])}, "
                         f"got v {tuple(v.shape)}")


def _apply_state(qn: torch.Tensor, state: torch.Tensor, bi: BatchIndex) -> torch.Tensor:
    """qn (..., N, m), per-graph states (..., G, m, d) -> (..., N, d): row u is qn_u^T state[batch[u]].
    Never materialises (N, m, d) whole (module constants LOOP_GRAPHS, BLOCK_ELEMS)."""
    n = qn.shape[-2]
    if bi.num_graphs <= LOOP_GRAPHS:
        ptr = bi.host_ptr()
        parts = [qn[..., s:e, :] @ state[..., g, :, :] for g, (s, e) in enumerate(zip(ptr[:-1], ptr[1:])) if e > s]
        return torch.cat(parts, dim=-2)
    per_node = max(1, math.prod(state.shape[:-3]) * state.shape[-2] * state.shape[-1])
    step = max(1, BLOCK_ELEMS // per_node)
    index = bi.index
    parts = []
    for s in range(0, n, step):
        e = min(n, s + step)
        block = state[..., index[s:e], :, :]  # (..., B, m, d)
        parts.append((qn[..., s:e, :].unsqueeze(-2) @ block).squeeze(-2))
    return torch.cat(parts, dim=-2)


def _floor(counts: torch.Tensor, d_qk: int, dtype: torch.dtype) -> torch.Tensor:
    """The guard's round-off floor 8 u sqrt(N_g d_qk) (N_g + sqrt(N_g)) (module doc)."""
    u = torch.finfo(dtype).eps / 2
    return 8 * u * torch.sqrt(counts * d_qk) * (counts + torch.sqrt(counts))


def _simple_attention(q, k, v, batch, joint_heads: bool, own_value: bool, what: str) -> torch.Tensor:
    _check_qkv(q, k, v)
    n, d_qk = q.shape[-2], q.shape[-1]
    bi = check_batch(batch, n, name="batch", device=q.device)
    out_dtype = v.dtype
    work = compute_dtype(torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype))
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    joint = _joint(qw, joint_heads)

    def compute(robust: bool):
        if robust:
            qn, kn, norms = _normalize_robust(qw, bi, joint), _normalize_robust(kw, bi, joint), None
        else:
            (qn, ssq), (kn, ssk) = _normalize_plain(qw, bi, joint), _normalize_plain(kw, bi, joint)
            norms = _norm_ok(ssq, bi) & _norm_ok(ssk, bi)
        if bi is None:
            counts = torch.full((1, 1), float(n), dtype=work, device=q.device)  # (1, 1): N_g per node
            num = qn @ (kn.transpose(-1, -2) @ vw)
            ksum = kn.sum(-2, keepdim=True)  # (..., 1, d_qk)
            const = vw.sum(-2, keepdim=True) if not own_value else counts * vw
        else:
            counts = bi.gather(bi.sizes.to(work).unsqueeze(-1))  # (N, 1)
            num = _apply_state(qn, bi.segment_outer(kn, vw), bi)
            ksum = bi.gather(bi.segment_sum(kn))  # (..., N, d_qk)
            const = bi.gather(bi.segment_sum(vw)) if not own_value else counts * vw
        den = counts.squeeze(-1) + (qn * ksum).sum(-1)  # (..., N)
        floor = _floor(counts.squeeze(-1), d_qk, work)
        out = (num + const) / den.unsqueeze(-1)
        return out, den, floor, norms

    out, den, floor, norms = compute(robust=False)
    ok = norms & guard_flag(den, floor.expand(den.shape), positive=True) & finite_flag(out)
    if bool(ok):  # the call's one host read
        return out.to(out_dtype)
    raise_if_non_finite(q=q, k=k, v=v)
    out, den, floor, _ = compute(robust=True)
    _raise_if_bad_den(den, floor, bi, what)
    return out.to(out_dtype)  # finite input, den fine: an overflowing numerator stays inf (module doc)


def _raise_if_bad_den(den: torch.Tensor, floor: torch.Tensor, bi: BatchIndex | None, what: str) -> None:
    """DenominatorError naming the first failing row (the rare path's per-row analysis)."""
    info = torch.finfo(den.dtype)
    d = den.detach()
    bad = ~torch.isfinite(d) | (d < info.tiny) | ~(d > floor)
    if not bool(bad.any()):
        return
    first = [int(i) for i in torch.nonzero(bad)[0]]
    *lead, u = first
    g = int(bi.index[u]) if bi is not None else 0
    size = int(bi.sizes[g]) if bi is not None else den.shape[-1]
    where = f"node {u}" + (f" of leading index {tuple(lead)}" if lead else "") + f" (graph {g}, {size} node(s))"
    raise DenominatorError(
        f"{what}: {int(bad.sum())} of {bad.numel()} denominators N_g + q~_u . sum_w k~_w are zero, subnormal, "
        f"or within round-off of zero (the first: {where}, den = {float(d[tuple(first)]):.3g}); by "
        f"Cauchy-Schwarz den >= N_g - sqrt(N_g), so this is a one-node graph whose q is a negative multiple of its "
        f"k (q~ . k~ = -1): its output (v_u for any other q) is 0/0 there. Perturb q or k, or drop the graph")


def difformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batch=None,
                        joint_heads: bool = True) -> torch.Tensor:
    """DIFFormer's simple attention (the tutorial; DIFFormer-s), per graph, O(N d_qk d).

    z_u = (sum_{v in g} v_v + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w),
    q~, k~ the per-graph Frobenius-normalised q, k (frobenius_normalize; joint_heads there).

    q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d) in v's dtype (module doc: leading dims
    equal, batch vector, zero norms, the denominator guard, half precisions).

    Raises:
        TypeError / ValueError: bad types or shapes, a bad batch vector (naming batch), NaN or
            inf in q, k or v (naming it).
        DenominatorError: a vanished denominator (a one-node graph with q~ . k~ = -1).
    """
    return _simple_attention(q, k, v, batch, joint_heads, own_value=False, what="difformer_attention")


def sgformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batch=None,
                       joint_heads: bool = True) -> torch.Tensor:
    """SGFormer's simple global attention, per graph, O(N d_qk d).

    z_u = (N_g v_u + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w): DIFFormer
    (difformer_attention) with the node's own value, times N_g, in the constant term.

    q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d) in v's dtype (module doc).

    Raises:
        TypeError / ValueError: bad types or shapes, a bad batch vector (naming batch), NaN or
            inf in q, k or v (naming it).
        DenominatorError: a vanished denominator (a one-node graph with q~ . k~ = -1).
    """
    return _simple_attention(q, k, v, batch, joint_heads, own_value=True, what="sgformer_attention")
