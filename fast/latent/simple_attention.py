"""Simple attention with Frobenius-normalised queries and keys: DIFFormer and SGFormer, O(N d_qk d).

Per graph g with N_g nodes and per leading slice (the tutorial's DIFFormer-s; SGFormer):

    q~ = Q_g / ||Q_g||_F,   k~ = K_g / ||K_g||_F                      (frobenius_normalize)
    DIFFormer:  z_u = (sum_{v in g} v_v + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w)
    SGFormer:   z_u = (N_g v_u         + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w)

that is, attention with the scores 1 + q~_u . k~_v (exp to first order). Shapes: q, k (..., N, d_qk),
v (..., N, d) -> (..., N, d) in v's dtype; the leading (batch, head) dims must be equal in all
three (no broadcasting: with ``joint_heads`` the heads share one norm). Several graphs are
concatenated along N with a sorted PyG batch vector ``batch`` (N,) (fast.batching.check_batch;
empty graphs allowed); graphs never share a norm, so every output depends on its own graph only.
The N x N scores are never formed: per graph, the (d_qk, d) state and the key sum, then each
node's query against its graph's state, with one host read per call. A graph whose q (or k) is
all zero gives q~ = 0 with gradient 0, never NaN. Only a one-node graph whose q is a negative
multiple of its k can make a denominator vanish: fast.DenominatorError. The sums inside reach
about N_g max |v| while z stays within a factor (N + sqrt N) / (N - sqrt N) of max |v| (DIFFormer:
an average of v): values whose sums overflow are redone on v 2^-s and multiplied back, exactly
(fast.scaling; one read pass over the output, O(N d), tells the rare path). Half precisions
compute in float32 and are cast back; differentiable in q, k and v. docs/papers.md
("fast.latent.simple_attention") has the norm options, the denominator bound and what is checked
when.
"""
from __future__ import annotations

import math

import torch

from fast.algebra import guard_flag
from fast.batching import BatchIndex, check_batch
from fast.errors import DenominatorError
from fast.scaling import times_pow2, value_shift, within_values
from fast.segments import few_segments
from fast.validation import check_same_device, check_tensor, compute_dtype, finite_flag, raise_if_non_finite

__all__ = ["frobenius_normalize", "difformer_attention", "sgformer_attention"]

# ------------------------------------------------------------------------------ normalisation


def _joint(x: torch.Tensor, joint_heads: bool | None) -> bool:
    """Whether the norm spans the head dim -3 (frobenius_normalize): None (the default) when
    x.dim() >= 4 ((*batch, H, N, c)); True when x.dim() >= 3 ((H, N, c) read as heads); False never."""
    if joint_heads is None:
        return x.dim() >= 4
    if not isinstance(joint_heads, bool):
        raise TypeError(f"joint_heads must be None, True or False, got {joint_heads!r}")
    return joint_heads and x.dim() >= 3


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


def _common_ok(ssq: torch.Tensor, bi: BatchIndex | None, count: int) -> torch.Tensor:
    """0-dim flag for the folded common path: every nonempty graph's sum of squares lies in the
    window [max(2^(-2E), count tiny / eps), 2^(2E)], E = maxexp // 3 (float32: norms in
    [2^-42, 2^42]). Inside it the sums of squares neither overflowed nor lost precision to
    underflow (count tiny / eps bounds the subnormal round-off of count squares by eps ssq), and
    the folded scales 1 / (||Q_g|| ||K_g||) stay normal numbers. NaN fails every comparison."""
    info = torch.finfo(ssq.dtype)
    e = math.frexp(info.max)[1] // 3  # maxexp // 3: 42 (float32), 341 (float64)
    lo = max(2.0 ** (-2 * e), count * info.tiny / info.eps)
    with torch.no_grad():
        lo_v, hi_v = torch.aminmax(ssq.detach() + _empty_graphs(bi, ssq))
        return (lo_v >= lo) & (hi_v <= 2.0 ** (2 * e))


def _sumsq(x: torch.Tensor, bi: BatchIndex | None, joint: bool) -> torch.Tensor:
    """Per-graph sums of squares, no (N, c) temporary: (..., 1, 1) ((..., 1, 1, 1) if joint) when
    bi is None, else (..., G, 1) ((..., 1, G, 1) if joint). Node norms by torch.linalg.vector_norm
    (one read of x), squared per node, summed per graph."""
    if bi is None:
        dims = (-3, -2, -1) if joint else (-2, -1)
        return torch.linalg.vector_norm(x, dim=dims, keepdim=True).square()
    node = torch.linalg.vector_norm(x, dim=-1).square()  # (..., N)
    if joint:
        node = node.sum(-2, keepdim=True)  # (..., 1, N): the heads of a sample share the norm
    return bi.segment_sum(node.unsqueeze(-1))


