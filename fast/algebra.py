"""Algorithm 1's building blocks below the masks (choromanski22 Alg. 1, Lemma 3.1).

    out_i = phi_q_i^T D1_i / phi_q_i^T D2_i,   D1 = M [vec(phi_k_j v_j^T)]_j  (N x m d),   D2 = M phi_k

for any mask operator M (fast.operator): the feature-blocked numerator ``blocked_numerator``, block
sizing, the guarded division ``divide``, the unmasked ``linear_products``, the matrix-vector
products ``rows_dot`` and ``weighted_rows`` (as one-row GEMMs), and ``masked_products``,
whose backward recomputes the blocks so that training memory stays O(N (m + d) + N block), never
O(N m d). Cost O((T_M(N) + N) m d) for a mask product costing T_M(N). The backward's derivation:
docs/papers.md, "fast.algebra".
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from fast.errors import DenominatorError
from fast.operator import MaskOperator, as_operator

#: Most columns of [vec(phi_k v^T)] pushed through the mask at once: peak extra memory of the
#: generic path is O(N * block_cols).
DEFAULT_BLOCK_COLS = 256
#: block_cols=None: as many columns as keep one block of (..., N, cols) within this many bytes
#: (a mask's matmul makes a few copies of it), between d and DEFAULT_BLOCK_COLS.
DEFAULT_BLOCK_BYTES = 256 * 2**20


def default_block_cols(v: torch.Tensor) -> int:
    """Columns per block for values v (..., N, d): at most DEFAULT_BLOCK_COLS, one block within
    DEFAULT_BLOCK_BYTES, at least d. O(1): reads v's shape and dtype only.

    >>> import torch
    >>> from fast.algebra import default_block_cols
    >>> default_block_cols(torch.empty(16, 8)), default_block_cols(torch.empty(2**20, 64, device="meta"))
    (256, 64)
    """
    rows = max(1, v.numel() // v.shape[-1])  # batch x N (at least 1: an empty batch)
    return min(DEFAULT_BLOCK_COLS, max(v.shape[-1], DEFAULT_BLOCK_BYTES // (rows * v.element_size())))


def features_per_block(block_cols: int, d: int) -> int:
    """Features a of phi_k whose a * d columns phi_k[:, a] v^T form one block (at least 1).

    >>> from fast.algebra import features_per_block
    >>> features_per_block(256, 16), features_per_block(4, 8)
    (16, 1)
    """
    return max(1, block_cols // d)


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum())


def guard_flag(den: torch.Tensor, floor: torch.Tensor | None = None, *, positive: bool = False) -> torch.Tensor:
    """The guard's common case as a 0-dim bool tensor on den (..., N)'s device, nothing synchronised:
    True when every den_i is finite, |den_i| >= finfo.tiny, |den_i| <= finfo.max and (with
    ``floor`` (..., N)) |den_i| > floor_i. ``positive``: den_i itself must be >= finfo.tiny (for
    nonnegative features and mask a negative den is impossible). One read pass (aminmax), O(N); NaN
    fails every comparison; ``divide`` sorts out the failing cases.

    >>> import torch
    >>> from fast.algebra import guard_flag
    >>> bool(guard_flag(torch.tensor([1., 0.5]))), bool(guard_flag(torch.tensor([1., 0.])))
    (True, False)
    """
    info = torch.finfo(den.dtype)
    if den.numel() == 0:  # an empty batch: nothing to refuse (aminmax refuses empty tensors)
        return torch.ones((), dtype=torch.bool, device=den.device)
    with torch.no_grad():
        den = den.detach()
        mag = den if positive else den.abs()
        lo, hi = torch.aminmax(mag)
        ok = (lo >= info.tiny) & (hi <= info.max)
        if floor is not None:
            ok = ok & ((mag - floor).amin() > 0)
    return ok


def divide(num: torch.Tensor, den: torch.Tensor, *, floor: torch.Tensor | None = None,
           no_key: torch.Tensor | Callable[[], torch.Tensor | None] | None = None,
           policy: str = "raise", verified: bool = False, no_key_cause: str | None = None) -> torch.Tensor:
    """num (..., N, d) / den (..., N), guarded: DenominatorError instead of dividing by a den_i that is
    not finite, is zero or subnormal (|den_i| < finfo.tiny: its relative precision is gone), or has
    |den_i| <= floor_i when ``floor`` (..., N) is given (an absolute bound on den_i's round-off:
    terms that cancel). O(N d).

    Rows that see no key go first to the no-key policy: ``no_key`` is a bool (..., N) tensor of them,
    or a callable returning one (or None), called only when some denominator fails. ``policy``
    (the drivers' ``no_key``): "raise" refuses them (DenominatorError naming no_key="zero"); "zero"
    gives them output 0 (gradient 0). Other failing rows raise whatever the policy. ``no_key_cause``:
    what emptied those rows, in the mask's terms (fast.operator, ``no_key_cause``), for the message.
    ``verified=True``: the caller has already read ``guard_flag(den, floor)`` as True, so divide only
    divides (no host read); otherwise ``guard_flag`` is read once and ``refused_rows`` runs only when
    it fails.

    >>> import torch
    >>> from fast.algebra import divide
    >>> divide(torch.ones(2, 3), torch.tensor([2., 4.]))[:, 0].tolist()
    [0.5, 0.25]
    >>> divide(torch.ones(1, 3), torch.zeros(1))
    Traceback (most recent call last):
    fast.errors.DenominatorError: attention denominator refused at 1 of 1 query positions: 1 zero or subnormal ...
    """
    if verified or den.numel() == 0:
        return quotient(num, den)
    # NaN fails every comparison, so a NaN den (or floor) takes the slow path, which sorts the cases out
    if bool(guard_flag(den, floor)):
        return quotient(num, den)
    rows = refused_rows(den, floor=floor, no_key=no_key, policy=policy, no_key_cause=no_key_cause)
    if rows is None:  # the fast test and the per-row one disagreed (flush-to-zero)
        return quotient(num, den)
    keep = ~rows
    return torch.where(keep.unsqueeze(-1), num / torch.where(keep, den, torch.ones_like(den)).unsqueeze(-1),
                       torch.zeros_like(num))


def refused_rows(den: torch.Tensor, *, floor: torch.Tensor | None = None,
                 no_key: torch.Tensor | Callable[[], torch.Tensor | None] | None = None,
                 policy: str = "raise", no_key_cause: str | None = None) -> torch.Tensor | None:
    """``divide``'s per-row analysis of den (..., N), without the division (the caller has the
    quotient already, e.g. fast.favor_blockwise): raises DenominatorError as ``divide`` does, else
    returns the bool rows that see no key and get output 0 under policy "zero" (None when there
    are none). O(N), with several host reads: for the rare path only.

    >>> import torch
    >>> from fast.algebra import refused_rows
    >>> refused_rows(torch.tensor([1., 0.]), no_key=torch.tensor([False, True]), policy="zero").tolist()
    [False, True]
    >>> refused_rows(torch.tensor([1., 2.])) is None
    True
    """
    mag = den.abs()
    info = torch.finfo(den.dtype)
    bad = ~torch.isfinite(den) | (mag < info.tiny)
    if floor is not None:
        bad = bad | ~(mag > floor)
    rows = no_key() if callable(no_key) else no_key
    if rows is not None:
        rows = rows.expand(bad.shape) if tuple(rows.shape) != tuple(bad.shape) else rows
        unseen = _count(rows)
        if unseen and policy == "raise":
            cause = no_key_cause or ("a fully padded sample, an empty segment, an all-zero row of a dense "
                                     "mask")
            raise DenominatorError(
                f"{unseen} of {den.numel()} queries see no key (their mask row is all zero: {cause}), so their "
                "attention is undefined; pass no_key=\"zero\" to output 0 for them, or give every query a key")
        if unseen:
            bad = bad & ~rows
    if bool(bad.any()):
        nonfinite = ~torch.isfinite(den)
        tiny = ~nonfinite & (mag < info.tiny)
        cancelled = bad & ~nonfinite & ~tiny
        parts = []
        if bool((bad & nonfinite).any()):
            parts.append(f"{_count(bad & nonfinite)} not finite (the terms overflowed: scale the features down, "
                         "or use float64)")
        if bool((bad & tiny).any()):
            parts.append(f"{_count(bad & tiny)} zero or subnormal (below {info.tiny:.3g} in "
                         f"{str(den.dtype).replace('torch.', '')}: features that vanish or underflow on every "
                         "visible key, or a mask that hides every key; check the features' scale, or use float64)")
        if bool(cancelled.any()):
            parts.append(f"{_count(cancelled)} within round-off of zero relative to the terms they sum (the terms "
                         "cancel: features or a mask that are not positive; use positive features, e.g. FAVOR+ "
                         "or ELU + 1, a nonnegative mask, or float64)")
        raise DenominatorError(
            f"attention denominator refused at {_count(bad)} of {den.numel()} query positions: " + "; ".join(parts))
    if rows is None or not bool(rows.any()):
        return None
    return rows


class _Quotient(torch.autograd.Function):
    """out = num / den[..., None] with a backward of two passes: for upstream g,
    d num = g / den and d den_i = -(g_i . num_i) / den_i^2 (torch's division backward forms
    g * num / den^2 in full, ~3 more passes over (N, d)). Saves num and den, never out: the
    caller may modify the returned output in place (out += residual, relu_) and still backward."""

    @staticmethod
    def forward(ctx, num, den):
        ctx.save_for_backward(num, den)
        return num / den.unsqueeze(-1)

    @staticmethod
    def backward(ctx, g):
        num, den = ctx.saved_tensors
        r = den.reciprocal()
        g_num = g * r.unsqueeze(-1) if ctx.needs_input_grad[0] else None
        g_den = None
        if ctx.needs_input_grad[1]:
            g_den = _row_dots(g, num).mul_(r * r).neg_() if not torch.is_grad_enabled() else \
                -_row_dots(g, num) * (r * r)
        return g_num, g_den


def rows_dot(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """x_i . z for every row: x (..., N, m), z (..., m) -> (..., N), leading dims broadcast; O(N m).

    One batched GEMM with a single output row, z^T x^T. torch.einsum("...nm,...m->...n") takes the
    other orientation (z as one column) for 3-D operands, which ran 4-6x slower on the CPU (torch
    2.13, 2 threads: (4, 2^12, 16) 79 against 20 us, (4, 2^14, 64) 1148 against 184 us); for 2-D,
    4-D and 5-D operands it took this one (the same bits). The denominators den_i = phi_q_i . z.

    >>> import torch
    >>> from fast.algebra import rows_dot
    >>> rows_dot(torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([1., -1.])).tolist()
    [-1.0, -1.0]
    """
    # z contiguous: an expanded one (autograd's gradient of a sum has stride 0) sent the CPU GEMM
    # down a path 30x slower ((512, 1, 32) x (512, 32, 16): 767 against 20 us)
    return torch.matmul(z.contiguous().unsqueeze(-2), x.transpose(-1, -2)).squeeze(-2)


def weighted_rows(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """sum_i g_i x_i: x (..., N, m), g (..., N) -> (..., m), leading dims broadcast; O(N m).

    One batched GEMM with a single output row, g^T x, for the reason of ``rows_dot``: einsum
    ("...nm,...n->...m") on 3-D operands ran 9-19x slower on the CPU ((4, 2^12, 16) 112 against 13
    us, (4, 2^14, 64) 2381 against 128 us). The gradient of den_i = phi_q_i . z with respect to z.

    >>> import torch
    >>> from fast.algebra import weighted_rows
    >>> weighted_rows(torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([1., -1.])).tolist()
    [-2.0, -2.0]
    """
    return torch.matmul(g.contiguous().unsqueeze(-2), x).squeeze(-2)  # g contiguous: as in rows_dot


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_d a[..., n, d] b[..., n, d] -> (..., N). On CUDA a product and a sum: einsum makes it a
    batched matmul of N (1 x d) (d x 1) products, which cuBLAS ran 4-7x slower (one H100, (8, 2^20,
    64) float32: 14.6-27 ms against 3.9 ms). On the CPU the einsum: it never forms the (N, d)
    product, whose allocation cost 5x at N = 2^16."""
    if a.is_cuda:
        return (a * b).sum(-1)
    return torch.einsum("...nd,...nd->...n", a, b)


