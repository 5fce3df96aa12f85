"""Sequence-sharded masked linear attention and FAVOR+ (choromanski22 Algorithm 1 across ranks).

Rank r of W holds the contiguous rows [start_r, stop_r) of phi_q, phi_k and v along N
(``shard_bounds``), all leading (batch, head) dims, and gets its own output rows. The right-product
trick makes the keys enter only through the m x (d + 1) state [S | z] = phi_k^T [v | 1], a sum over
keys, so the ranks exchange states, never rows (LASP's observation, in our own words):

- mask None / PaddingMask: one all-reduce (sum) of each rank's state (padded keys zeroed);
  num_i | den_i = phi_q_i^T [S | z]. O(n_r m d) work, O(H m d) bytes per rank whatever N.
- CausalMask: each rank's total state, one all-gather, the exclusive prefix P_r = sum_{r' < r}
  of the totals, then the local chunked scan (fast.CausalMask.attend) plus phi_q_i^T P_r: the
  prefix enters linearly. O(W H m d) bytes per rank.
- packing, given as the segment ids (n_local,) with global labels (a segment may cross a rank
  boundary; fast.PackingMask relabels its ids locally, so the ids themselves are passed): one state per
  global segment, summed by one all-reduce: O(S H m d) bytes per rank for S segments in the whole
  sequence (every segment is exchanged, not only those that cross a boundary: simpler, one
  collective, and still independent of N at a fixed number of segments). The labels are agreed
  by two small all-gathers (the count and the labels of each rank's segments).

FAVOR+ (``sharded_favor_attention``) forms the stabilised features with global constants: an
all-reduce max of the keys' exponents per (batch, head) slice (per segment for packing), and, for
causal, the running maximum over the ranks before (one all-gather of each rank's maximum), so the
prefix of the ranks before is rescaled by exp(C_{<r} - c_i) <= 1 and nothing overflows. Without a
mask it forms the features a block of rows at a time, as fast.favor_attention does
(fast.favor_blockwise.favor_key_state / favor_query_products): each rank's state under its own
constant C_r, one all-reduce max (C, with the largest norm term riding along), the state rescaled
by exp(C_r - C) <= 1, then the one all-reduce sum.

Backward runs through the same collectives (fast.distributed.collectives): an all-reduced
state's gradient is all-reduced, the all-gathered totals' gradient is the sum over later ranks
(a reverse prefix). Before any collective whose size depends on the arguments, the ranks compare a
small descriptor (one all-gather): a rank whose arguments are refused raises its own error and the
others raise a ValueError naming it, rather than hanging.
"""
from __future__ import annotations

import torch

from fast.algebra import divide, guard_flag
from fast.batching import check_batch
from fast.distributed.arguments import agreed, check_finite, check_slices, with_ones, work_dtype
from fast.distributed.collectives import all_gather_stack, all_reduce_max, all_reduce_sum, dtype_code
from fast.favor_blockwise import favor_key_state, favor_query_products
from fast.features import favor_exponentials
from fast.masks.sequence import CausalMask, PackingMask, PaddingMask
from fast.validation import FLOAT_DTYPES, check_no_key, raise_if_non_finite

__all__ = ["shard_bounds", "sharded_linear_attention", "sharded_favor_attention"]