def _normalize_plain(x: torch.Tensor, bi: BatchIndex | None, joint: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The common path: x / ||x_g||_F from the plain per-graph sums of squares (returned too,
    for the flag)."""
    sumsq = _sumsq(x, bi, joint)
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


def frobenius_normalize(x: torch.Tensor, *, batch=None, joint_heads: bool | None = None) -> torch.Tensor:
    """x / ||x_g||_F per graph g (the tutorial's q~ = Q / ||Q||_F, per graph).

    x: (..., N, c) -> the same shape and dtype; batch: None (one graph) or the sorted batch vector
    (N,). The norm runs over each graph's nodes and features and, with ``joint_heads``, over the
    head dim -3 too: None (default) does so for x.dim() >= 4 ((*batch, H, N, c), the authors'
    code) and keeps the slices of a 3-D x apart (dim -3 read as a batch); True reads dim -3 of a
    3-D or larger x as heads; False gives one norm per leading slice. A graph whose x is all zero
    gives 0 with gradient 0 (x / ||x|| has no derivative at 0); never NaN from finite input.
    O(N c), one host read. TypeError / ValueError: not a floating tensor, fewer than 2 dims, N = 0,
    a bad batch vector (naming batch), joint_heads not None/True/False, NaN or inf in x (naming x).

        >>> import torch
        >>> from fast.latent.simple_attention import frobenius_normalize
        >>> y = frobenius_normalize(torch.tensor([[3.0, 0.0], [0.0, 4.0], [2.0, 0.0]]), batch=torch.tensor([0, 0, 1]))
        >>> [round(float(t), 4) for t in y.flatten()]  # graph 0 divided by 5, graph 1 by 2
        [0.6, 0.0, 0.0, 0.8, 1.0, 0.0]
        >>> frobenius_normalize(torch.zeros(2, 3)).abs().sum().item()
        0.0
    """
    check_tensor("x", x, check_finite=False)
    bi = check_batch(batch, x.shape[-2], name="batch", device=x.device)
    joint = _joint(x, joint_heads)
    work = x.to(compute_dtype(x.dtype))
    out, sumsq = _normalize_plain(work, bi, joint)
    count = (work.shape[-3] if joint else 1) * work.shape[-2] * work.shape[-1]
    if not bool(_common_ok(sumsq, bi, count)):
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


def _floor(counts: torch.Tensor, d_qk: int, dtype: torch.dtype) -> torch.Tensor:
    """The guard's round-off floor 8 u sqrt(N_g d_qk) (N_g + sqrt(N_g)) (docs/papers.md)."""
    u = torch.finfo(dtype).eps / 2
    return 8 * u * torch.sqrt(counts * d_qk) * (counts + torch.sqrt(counts))


def _folded_one(qw, kw, vw, joint: bool, own_value: bool):
    """The folded common path on ONE graph (all N nodes): (out (..., N, d), ok 0-dim flag).

    q~ and k~ are never materialised: c = 1 / (||Q|| ||K||) is folded into the small state
    S = c K^T V (d_qk, d) and key sum s = c K^T 1 (d_qk, 1), so z = (Q S + C) / (N + Q s): one
    GEMM for the numerators, one GEMV for the denominators, C = 1 sum_v v_v^T (DIFFormer) or N V
    (SGFormer). Checked (docs/papers.md): the sums of squares (_common_ok), S, s and the value sum
    (finite: a NaN or inf in k or v reaches them), and the denominators (the guard)."""
    n, d_qk = qw.shape[-2], qw.shape[-1]
    count = (qw.shape[-3] if joint else 1) * n * d_qk
    ssq, ssk = _sumsq(qw, None, joint), _sumsq(kw, None, joint)
    ok = _common_ok(ssq, None, count) & _common_ok(ssk, None, count)
    scale = torch.rsqrt(ssq) * torch.rsqrt(ssk)  # (..., 1, 1); normal numbers inside the window
    state = (kw.transpose(-1, -2) @ vw) * scale  # (..., d_qk, d)
    ksum = kw.sum(-2, keepdim=True).transpose(-1, -2) * scale  # (..., d_qk, 1)
    if own_value:
        ok = ok & finite_flag(state, ksum)
        const, alpha = vw, n  # N V, added as alpha * V (no N V temporary)
    else:
        const, alpha = vw.sum(-2, keepdim=True), 1  # (..., 1, d)
        ok = ok & finite_flag(state, ksum, const)
    inplace = not (torch.is_grad_enabled() and (qw.requires_grad or kw.requires_grad or vw.requires_grad))
    num, den = qw @ state, qw @ ksum  # (..., N, d), (..., N, 1)
    if inplace:
        num.add_(const, alpha=alpha)
        den.add_(n)
    else:
        num, den = torch.add(num, const, alpha=alpha), den + n
    floor = _floor(torch.tensor(float(n), dtype=den.dtype, device=den.device), d_qk, den.dtype)
    ok = ok & guard_flag(den, floor.expand(den.shape), positive=True)
    out = num.div_(den) if inplace else num / den
    return out, ok & finite_flag(out)  # the sums of v (N V, q S) can overflow where z is finite


def _folded_many(qw, kw, vw, bi: BatchIndex, joint: bool, own_value: bool):
    """The folded common path for many graphs (fast.segments.few_segments false): per-graph sums of squares, states
    and key sums by segment reductions, the states augmented by the key sums (..., G, d_qk, d + 1)
    and met by each node's unnormalised query in one pass (BatchIndex.apply_state). (out, ok)."""
    d_qk, d = qw.shape[-1], vw.shape[-1]
    count = (qw.shape[-3] if joint else 1) * qw.shape[-2] * d_qk  # bounds every graph's entry count
    ssq, ssk = _sumsq(qw, bi, joint), _sumsq(kw, bi, joint)
    ok = _common_ok(ssq, bi, count) & _common_ok(ssk, bi, count)
    empty = _empty_graphs(bi, ssq)  # an empty graph's sums (0) get scale 1: finite, and never used
    scale = (torch.rsqrt(ssq + empty) * torch.rsqrt(ssk + empty)).unsqueeze(-1)  # (..., G, 1, 1)
    state = bi.segment_outer(kw, vw) * scale  # (..., G, d_qk, d)
    ksum = bi.segment_sum(kw).unsqueeze(-1) * scale  # (..., G, d_qk, 1)
    ok = ok & finite_flag(state, ksum)
    res = bi.apply_state(qw, torch.cat([state, ksum], dim=-1))  # (..., N, d + 1)
    sizes = bi.sizes.to(qw.dtype).unsqueeze(-1)  # (G, 1)
    counts = bi.gather(sizes)  # (N, 1)
    if own_value:
        const = counts * vw
    else:
        vsum = bi.segment_sum(vw)  # (..., G, d)
        ok = ok & finite_flag(vsum)
        const = bi.gather(vsum)
    num, den = res[..., :d] + const, res[..., d:] + counts
    floor = bi.gather(_floor(sizes, d_qk, den.dtype))  # (N, 1)
    ok = ok & guard_flag(den, floor.expand(den.shape), positive=True)
    out = num / den
    return out, ok & finite_flag(out)  # the sums of v can overflow where z is finite


def _folded(qw, kw, vw, bi: BatchIndex | None, joint: bool, own_value: bool):
    """The common path (q~, k~ never formed): (out, ok), ok the 0-dim flag of every check. One
    graph: _folded_one; few graphs (fast.segments.few_segments): _folded_one on each graph's contiguous nodes
    (slices, no copies; sums per graph in torch's own blocked order); more: _folded_many."""
    if bi is None:
        return _folded_one(qw, kw, vw, joint, own_value)
    if not few_segments(bi.num_graphs):
        return _folded_many(qw, kw, vw, bi, joint, own_value)
    ptr = bi.host_ptr()
    outs, ok = [], None
    for s, e in zip(ptr[:-1], ptr[1:]):
        if e > s:
            out, flag = _folded_one(qw[..., s:e, :], kw[..., s:e, :], vw[..., s:e, :], joint, own_value)
            outs.append(out)
            ok = flag if ok is None else ok & flag
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)), ok