def quotient(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num (..., N, d) / den (..., N) (no guard), O(N d): under autograd with a two-pass backward
    (``_Quotient``), else the plain division.

    >>> import torch
    >>> from fast.algebra import quotient
    >>> num, den = torch.ones(2, 3, requires_grad=True), torch.tensor([2., 4.], requires_grad=True)
    >>> quotient(num, den).sum().backward()            # d/d den_i of sum_j 1 / den_i = -3 / den_i^2
    >>> den.grad.tolist()
    [-0.75, -0.1875]
    """
    if torch.is_grad_enabled() and (num.requires_grad or den.requires_grad) and num.shape[:-1] == den.shape:
        return _Quotient.apply(num, den)
    return num / den.unsqueeze(-1)


class _LinearProducts(torch.autograd.Function):
    """(num, den, kv) of unmasked linear attention: kv = phi_k^T v (..., m, d), num = phi_q kv,
    den = phi_q (phi_k^T 1); kv is returned for the driver's finiteness check (no gradient).

    Backward in four GEMMs and two rank-one updates, every gradient contiguous (autograd through
    ``phi_k.transpose(-1, -2) @ v`` hands phi_k a transposed gradient, and an elementwise
    backward above it, e.g. ELU's, runs slower on such strides):
        d phi_q = g_num kv^T + g_den ks^T,   d kv = phi_q^T g_num,   d ks = phi_q^T g_den,
        d phi_k = v d kv^T + 1 d ks^T,       d v = phi_k d kv       (ks = phi_k^T 1).
    Saves phi_q, phi_k, v (and kv, ks: m (d + 1) numbers); double backward forms kv and ks again
    from the saved inputs so that they carry their graph."""

    @staticmethod
    def forward(ctx, phi_q, phi_k, v):
        kv = phi_k.transpose(-1, -2) @ v
        ks = phi_k.sum(dim=-2)
        num = phi_q @ kv
        den = rows_dot(phi_q, ks)
        ctx.save_for_backward(phi_q, phi_k, v, kv, ks)
        ctx.mark_non_differentiable(kv)
        return num, den, kv

    @staticmethod
    def backward(ctx, g_num, g_den, _):
        phi_q, phi_k, v, kv, ks = ctx.saved_tensors
        create = torch.is_grad_enabled()
        if create:  # double backward: kv and ks must carry their dependence on phi_k and v
            kv, ks = phi_k.transpose(-1, -2) @ v, phi_k.sum(dim=-2)
        need_q, need_k, need_v = ctx.needs_input_grad
        if g_num is None:
            g_num = torch.zeros(*phi_q.shape[:-1], v.shape[-1], dtype=phi_q.dtype, device=phi_q.device)
        if g_den is None:
            g_den = torch.zeros(phi_q.shape[:-1], dtype=phi_q.dtype, device=phi_q.device)
        dq = dk = dv = None
        if need_q:
            dq = g_num @ kv.transpose(-1, -2)
            rank_one = g_den.unsqueeze(-1) * ks.unsqueeze(-2)
            dq = dq + rank_one if create else dq.add_(rank_one)
        if need_k or need_v:
            dkv = phi_q.transpose(-1, -2) @ g_num  # (..., m, d)
            if need_k:
                dks = weighted_rows(phi_q, g_den)
                dk = v @ dkv.transpose(-1, -2)
                dk = dk + dks.unsqueeze(-2) if create else dk.add_(dks.unsqueeze(-2))
            if need_v:
                dv = phi_k @ dkv
        return dq, dk, dv


def linear_products(phi_q: torch.Tensor, phi_k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(num (..., N_q, d), den (..., N_q), kv (..., m, d)) of unmasked linear attention
    (choromanski22 Eq. 3): kv = phi_k^T v, num = phi_q kv, den = phi_q (phi_k^T 1), O(N m d).
    phi_q and phi_k with the same leading dims, v with phi_k's (unchecked); under autograd
    through ``_LinearProducts``.

    >>> import torch
    >>> from fast.algebra import linear_products
    >>> g = torch.Generator().manual_seed(0)
    >>> pq, pk, v = (torch.rand(5, 3, generator=g) for _ in range(3))
    >>> num, den, kv = linear_products(pq, pk, v)
    >>> a = pq @ pk.T                                  # the dense (N_q, N) kernel
    >>> torch.allclose(num, a @ v), torch.allclose(den, a.sum(-1)), tuple(kv.shape)
    (True, True, (3, 3))
    """
    if torch.is_grad_enabled() and (phi_q.requires_grad or phi_k.requires_grad or v.requires_grad):
        return _LinearProducts.apply(phi_q, phi_k, v)
    kv = phi_k.transpose(-1, -2) @ v
    return phi_q @ kv, rows_dot(phi_q, phi_k.sum(dim=-2)), kv


def blocked_numerator(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                      matmul: Callable[[torch.Tensor], torch.Tensor], features_per_block: int) -> torch.Tensor:
    """Algorithm 1's numerator phi_q_i^T devec(D1_i), D1 = M [vec(phi_k_j v_j^T)], in feature blocks.

    phi_q, phi_k: (..., N, m); v: (..., N, d); matmul(x) = M @ x for x (..., N, c). Each block
    pushes ``features_per_block * d`` columns through the mask at once and contracts them with
    phi_q immediately, so the O(N m d) matrix D1 never exists whole: O((T_M(N) + N) m d) time,
    O(N (m + d) + N block) extra memory. Plain autograd through this loop keeps every block:
    use ``masked_products`` when gradients are needed.

    >>> import torch
    >>> from fast.algebra import blocked_numerator
    >>> g = torch.Generator().manual_seed(0)
    >>> pq, pk, v = torch.rand(6, 4, generator=g), torch.rand(6, 4, generator=g), torch.rand(6, 2, generator=g)
    >>> m = torch.ones(6, 6).tril()                    # a causal mask
    >>> num = blocked_numerator(pq, pk, v, lambda x: m @ x, features_per_block=3)
    >>> torch.allclose(num, (m * (pq @ pk.T)) @ v)
    True
    """
    m = phi_k.shape[-1]
    num = torch.zeros_like(v)
    for a in range(0, m, features_per_block):
        num = num + _block(phi_q, phi_k, v, matmul, a, min(m, a + features_per_block))[2]
    return num


# ----------------------------------------------------------------- which tensors get gradients


# Autograd nodes are compared by id() of their Python wrappers. Before torch 2.12 a wrapper died
# with its last Python reference and the next wrapper made could take its address (PyTorch PR
# #181390 made wrappers live as long as the node), so every wrapper whose id is compared is held
# in ``held`` until the comparison is over: on torch 2.11 a freed id once matched a node of
# phi(P)'s own graph, both low-rank factors were dropped and their gradient came back 0.


def _targets(tensors: Sequence[torch.Tensor], held: list) -> tuple[set[int], set[int]]:
    """(ids of the grad_fn nodes of the non-leaf tensors, ids of the leaf tensors); the nodes are
    appended to ``held`` so their ids stay theirs."""
    nodes = [t.grad_fn for t in tensors if t.grad_fn is not None]
    held.extend(nodes)
    fns = {id(node) for node in nodes}
    leaves = {id(t) for t in tensors if t.grad_fn is None}
    return fns, leaves


def _hits(node, fns: set[int], leaves: set[int]) -> bool:
    return id(node) in fns or (hasattr(node, "variable") and id(node.variable) in leaves)


def _walk(start_nodes, fns: set[int], leaves: set[int], held: list) -> tuple[bool, list[torch.Tensor], set[int]]:
    """Walk the autograd graph from start_nodes, not past target nodes: (hit a target, leaves
    requiring grad that were reached without passing a target, ids of the non-target nodes passed).
    Every node visited is appended to ``held`` (its id is compared later)."""
    stack, seen, hit, free, passed = list(start_nodes), set(), False, [], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        held.append(node)
        seen.add(id(node))
        if _hits(node, fns, leaves):
            hit = True
            continue
        passed.add(id(node))
        if hasattr(node, "variable"):  # AccumulateGrad of a leaf that is not a target
            free.append(node.variable)
            continue
        stack.extend(nxt for nxt, _ in node.next_functions)
    return hit, free, passed


def _discard(t: torch.Tensor) -> None:
    return None


def _unreachable(_: object) -> torch.Tensor:  # pragma: no cover - the probe is never backpropagated
    raise RuntimeError("the parameter probe's graph is not differentiated")


def _requiring_grad(items: object) -> list[torch.Tensor]:
    """The distinct tensors requiring grad among ``items`` (an operator's parameters(): an
    nn.Module's include frozen ones; anything that is not a tensor is dropped)."""
    out: dict[int, torch.Tensor] = {}
    for t in items:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            out.setdefault(id(t), t)
    return list(out.values())


def gradient_inputs(op: MaskOperator, like: torch.Tensor) -> tuple[list[torch.Tensor], bool]:
    """(the tensors whose gradients the recomputing backward returns for mask ``op``, retain).

    The tensors requiring grad in ``op.parameters()``, each once, less any computed from another of
    them (its gradient reaches that one through autograd's graph). Two one-column probes
    M @ like[..., :1] check that every tensor requiring grad the product depends on is among them
    (else its gradient would be lost: ValueError naming ``mask.parameters()``). ``retain`` is True
    when the products reach them through graph nodes made before the product (parameters() lists b,
    matmul reads exp(b)): backward then keeps that graph between blocks. ([], False) when grad mode
    is off. Cost: two one-column products, O(T_M(N)).

    >>> import torch
    >>> from fast.algebra import gradient_inputs
    >>> from fast.masks.explicit import DenseMask
    >>> w = torch.ones(3, 3, requires_grad=True)       # a learnable dense mask
    >>> params, retain = gradient_inputs(DenseMask(w), torch.ones(3, 2))
    >>> [p is w for p in params], retain
    ([True], False)
    """
    if not torch.is_grad_enabled():
        return [], False
    declared = _requiring_grad(op.parameters())
    kept = []
    held: list = []  # every autograd node whose id is compared, alive until the comparisons end
    for i, p in enumerate(declared):
        others = declared[:i] + declared[i + 1:]
        if p.grad_fn is not None and others and _walk([n for n, _ in p.grad_fn.next_functions],
                                                      *_targets(others, held), held)[0]:
            continue
        kept.append(p)
    probes, walks = [], []
    for _ in range(2):
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_discard, _unreachable):
            probe = op.matmul_unscaled(like[..., :1].detach())
        if not probe.requires_grad:
            return kept, False
        probes.append(probe)  # alive until both walks are done: node ids are not reused
        walks.append(_walk([probe.grad_fn], *_targets(kept, held), held))
    _, free, nodes = walks[0]
    if free:
        t = free[0]
        raise ValueError(
            f"mask.matmul depends on a tensor requiring grad (shape {tuple(t.shape)}, {t.dtype}) that "
            f"mask.parameters() does not return (mask is {op.type_name}): list it, or the tensor "
            "computed from it that matmul reads, in parameters(), so the memory-saving backward "
            "can return its gradient")
    return kept, bool(nodes & walks[1][2])


# -------------------------------------------------------------------- the autograd Function


def _leaf(t: torch.Tensor, need: bool) -> torch.Tensor:
    return t.detach().requires_grad_(need)


class _MaskedProducts(torch.autograd.Function):
    """(num, den) of Algorithm 1 for mask ``op``; saves phi_q, phi_k, v and recomputes in backward.

    The operator and its parameters are referenced, not saved (they live with the mask anyway);
    an in-place change of a parameter between forward and backward is refused.
    """

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, op, fpb, retain, *params):
        matmul = op.matmul_unscaled
        den = (phi_q * matmul(phi_k)).sum(-1)
        num = blocked_numerator(phi_q, phi_k, v, matmul, fpb)
        ctx.save_for_backward(phi_q, phi_k, v)
        ctx.op, ctx.fpb, ctx.params, ctx.retain = op, fpb, params, retain
        ctx.versions = [p._version for p in params]
        return num, den

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v = ctx.saved_tensors
        op, fpb, params = ctx.op, ctx.fpb, ctx.params
        if [p._version for p in params] != ctx.versions:
            raise RuntimeError(f"a parameter of the mask ({op.type_name}) was modified in place between "
                               "forward and backward; the recomputing backward would use the new values")
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_p = list(ctx.needs_input_grad[6:])
        create = torch.is_grad_enabled()  # double backward: keep the saved tensors attached
        if not any(need_p) and not create and op.has_rmatmul:
            with torch.no_grad():
                return (*_adjoint_backward(phi_q, phi_k, v, g_num, g_den, op, fpb, need_q, need_k, need_v),
                        None, None, None, *[None] * len(params))
        if not create:
            phi_q, phi_k, v = _leaf(phi_q, need_q), _leaf(phi_k, need_k), _leaf(v, need_v)
        matmul = op.matmul_unscaled
        m = phi_k.shape[-1]
        grad_p: list = [None] * len(params)
        wanted_p = [p for p, need in zip(params, need_p) if need]

        def grads(out, g, tensors):
            live = [t for t in tensors if t is not None]
            if not out.requires_grad:  # the product reaches none of them (a 1-node hypercube's M ignores lam)
                return [None] * len(tensors)
            # each block's graph is fresh and differentiated once: kept only if it reaches older nodes
            got = iter(torch.autograd.grad(out, live, g, retain_graph=ctx.retain or create, create_graph=create,
                                           allow_unused=True))
            return [next(got) if t is not None else None for t in tensors]

        def add(acc, g):
            return g if acc is None else (acc if g is None else acc + g)

        def accumulate_params(got):
            it = iter(got)
            for i, need in enumerate(need_p):
                if need:
                    grad_p[i] = add(grad_p[i], next(it))

        with torch.enable_grad():
            # denominator: den = sum_feature phi_q * (M phi_k)
            den = (phi_q * matmul(phi_k)).sum(-1)
            gq, gk, *gp = grads(den, g_den, [phi_q if need_q else None, phi_k if need_k else None, *wanted_p])
            accumulate_params(gp)
            del den
            gq_blocks, gk_blocks, gv = [], [], None
            for a in range(0, m, fpb):  # numerator: one feature block at a time, as in forward
                b = min(m, a + fpb)
                pq_b, pk_b, contrib = _block(phi_q, phi_k, v, matmul, a, b)
                bq, bk, bv, *bp = grads(contrib, g_num, [pq_b if need_q else None, pk_b if need_k else None,
                                                          v if need_v else None, *wanted_p])
                del contrib  # this block's graph goes before the next one is built
                if need_q:
                    gq_blocks.append(bq if bq is not None else torch.zeros_like(pq_b))
                if need_k:
                    gk_blocks.append(bk if bk is not None else torch.zeros_like(pk_b))
                gv = add(gv, bv)
                accumulate_params(bp)
        gq = add(gq, torch.cat(gq_blocks, dim=-1)) if need_q else None
        gk = add(gk, torch.cat(gk_blocks, dim=-1)) if need_k else None
        return (gq, gk, gv if need_v else None, None, None, None, *grad_p)