_NONE, _CAUSAL, _PACKING, _PADDING = 0, 1, 2, 3


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous rows [start, stop) of N = n that ``rank`` of ``world`` holds: near-equal
    slices, the first n % world ranks one row more (a rank may hold none when n < world). O(1).
    ValueError naming the argument unless 0 <= n, 0 <= rank < world.

    >>> from fast.distributed import shard_bounds
    >>> [shard_bounds(10, r, 4) for r in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    for name, value in (("n", n), ("rank", rank), ("world", world)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world) = [0, {world}), got {rank}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _mask_kind(mask: object, n: int) -> tuple[int, list[int]]:
    """(kind, descriptor of the mask's shape) for the masks a sharded driver accepts."""
    if mask is None:
        return _NONE, []
    if isinstance(mask, str) and mask == "causal":
        return _CAUSAL, []
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        if mask.dim() < 1 or mask.shape[-1] != n:
            raise ValueError(f"mask (a key mask) must have shape (..., n_local) with n_local = {n}, got "
                             f"{tuple(mask.shape)}")
        return _PADDING, [mask.dim(), *mask.shape[:-1]]
    if isinstance(mask, CausalMask):
        if mask.n != n:
            raise ValueError(f"mask must be CausalMask(n_local) = CausalMask({n}) (causal over the whole sharded "
                             f"sequence), got CausalMask({mask.n})")
        return _CAUSAL, []
    if isinstance(mask, PackingMask):
        # PackingMask relabels its ids to 0..S_local-1 and keeps no labels, so two ranks could not
        # tell which of their segments are the same one
        raise TypeError("sharded packing needs the global segment labels, which PackingMask does not keep: pass "
                        "mask=local_segment_ids itself (an integer tensor (n_local,), the same label on two ranks "
                        "meaning one segment)")
    if isinstance(mask, torch.Tensor) and not mask.dtype.is_floating_point and mask.dtype != torch.bool:
        if mask.dim() != 1 or mask.shape[0] != n:
            raise ValueError(f"mask (segment ids) must have shape (n_local,) = ({n},) (one packing for every "
                             f"(batch, head) slice), got {tuple(mask.shape)}")
        return _PACKING, []
    if isinstance(mask, PaddingMask):
        if mask.key_mask.shape[-1] != n:
            raise ValueError(f"mask must be PaddingMask(local_key_mask) with n_local = {n} entries on its last axis, "
                             f"got key_mask of shape {tuple(mask.key_mask.shape)}")
        return _PADDING, [mask.key_mask.dim(), *mask.key_mask.shape[:-1]]
    raise TypeError(f"mask must be None, \"causal\" or CausalMask(n_local), an integer tensor of segment ids "
                    f"(n_local,), a bool key mask (..., n_local) or "
                    f"PaddingMask(local_key_mask) for sharded attention, got {type(mask).__name__}")


def _global_segments(ids: torch.Tensor, group: object, function: str) -> tuple[torch.Tensor, int]:
    """(index (n,) into the sorted global labels, S): the labels of every rank's segments, agreed by
    an all-gather of the counts and one of the (padded) label lists."""
    local = torch.unique(ids)
    count = all_gather_stack(torch.tensor([local.numel()], device=ids.device), group, function)[:, 0]
    width = max(1, int(count.max()))
    padded = torch.zeros(width, dtype=local.dtype, device=ids.device)
    padded[:local.numel()] = local
    table = all_gather_stack(padded, group, function)  # (W, width)
    valid = torch.arange(width, device=ids.device)[None, :] < count[:, None]
    labels = torch.unique(table[valid])
    return torch.searchsorted(labels, ids), labels.numel()


def _segment_plan(index: torch.Tensor, segments: int):
    """(order, inverse order, BatchIndex) of the tokens sorted by segment (stable), or None for n = 0."""
    n = index.numel()
    if n == 0:
        return None
    order = torch.argsort(index, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(n, device=order.device)
    return order, inverse, check_batch(index[order], n, num_graphs=segments)


def _packed_products(pq: torch.Tensor, pk: torch.Tensor, v1: torch.Tensor, plan, segments: int,
                     group: object, function: str) -> torch.Tensor:
    """[num | den] (..., n, d + 1) with one state per global segment, summed over the ranks."""
    lead, m, c = pk.shape[:-2], pk.shape[-1], v1.shape[-1]
    if plan is None:
        state = pk.new_zeros(*lead, segments, m, c) + 0 * pk.sum() + 0 * v1.sum()  # keeps the graph for backward
    else:
        order, _, bi = plan
        state = bi.segment_outer(pk[..., order, :], v1[..., order, :])
    state = all_reduce_sum(state, group, function)
    if plan is None:
        return pq.new_zeros(*lead, 0, c) + 0 * state.sum()
    order, inverse, bi = plan
    return bi.apply_state(pq[..., order, :], state)[..., inverse, :]


def _products(pq: torch.Tensor, pk: torch.Tensor, v: torch.Tensor, mask: object, kind: int, rank: int,
              group: object, function: str, key_scale=None) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(num, den, no_key rows or None) on this rank's rows. key_scale (causal FAVOR+ only): the
    per-key constants c (..., n) of phi_k = exp(z - c) and the exclusive running max C (...) of the
    ranks before."""
    v1 = with_ones(v)
    no_key = None
    if kind in (_NONE, _PADDING):
        if kind == _PADDING:
            key_mask = mask.key_mask if isinstance(mask, PaddingMask) else mask
            keep = key_mask.to(pk.device).unsqueeze(-1)  # (..., n, 1)
            pk, v1 = torch.where(keep, pk, torch.zeros_like(pk)), torch.where(keep, v1, torch.zeros_like(v1))
        state = pk.transpose(-1, -2) @ v1  # (..., m, d + 1)
        if kind == _PADDING:  # the real keys per sample ride along as one more row: [count, 0, ...]
            count = key_mask.to(pk.device).sum(-1).to(state.dtype).expand(state.shape[:-2])
            row = torch.zeros_like(state[..., :1, :])
            row[..., 0, 0] = count
            state = torch.cat([state, row], dim=-2)
        state = all_reduce_sum(state, group, function)
        if kind == _PADDING:
            seen = state[..., -1, 0].detach()
            state = state[..., :-1, :]
            no_key = lambda: (seen == 0).unsqueeze(-1).expand(pq.shape[:-1])  # noqa: E731
        nd = pq @ state
    elif kind == _PACKING:
        index, segments = _global_segments(mask.to(pk.device), group, function)
        nd = _packed_products(pq, pk, v1, _segment_plan(index, segments), segments, group, function)
    else:  # causal
        n = pk.shape[-2]
        if key_scale is None:
            total = pk.transpose(-1, -2) @ v1
        else:  # the rank's total in the scale of its last constant: exp(z_j - c_last) <= 1
            c, before = key_scale[0], key_scale[1]
            last = c[..., -1:] if n else before.unsqueeze(-1)
            total = (pk * torch.exp(c - last).unsqueeze(-1)).transpose(-1, -2) @ v1
        totals = all_gather_stack(total, group, function)  # (W, ..., m, d + 1)
        if key_scale is None:
            prefix = totals[:rank].sum(0)
        else:  # rank r' < r's total is in the scale C_{<=r'} <= C_{<r}: factors <= 1 (0 for empty ranks)
            before, running = key_scale[1], key_scale[2]  # (W, ...): C_{<=r'} per rank
            factor = torch.where(torch.isfinite(running[:rank]), torch.exp(running[:rank] - before),
                                 torch.zeros_like(running[:rank]))
            prefix = (totals[:rank] * factor[..., None, None]).sum(0)
        if n == 0:
            return pq.new_zeros(*pq.shape[:-1], v.shape[-1]) + 0 * prefix.sum(), pq.new_zeros(pq.shape[:-1]), None
        if key_scale is None:
            num, den = CausalMask(n).attend(pq, pk, v)
            nd = torch.cat([num, den.unsqueeze(-1)], -1) + pq @ prefix
        else:
            c, before = key_scale[0], key_scale[1]
            num, den = CausalMask(n).attend(pq, pk, v, key_log_scale=c.unsqueeze(-1))
            # attend's result is the true one times exp(-c_i) (c nondecreasing); the prefix's is
            # times exp(-C_{<r}): rescale it by exp(C_{<r} - c_i) <= 1
            back = torch.where(torch.isfinite(before).unsqueeze(-1), torch.exp(before.unsqueeze(-1) - c),
                               torch.zeros_like(c))
            nd = torch.cat([num, den.unsqueeze(-1)], -1) + (pq @ prefix) * back.unsqueeze(-1)
    return nd[..., :-1], nd[..., -1], no_key


def _favor_blockwise_products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, half: float,
                              group: object, function: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(num, den) of unmasked FAVOR+ on this rank's rows, the features formed a block of rows at a time
    as fast.favor_attention does (fast.favor_blockwise), or None where a key's norm term or the summed
    state is not finite (every rank sees the same all-reduced values, so all return None together and
    take the whole-tensor path, whose features handle those cases). The rank's state comes under its
    own constant C_r; one all-reduce max (with the largest norm term riding along) gives C, each state
    is rescaled by exp(C_r - C) <= 1 (0 for a rank without keys) and one all-reduce sums [S | z]."""
    s, z, c, n_max = favor_key_state(k, v, w, half)
    local = torch.cat([c.reshape(-1), n_max.reshape(1).to(c.dtype)])
    top = all_reduce_max(local, group, function)
    if not bool(torch.isfinite(top[-1])):
        return None
    c_all = top[:-1].view(c.shape)
    factor = torch.where(torch.isfinite(c), torch.exp(c - c_all), torch.zeros_like(c)).to(s.dtype)  # (..., 1, 1)
    sz = all_reduce_sum(torch.cat([s, z.unsqueeze(-1)], -1) * factor, group, function)  # (..., m, d + 1)
    if not bool(torch.isfinite(sz).all()):
        return None
    return favor_query_products(q, w, sz[..., :-1], sz[..., -1])


def sharded_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, mask: object = None, *,
                             group: object = None, no_key: str = "raise") -> torch.Tensor:
    """This rank's rows of fast.masked_linear_attention(phi_q, phi_k, v, mask) on the whole sharded
    sequence (choromanski22 Algorithm 1; module doc for the collectives).

        out_i = phi_q_i^T sum_j M_ij phi_k_j v_j^T / phi_q_i^T sum_j M_ij phi_k_j,  j over every rank's keys

    phi_q, phi_k: (..., n_local, m); v: (..., n_local, d), this rank's contiguous slice (shard_bounds),
    the same leading dims and widths on every rank (n_local may differ, or be 0) -> (..., n_local, d).
    mask: None; "causal" or CausalMask(n_local) (causal over the whole sequence; the string also
    serves a rank with n_local = 0, for which no CausalMask exists); the segment ids themselves, an
    integer tensor (n_local,) of global labels, for packing (fast.PackingMask's meaning; the same
    label on two ranks is one segment: a PackingMask is refused, as it keeps no labels); or
    PaddingMask(local_key_mask) or the bool key mask (..., n_local) itself (fast.PaddingMask's meaning).
    Every rank must pass the same kind of mask. group: a torch.distributed group (None: WORLD). no_key as in
    masked_linear_attention (a sample with no real key on any rank). Features are expected to be
    nonnegative (the denominators are guarded against zero, subnormal and non-finite values, not
    against the cancellation of signed features). Work O(n_local m d); bytes per rank: O(H m d)
    (None, padding), O(W H m d) (causal), O(S H m d) (packing, S segments).

    Raises RuntimeError (torch.distributed not initialised: says what to call), TypeError /
    ValueError naming the argument (on the rank that passed it; the other ranks raise ValueError
    naming that rank), DenominatorError as masked_linear_attention.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import CausalMask, masked_linear_attention
    >>> from fast.distributed import sharded_linear_attention
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> pq, pk, v = torch.rand(3, 6, 2, dtype=torch.float64).unbind(0)
    >>> out = sharded_linear_attention(pq, pk, v, CausalMask(6))   # one rank: the whole sequence
    >>> bool(torch.allclose(out, masked_linear_attention(pq, pk, v, CausalMask(6))))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_linear_attention"

    def validate():
        check_slices(("phi_q", "phi_k", "v"), phi_q, phi_k, v)
        check_no_key(no_key)
        kind, mask_shape = _mask_kind(mask, phi_q.shape[-2])
        check_finite(phi_q=phi_q, phi_k=phi_k, v=v)
        lead = list(phi_q.shape[:-2])
        return phi_q.shape[-2], [kind, len(lead), *lead, phi_q.shape[-1], v.shape[-1],
                                 dtype_code(work_dtype(phi_q, phi_k, v)), *mask_shape]

    rank, _, _ = agreed(function, group, phi_q, validate)
    kind = _mask_kind(mask, phi_q.shape[-2])[0]
    work = work_dtype(phi_q, phi_k, v)
    pq, pk, vv = phi_q.to(work), phi_k.to(work), v.to(work)
    num, den, rows = _products(pq, pk, vv, mask, kind, rank, group, function)
    return divide(num, den, no_key=rows, policy=no_key).to(v.dtype)


def sharded_favor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor,
                            mask: object = None, *, group: object = None, no_key: str = "raise") -> torch.Tensor:
    """This rank's rows of fast.favor_attention(q, k, v, projection, mask) on the whole sharded
    sequence, to round-off (Performer FAVOR+; choromanski22 Algorithm 1).

    Features exp(w_f . x - |x|^2 / 2 - c) of x = q d_qk^(-1/4) (Performer Lemma 1; the 1 / sqrt(m)
    and the per-query constants cancel). The keys' constant c is global: an all-reduce max of the
    exponents per (batch, head) slice (mask None or padding), per global segment (packing), or for
    causal c_j = max(C_{<r}, running max of this rank's rows up to j), C_{<r} the maximum over the
    ranks before (one all-gather of every rank's maximum), so every factor exp(. - c) <= 1.
    q, k: (..., n_local, d_qk); v: (..., n_local, d); projection (m, d_qk), the same on every rank
    -> (..., n_local, d). mask, group, no_key and the communication as sharded_linear_attention
    (plus O(H) bytes of maxima, O(W H) for causal).

    Raises as sharded_linear_attention (names q, k, v or projection).

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import favor_attention, gaussian_projection
    >>> from fast.distributed import sharded_favor_attention
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> q, k, v = torch.randn(3, 6, 4, dtype=torch.float64).unbind(0)
    >>> w = gaussian_projection(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> bool(torch.allclose(sharded_favor_attention(q, k, v, w), favor_attention(q, k, v, w)))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_favor_attention"

    def validate():
        check_slices(("q", "k", "v"), q, k, v)
        if not isinstance(projection, torch.Tensor) or projection.dtype not in FLOAT_DTYPES or projection.dim() != 2 \
                or projection.shape[1] != q.shape[-1] or projection.shape[0] < 1:
            got = tuple(projection.shape) if isinstance(projection, torch.Tensor) else type(projection).__name__
            raise ValueError(f"projection must be a floating (m, d_qk) tensor with d_qk = {q.shape[-1]}, m >= 1, got "
                             f"{got}")
        check_no_key(no_key)
        kind, mask_shape = _mask_kind(mask, q.shape[-2])
        check_finite(q=q, k=k, v=v, projection=projection)
        lead = list(q.shape[:-2])
        return q.shape[-2], [kind, len(lead), *lead, q.shape[-1], *projection.shape, v.shape[-1],
                             dtype_code(work_dtype(q, k, v)), *mask_shape]

    rank, _, _ = agreed(function, group, q, validate)
    kind = _mask_kind(mask, q.shape[-2])[0]
    work = work_dtype(q, k, v)
    d = projection.shape[1]
    w = projection.to(work) * d ** -0.25
    half = 0.5 * d ** -0.5
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    lead, n = kw.shape[:-2], kw.shape[-2]
    if kind == _NONE:
        nd = _favor_blockwise_products(qw, kw, vw, w, half, group, function)
        if nd is not None:
            num, den = nd
            if not num.requires_grad and bool(guard_flag(den, None)):  # in place: no second (n, d) tensor
                return num.div_(den.unsqueeze(-1)).to(v.dtype)
            return divide(num, den, policy=no_key).to(v.dtype)
    state: dict = {}

    def constants(z: torch.Tensor) -> torch.Tensor:  # z (..., n, m), detached
        rows = z.amax(-1) if n else z.new_full((*lead, 0), -torch.inf)  # (..., n)
        if kind == _CAUSAL:
            local = rows.amax(-1) if n else z.new_full(lead, -torch.inf)
            every = all_gather_stack(local, group, function)  # (W, ...)
            running = torch.cummax(every, dim=0).values  # C_{<=r'}
            before = running[rank - 1] if rank else z.new_full(lead, -torch.inf)
            c = torch.cummax(torch.maximum(rows, before.unsqueeze(-1)), dim=-1).values if n else rows
            state["scale"] = (c, before, running)
            return c.unsqueeze(-1)
        if kind == _PACKING:
            index, segments = _global_segments(mask.to(z.device), group, function)
            plan = _segment_plan(index, segments)
            state["plan"] = (plan, segments)
            local = rows.new_full((*lead, segments, 1), -torch.inf) if plan is None else \
                plan[2].segment_max(rows[..., plan[0]].unsqueeze(-1))  # (..., S, 1)
            top = all_reduce_max(local, group, function)
            return top[..., index, :] if n else z.new_zeros(*lead, 0, 1)
        local = rows.amax(-1) if n else z.new_full(lead, -torch.inf)
        return all_reduce_max(local, group, function)[..., None, None]

    phi_q = favor_exponentials(qw, w, half, is_query=True, query_norm=False)[0]
    phi_k = favor_exponentials(kw, w, half, is_query=False, key_stabilizer=constants)[0]
    if kind == _PACKING:
        plan, segments = state["plan"]
        nd = _packed_products(phi_q, phi_k, with_ones(vw), plan, segments, group, function)
        num, den, rows = nd[..., :-1], nd[..., -1], None
    else:
        num, den, rows = _products(phi_q, phi_k, vw, mask, kind, rank, group, function, state.get("scale"))
    return divide(num, den, no_key=rows, policy=no_key).to(v.dtype)