def _materialised(qw, kw, vw, bi: BatchIndex | None, joint: bool, own_value: bool):
    """The rare path: q~, k~ formed with the rescaled norms (_normalize_robust: extreme magnitudes,
    zero norms with q~ = 0 and gradient 0), then the same formulas. Returns (out, den, floor)."""
    n, d_qk = qw.shape[-2], qw.shape[-1]
    qn, kn = _normalize_robust(qw, bi, joint), _normalize_robust(kw, bi, joint)
    if bi is None:
        counts = torch.full((1, 1), float(n), dtype=qw.dtype, device=qw.device)
        num = qn @ (kn.transpose(-1, -2) @ vw)
        den = qn @ kn.sum(-2, keepdim=True).transpose(-1, -2) + n  # (..., N, 1)
        const = vw.sum(-2, keepdim=True) if not own_value else n * vw
    else:
        counts = bi.gather(bi.sizes.to(qw.dtype).unsqueeze(-1))  # (N, 1)
        num = bi.apply_state(qn, bi.segment_outer(kn, vw))
        den = (qn * bi.gather(bi.segment_sum(kn))).sum(-1, keepdim=True) + counts
        const = bi.gather(bi.segment_sum(vw)) if not own_value else counts * vw
    floor = _floor(counts, d_qk, qw.dtype)
    return (num + const) / den, den, floor