def _adjoint_backward(phi_q, phi_k, v, g_num, g_den, op, fpb: int, need_q: bool, need_k: bool, need_v: bool):
    """Gradients of (num, den) w.r.t. phi_q, phi_k, v with M @ x and M^T @ x, no autograd graph.

    den_i = phi_q_i . (M phi_k)_i:  d phi_q += g_den * (M phi_k),  d phi_k += M^T (g_den * phi_q).
    num = sum over features a of phi_q[:, a] * (M C_a), C_a = phi_k[:, a] v (N x d): per block,
    d phi_q[:, a] = <g_num, M C_a> (rows), and with H_a = M^T (phi_q[:, a] g_num),
    d phi_k[:, a] = <H_a, v> (rows), d v = sum_a phi_k[:, a] H_a. One pass of M for d phi_q and
    one of M^T for d phi_k, d v per block; memory one block, as in forward.
    """
    m, d = phi_k.shape[-1], v.shape[-1]
    gq = gk = gv = None
    if need_q:
        gq = g_den.unsqueeze(-1) * op.matmul_unscaled(phi_k)
    if need_k:
        gk = op.rmatmul_unscaled(g_den.unsqueeze(-1) * phi_q)
    gq_blocks, gk_blocks = [], []
    for a in range(0, m, fpb):
        b = min(m, a + fpb)
        pq_b, pk_b = phi_q[..., a:b], phi_k[..., a:b]
        if need_q:
            cols = (pk_b[..., None] * v[..., None, :]).flatten(-2)
            mixed = op.matmul_unscaled(cols).unflatten(-1, (b - a, d))
            del cols
            gq_blocks.append(torch.einsum("...nd,...nkd->...nk", g_num, mixed))
            del mixed
        if need_k or need_v:
            h = op.rmatmul_unscaled((pq_b[..., None] * g_num[..., None, :]).flatten(-2))
            h = h.unflatten(-1, (b - a, d))
            if need_k:
                gk_blocks.append(torch.einsum("...nkd,...nd->...nk", h, v))
            if need_v:
                part = torch.einsum("...nkd,...nk->...nd", h, pk_b)
                gv = part if gv is None else gv + part
            del h
    # leading dims of the mask may broadcast beyond the inputs': sum the gradients back
    if need_q:
        gq = (gq + torch.cat(gq_blocks, dim=-1)).sum_to_size(phi_q.shape)
    if need_k:
        gk = (gk + torch.cat(gk_blocks, dim=-1)).sum_to_size(phi_k.shape)
    if need_v:
        gv = gv.sum_to_size(v.shape)
    return gq, gk, gv