def _simple_attention(q, k, v, batch, joint_heads, own_value: bool, what: str) -> torch.Tensor:
    _check_qkv(q, k, v)
    n = q.shape[-2]
    joint = _joint(q, joint_heads)
    bi = check_batch(batch, n, name="batch", device=q.device)
    out_dtype = v.dtype
    work = compute_dtype(torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype))
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    out, ok = _folded(qw, kw, vw, bi, joint, own_value)
    if bool(ok):  # the call's one host read
        return out.to(out_dtype)
    raise_if_non_finite(q=q, k=k, v=v)
    out, den, floor = _materialised(qw, kw, vw, bi, joint, own_value)
    _raise_if_bad_den(den.squeeze(-1), floor.squeeze(-1).expand(den.shape[:-1]), bi, what)
    if not bool(finite_flag(out)):  # finite input, den fine: sums of v overflowed. Redo on v 2^-s (exact)
        out = _rescaled(qw, kw, vw, bi, joint, own_value)
    return out.to(out_dtype)


def _rescaled(qw, kw, vw, bi: BatchIndex | None, joint: bool, own_value: bool) -> torch.Tensor:
    """The rare path's z for values whose sums overflowed: 2^s z(v 2^-s) (fast.scaling; exact, powers of
    two). Every sum of the formulas is at most 2 N max |v| (|sum_v k~_v v_v| <= sqrt(N) max |v|, |q~| <= 1):
    s keeps 2 N max |v| 2^-s below finfo.max / 4, and only an output that overflows itself stays inf
    (SGFormer's off-diagonal scores q~ . k~ may be negative, so its z can exceed max |v| by a factor
    up to (N + sqrt N) / (N - sqrt N)). Columns share s across graphs."""
    n = vw.shape[-2]
    for bound in (2.0 * n, None):
        shift = value_shift(vw, bound)
        scaled = times_pow2(vw, -shift)
        out = _materialised(qw, kw, scaled, bi, joint, own_value)[0]
        if bool(finite_flag(out)):
            break
    if not own_value:  # DIFFormer's scores 1 + q~ . k~ >= 0: z stays in v's range, round-off included
        out = within_values(out, scaled)
    return times_pow2(out, shift)


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
                        joint_heads: bool | None = None) -> torch.Tensor:
    """DIFFormer's simple attention (the tutorial; DIFFormer-s), per graph, O(N d_qk d).

    z_u = (sum_{v in g} v_v + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w),
    q~, k~ the per-graph Frobenius-normalised q, k (frobenius_normalize, which explains
    joint_heads). q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d) in v's dtype (module doc).

    Raises:
        TypeError / ValueError: bad types or shapes, a bad batch vector (naming batch),
            joint_heads not None/True/False, NaN or inf in q, k or v (naming it).
        DenominatorError: a vanished denominator (a one-node graph with q~ . k~ = -1).

    It equals dense attention with the scores 1 + q~_u . k~_v:

        >>> import torch
        >>> from fast.latent.simple_attention import difformer_attention
        >>> q, k, v = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> s = 1 + (q / q.norm()) @ (k / k.norm()).T  # the dense (N, N) scores
        >>> bool(torch.allclose(difformer_attention(q, k, v), (s @ v) / s.sum(-1, keepdim=True)))
        True
    """
    return _simple_attention(q, k, v, batch, joint_heads, own_value=False, what="difformer_attention")


def sgformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batch=None,
                       joint_heads: bool | None = None) -> torch.Tensor:
    """SGFormer's simple global attention, per graph, O(N d_qk d).

    z_u = (N_g v_u + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w): DIFFormer
    (difformer_attention) with the node's own value, times N_g, in the constant term. q, k:
    (..., N, d_qk); v: (..., N, d) -> (..., N, d) in v's dtype (module doc). Errors as
    difformer_attention's. It equals dense attention with the scores N delta_uv + q~_u . k~_v:

        >>> import torch
        >>> from fast.latent.simple_attention import sgformer_attention
        >>> q, k, v = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> s = 5 * torch.eye(5, dtype=torch.float64) + (q / q.norm()) @ (k / k.norm()).T  # dense scores
        >>> bool(torch.allclose(sgformer_attention(q, k, v), (s @ v) / s.sum(-1, keepdim=True)))
        True
    """
    return _simple_attention(q, k, v, batch, joint_heads, own_value=True, what="sgformer_attention")