def _block(phi_q, phi_k, v, matmul, a: int, b: int):
    """(phi_q[..., a:b], phi_k[..., a:b], the block's share of the numerator) under the current grad
    mode. The block's columns are local: only what autograd saves of them outlives the call."""
    pq_b, pk_b = phi_q[..., a:b], phi_k[..., a:b]
    cols = (pk_b[..., None] * v[..., None, :]).flatten(-2)  # (..., N, (b-a) d)
    mixed = matmul(cols).unflatten(-1, (b - a, v.shape[-1]))
    return pq_b, pk_b, torch.einsum("...nk,...nkd->...nd", pq_b, mixed)


def masked_products(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, op: MaskOperator,
                    fpb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(num (..., N, d), den (..., N)) of Algorithm 1 through op.matmul, with linear training memory.

    phi_q, phi_k: (..., N, m); v: (..., N, d), one compute dtype; ``fpb`` features per block.
    num = phi_q_i^T devec(D1_i) by ``blocked_numerator``, den = phi_q_i^T (M phi_k)_i. Under autograd
    only phi_q, phi_k, v are saved and backward recomputes the blocks, one at a time (with the mask's
    ``rmatmul``, plain passes of M and M^T; docs/papers.md, "fast.algebra"); gradients reach phi_q,
    phi_k, v and ``gradient_inputs(op, phi_k)``. ``op``: a MaskOperator or a duck-typed one (wrapped
    once; TypeError / ValueError naming ``mask`` otherwise). O((T_M(N) + N) m d) (choromanski22
    Lemma 3.1), forward and backward.

    >>> import torch
    >>> from fast.algebra import masked_products
    >>> from fast.masks.explicit import DenseMask
    >>> g = torch.Generator().manual_seed(0)
    >>> pq, pk, v = torch.rand(6, 4, generator=g), torch.rand(6, 4, generator=g), torch.rand(6, 2, generator=g)
    >>> m = torch.ones(6, 6).tril()
    >>> num, den = masked_products(pq, pk, v, DenseMask(m), 2)
    >>> a = m * (pq @ pk.T)                            # Algorithm 1 = Eq. 2 with the kernel phi_q phi_k^T
    >>> torch.allclose(num, a @ v), torch.allclose(den, a.sum(-1))
    (True, True)
    """
    op = as_operator(op)
    params, retain = gradient_inputs(op, phi_k)
    return _MaskedProducts.apply(phi_q, phi_k, v, op, fpb, retain, *params)
