"""Segment sums with the same bits on every run, on every device: the one place fast/ adds rows
into groups (issue 21; docs/papers.md, "fast.segments", says why and how).

A floating ``index_add_``, ``scatter_add``, ``index_put_(accumulate=True)`` or
``scatter_reduce(reduce="sum")`` adds with atomics on CUDA, in whatever order the threads
arrive, so the same inputs give other bits at every run; so does the backward of
``index_select`` and ``gather``. fast/ calls them on floating data nowhere but in this module's
CPU backend (tests/fast/test_deterministic.py makes them raise and runs the mechanisms on the
CUDA backend):

    Segments(index (P,), S).sum(x (..., P, ...), dim)    -> (..., S, ...)  out_s = sum_{index[p] = s} x_p
    Segments(index (P,), S).expand(y (..., S, ...), dim) -> (..., P, ...)  row p = y[index[p]]
    segment_max(x, index, S, dim), Segments.max          -> (..., S, ...)  -inf for an empty segment
    SortedSegments(index, S).outer(a (..., P, m), b (..., P, d))        -> (..., S, m, d)
    SortedSegments(index, S).apply(x (..., P, m), state (..., S, m, d)) -> (..., P, d)
    IndexAdd(index).add_into / .take, add_into, index_sum   in place into a long-lived tensor; one-off

``sum`` and ``expand`` are each other's backward (twice differentiable), with no atomic add on
CUDA either way. ``backend`` chooses, in one place, index_add_ on CPU (deterministic there) and
torch.segment_reduce over the rows sorted by segment elsewhere (segments longer than
SPLIT_ABOVE rows in two passes). ``few_segments`` is the one "few large vs many small" dispatch
of fast/: up to FEW_SEGMENTS segments, a loop over contiguous slices with one dense op each;
more, vectorised segment operations over row blocks (OUTER_BLOCK_ELEMENTS). Leading dims before
``dim`` are independent copies (a block-diagonal plan), trailing dims columns; half precisions
are summed in float32. Work O(P C) per call after an O(P log P) plan. Host reads: none on CPU;
on CUDA one per plan and device (none with ``from_pointers`` or ``longest`` given).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fast.sparse import row_pointers
from fast.validation import check_positive_int

__all__ = ["IndexAdd", "Segments", "SortedSegments", "add_into", "backend", "few_segments", "index_sum",
           "segment_max", "FEW_SEGMENTS", "OUTER_BLOCK_ELEMENTS", "SPLIT_ABOVE"]

#: On CUDA, segments longer than this many rows are summed in two passes (module doc).
SPLIT_ABOVE = 64
#: Up to this many segments are "few large" ones (``few_segments``): a loop over contiguous slices.
FEW_SEGMENTS = 64
#: SortedSegments.outer and .apply on the many-small side form at most about this many entries of
#: outer products or gathered states at once (2^22: 16 MiB in float32) per block of rows, whatever P.
OUTER_BLOCK_ELEMENTS = 1 << 22
#: Tiled (block-diagonal) plans kept per Segments: the last few leading sizes seen.
_TILES_KEPT = 4


def few_segments(count: int) -> bool:
    """True when ``count`` segments are "few large" ones (count <= FEW_SEGMENTS, read at each call):
    loop over their contiguous slices, one dense op each; False: "many small", vectorised segment
    operations (module doc). The one place fast/ makes this choice. O(1).

        >>> from fast.segments import FEW_SEGMENTS, few_segments
        >>> few_segments(3), few_segments(FEW_SEGMENTS + 1)
        (True, False)
    """
    return count <= FEW_SEGMENTS


def segment_max(x: torch.Tensor, index: torch.Tensor, num_segments: int, dim: int = -2) -> torch.Tensor:
    """Per-segment maxima along ``dim``: x (..., P, ...) -> (..., S, ...), out_s = max over the rows p with
    index[p] = s, -inf for a segment no row maps to. index (..., P) integer, values in [0, S): its last
    axis runs along ``dim`` and its leading axes broadcast against x's axes before ``dim`` (one index
    (P,) for every slice, or one per slice, e.g. a batched (B, 1, P) for x (B, H, P)). One scatter amax
    (exact in any order: deterministic on every device), O(x.numel()); differentiable as torch's
    scatter amax. TypeError for a non-integer index.

        >>> import torch
        >>> from fast.segments import segment_max
        >>> segment_max(torch.tensor([[1.0], [5.0], [2.0]]), torch.tensor([1, 0, 1]), 3, dim=0).flatten().tolist()
        [5.0, 2.0, -inf]
    """
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"index must be an integer tensor of segment ids, got dtype {index.dtype}")
    dim = dim % x.dim()
    idx = index.reshape(*index.shape, *([1] * (x.dim() - 1 - dim))).expand(x.shape)
    out = torch.full((*x.shape[:dim], num_segments, *x.shape[dim + 1:]), -torch.inf, dtype=x.dtype, device=x.device)
    return out.scatter_reduce(dim, idx, x, reduce="amax", include_self=True)


def backend(device: torch.device) -> str:
    """How segment sums are formed on ``device`` (module doc): "index_add" on CPU, "segment_reduce"
    elsewhere. The one place the choice is made (tests patch it to run the CUDA backend on CPU).

        >>> from fast.segments import backend
        >>> backend("cpu"), backend("cuda")
        ('index_add', 'segment_reduce')
    """
    return "index_add" if torch.device(device).type == "cpu" else "segment_reduce"


class Segments:
    """P rows grouped into S segments (module doc). Build once, call ``sum`` and ``expand``.

    index: (P,) integer tensor with values in [0, num_segments) (not checked: the callers build
    it); num_segments: S >= 0 (segments no row maps to sum to 0). ``sorted``: True when the caller
    knows index is nondecreasing (no sort is planned), None when unknown (then sorted once per
    device on CUDA). ``longest``: the longest segment when known (saves the plan's host read on
    CUDA; an upper bound is fine). Attributes: ``index`` (P,) int64, ``num_segments``, ``n`` (P).
    TypeError for a non-integer or non-1-D index, ValueError for a bad num_segments.

        >>> import torch
        >>> from fast.segments import Segments
        >>> seg = Segments(torch.tensor([1, 0, 1]), 2)
        >>> seg.sum(torch.tensor([[1.0], [2.0], [4.0]]), dim=0).flatten().tolist()
        [2.0, 5.0]
        >>> seg.expand(torch.tensor([[2.0], [5.0]]), dim=0).flatten().tolist()
        [5.0, 2.0, 5.0]
    """

    __slots__ = ("index", "num_segments", "n", "_sorted", "_longest", "_plans", "_tiles")

    def __init__(self, index: torch.Tensor, num_segments: int, *, sorted: bool | None = None,
                 longest: int | None = None):
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype.is_floating_point \
                or index.dtype.is_complex or index.dtype == torch.bool:
            raise TypeError(f"index must be a 1-D integer tensor (P,) of segment ids, got {index!r:.80}")
        self.num_segments = check_positive_int("num_segments", num_segments, "an int >= 0", minimum=0)
        self.index = index.to(torch.int64)
        self.n = int(index.numel())
        self._sorted = sorted
        self._longest = longest
        self._plans: dict = {}
        self._tiles: dict = {}

    @classmethod
    def from_pointers(cls, ptr: Sequence[int], device=None) -> "Segments":
        """Contiguous segments given on the host: segment s = rows ptr[s]:ptr[s + 1] (ptr
        nondecreasing, ptr[0] = 0; S = len(ptr) - 1). Plans without any host read."""
        ptr = [int(p) for p in ptr]
        lengths = [b - a for a, b in zip(ptr[:-1], ptr[1:])]
        counts = torch.tensor(lengths, dtype=torch.int64, device=device)
        index = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts, output_size=ptr[-1])
        return cls(index, len(lengths), sorted=True, longest=max(lengths, default=0))

    def __repr__(self) -> str:
        return f"Segments(n={self.n}, num_segments={self.num_segments})"

    # ------------------------------------------------------------------ public products
    def sum(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Segment sums along ``dim``: x (..., P, ...) -> (..., S, ...). Differentiable (backward
        ``expand``); deterministic on every device."""
        dim = self._dim(x, dim, self.n, "x", "P")
        return _SegmentSum.apply(x, self, dim)

    def expand(self, y: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Each row's segment value along ``dim``: y (..., S, ...) -> (..., P, ...), row p =
        y[index[p]]. Differentiable (backward ``sum``); deterministic on every device."""
        dim = self._dim(y, dim, self.num_segments, "y", "S")
        return _SegmentExpand.apply(y, self, dim)

    def max(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Segment maxima along ``dim``: x (..., P, ...) -> (..., S, ...), -inf for an empty segment
        (``segment_max``)."""
        dim = self._dim(x, dim, self.n, "x", "P")
        return segment_max(x, self.index_on(x.device), self.num_segments, dim)

    def _dim(self, x: object, dim: int, size: int, name: str, what: str) -> int:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not -x.dim() <= dim < x.dim() or x.shape[dim] != size:
            raise ValueError(f"{name} must have {what} = {size} entries on axis {dim}, got shape {tuple(x.shape)}")
        return dim % x.dim()

    # ------------------------------------------------------------------ plans
    def index_on(self, device: torch.device) -> torch.Tensor:
        """index on ``device`` (moved once)."""
        key = ("index", str(device))
        if key not in self._plans:
            self._plans[key] = self.index if self.index.device == device else self.index.to(device)
        return self._plans[key]

    def tiled(self, copies: int) -> "Segments":
        """``copies`` independent copies side by side: rows l P + p in segment l S + index[p]
        (the block-diagonal plan of a leading size; cached for the last few sizes)."""
        if copies == 1:
            return self
        tile = self._tiles.pop(copies, None)
        if tile is None:
            offset = torch.arange(copies, device=self.index.device)[:, None]
            index = (self.index[None, :] + self.num_segments * offset).reshape(-1)
            tile = Segments(index, self.num_segments * copies, sorted=self._sorted, longest=self._longest)
        self._tiles[copies] = tile  # most recent last
        while len(self._tiles) > _TILES_KEPT:
            self._tiles.pop(next(iter(self._tiles)))
        return tile

    def _pointers(self, device: torch.device) -> torch.Tensor:
        counts = torch.bincount(self.index_on(device), minlength=self.num_segments)
        ptr = torch.zeros(self.num_segments + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=ptr[1:])  # integer prefix sum: exact
        return ptr

    def _order(self, device: torch.device) -> torch.Tensor | None:
        """Rows in segment order (stable), or None when index is known sorted (no sort)."""
        if self._sorted:
            return None
        return torch.sort(self.index_on(device), stable=True)[1]

    def _device_plan(self, device: torch.device) -> dict:
        key = ("offsets", str(device))
        if key not in self._plans:
            ptr = self._pointers(device)
            longest = self._longest
            if longest is None:
                longest = int((ptr[1:] - ptr[:-1]).max()) if self.num_segments else 0  # the one host read
                self._longest = longest
            plan = {"order": self._order(device), "offsets": ptr, "pieces": None}
            if longest > SPLIT_ABOVE:
                width = math.isqrt(longest - 1) + 1  # ceil(sqrt(longest)): both passes add <= that many rows
                per_segment = (ptr[1:] - ptr[:-1] + width - 1) // width
                piece_ptr = torch.zeros_like(ptr)
                torch.cumsum(per_segment, 0, out=piece_ptr[1:])
                seg = torch.repeat_interleave(torch.arange(self.num_segments, device=device), per_segment)
                rank = torch.arange(seg.numel(), device=device) - piece_ptr[seg]  # piece's rank in its segment
                plan["offsets"] = torch.cat([ptr[seg] + width * rank, ptr[-1:]])
                plan["pieces"] = piece_ptr
            self._plans[key] = plan
        return self._plans[key]

    # ------------------------------------------------------------------ raw products (no autograd)
    def _sum_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """(P, C) -> (S, C), C >= 1, on CUDA (the "segment_reduce" backend of the module doc)."""
        plan = self._device_plan(flat.device)
        rows = flat if plan["order"] is None else flat.index_select(0, plan["order"])
        out = torch.segment_reduce(rows, "sum", offsets=plan["offsets"], axis=0, unsafe=True)
        if plan["pieces"] is not None:
            out = torch.segment_reduce(out, "sum", offsets=plan["pieces"], axis=0, unsafe=True)
        return out

    def _sum(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        lead, rest = x.shape[:dim], x.shape[dim + 1:]
        copies, cols = math.prod(lead), math.prod(rest)
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        if copies == 0 or cols == 0 or self.n == 0:
            return x.new_zeros(*lead, self.num_segments, *rest)
        plan = self.tiled(copies)  # copies side by side: one 2-D sum over (copies P, cols) rows
        flat = x.reshape(copies * self.n, cols).to(work)
        if backend(x.device) == "index_add":  # CPU: rows added in index order (2-D, dim 0: its fast loop)
            # summed into a 2-D view of the result, which is returned itself, not a view: autograd then
            # accumulates a gradient onto it in place (a view returned made it add out of place, with a
            # fresh tensor each time: TreeDiamMask's backward 1.16x slower at N = 2^15)
            out = flat.new_zeros(*lead, self.num_segments, *rest)
            out.view(plan.num_segments, cols).index_add_(0, plan.index_on(x.device), flat)
            return out if work == x.dtype else out.to(x.dtype)
        return plan._sum_rows(flat).to(x.dtype).reshape(*lead, self.num_segments, *rest)


class _SegmentSum(torch.autograd.Function):
    """y = Segments.sum(x) along dim; backward: the gradient expanded to the rows (Segments.expand)."""

    @staticmethod
    def forward(ctx, x, seg, dim):
        ctx.seg, ctx.dim = seg, dim
        return seg._sum(x, dim)

    @staticmethod
    def backward(ctx, g):
        return _SegmentExpand.apply(g, ctx.seg, ctx.dim), None, None


class _SegmentExpand(torch.autograd.Function):
    """y[index] along dim (a gather: no atomics forward); backward: the gradient's segment sums
    (Segments.sum), where torch's own index_select backward would index_add."""

    @staticmethod
    def forward(ctx, y, seg, dim):
        ctx.seg, ctx.dim = seg, dim
        return y.index_select(dim, seg.index_on(y.device))

    @staticmethod
    def backward(ctx, g):
        return _SegmentSum.apply(g, ctx.seg, ctx.dim), None, None


class SortedSegments(Segments):
    """Segments of contiguous rows: index (P,) sorted nondecreasing, segment s = rows ptr[s]:ptr[s + 1]
    (the PyG batch vector's layout; module doc). A Segments (sum, expand, max) with the products that
    need the boundaries on the host, each choosing its side by ``few_segments``:

        outer(a (..., P, m), b (..., P, d)) -> (..., S, m, d)       sum_{p in s} a_p b_p^T
        apply(x (..., P, m), state (..., S, m, d)) -> (..., P, d)   row p = x_p^T state[index[p]]

    index: (P,) integer, sorted, values in [0, num_segments) (not checked: fast.batching.check_batch
    validates); ptr: its (S + 1,) row pointers when the caller has them (else formed once).
    ``pointers()`` reads them to the host once; ``blocks(block)`` cuts the rows into blocks.

        >>> import torch
        >>> from fast.segments import SortedSegments
        >>> seg = SortedSegments(torch.tensor([0, 0, 1]), 2)
        >>> seg.pointers()
        [0, 2, 3]
        >>> seg.outer(torch.ones(3, 1), torch.tensor([[1.0], [2.0], [4.0]])).flatten().tolist()
        [3.0, 4.0]
    """

    __slots__ = ("_ptr", "_host_ptr", "_blocks")

    def __init__(self, index: torch.Tensor, num_segments: int, *, ptr: torch.Tensor | None = None):
        super().__init__(index, num_segments, sorted=True)
        self._ptr = ptr
        self._host_ptr: list[int] | None = None
        self._blocks: dict = {}

    def pointers(self) -> list[int]:
        """ptr (S + 1,) as a Python list (one host read, cached)."""
        if self._host_ptr is None:
            ptr = self._ptr if self._ptr is not None else row_pointers(self.index, self.num_segments)
            self._host_ptr = [int(p) for p in ptr.tolist()]
        return self._host_ptr

    def blocks(self, block: int) -> list[tuple[int, int, int, int, Segments]]:
        """Rows in blocks of ``block``: (s, e, g0, g1, segments) per block, rows s:e lying in segments
        g0:g1 (contiguous: the index is sorted) and ``segments`` grouping the block's rows by segment
        - g0. From the host pointers (no device read beyond ``pointers``'); cached per block."""
        if block not in self._blocks:
            ptr = self.pointers()
            out, g0 = [], 0
            for s in range(0, self.n, block):
                e = min(self.n, s + block)
                while ptr[g0 + 1] <= s:  # the segment of row s (empty segments skipped)
                    g0 += 1
                g1 = g0
                while ptr[g1] < e:  # one past the segment of row e - 1
                    g1 += 1
                local = [0] + [min(ptr[g], e) - s for g in range(g0 + 1, g1 + 1)]
                out.append((s, e, g0, g1, Segments.from_pointers(local, device=self.index.device)))
            self._blocks[block] = out
        return self._blocks[block]

    def apply(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Row p times its segment's matrix: x (..., P, m), state (..., S, m, d) -> (..., P, d),
        row p = x_p^T state[index[p]] (the transpose of ``outer``'s job). O(P m d).

        Never materialises P x m x d: few segments, one GEMM per segment's contiguous slice; many,
        row blocks with their segments' states gathered, B * m * d * (leading size) <=
        OUTER_BLOCK_ELEMENTS per block (memory-bound, no loop over segments). Differentiable, with a
        deterministic backward (the gather's adjoint is a segment sum)."""
        if few_segments(self.num_segments):
            ptr = self.pointers()
            parts = [x[..., s:e, :] @ state[..., g, :, :] for g, (s, e) in enumerate(zip(ptr[:-1], ptr[1:])) if e > s]
            return torch.cat(parts, dim=-2)
        per_node = max(1, math.prod(state.shape[:-3]) * state.shape[-2] * state.shape[-1])
        step = max(1, OUTER_BLOCK_ELEMENTS // per_node)
        parts = []
        for s, e, g0, g1, local in self.blocks(step):
            block = local.expand(state[..., g0:g1, :, :], dim=-3)  # (..., B, m, d)
            parts.append((x[..., s:e, :].unsqueeze(-2) @ block).squeeze(-2))
        return torch.cat(parts, dim=-2)

    def outer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """sum_{p in s} a_p b_p^T per segment: a (..., P, m), b (..., P, d) -> (..., S, m, d). O(P m d).

        Never materialises the P x m x d outer products:
        - few segments: a loop over the contiguous slices, one GEMM a[ptr[s]:ptr[s+1]]^T
          b[ptr[s]:ptr[s+1]] each (the boundaries read to the host once);
        - many (a GEMM per segment would be dominated by call overhead): row blocks of B rows,
          B * m * d * (leading size) <= OUTER_BLOCK_ELEMENTS, whose outer products are formed,
          summed per segment (no atomics, the same bits on every run) and added to the block's
          segments in block order; peak extra memory O(OUTER_BLOCK_ELEMENTS + S m d).
        a and b broadcast in their leading dims and are promoted to one dtype. Differentiable in a
        and b (both sides)."""
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, d = a.shape[-1], b.shape[-1]
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
        if few_segments(self.num_segments):
            ptr = self.pointers()
            at = a.transpose(-1, -2)
            parts = [at[..., :, s:e] @ b[..., s:e, :] for s, e in zip(ptr[:-1], ptr[1:])]
            parts = [p.expand(*lead, m, d) for p in parts]
            if not parts:
                return torch.zeros(*lead, 0, m, d, dtype=dtype, device=a.device)
            return torch.stack(parts, dim=-3)
        lead_size = 1
        for s in lead:
            lead_size *= int(s)
        block = max(1, OUTER_BLOCK_ELEMENTS // max(1, lead_size * m * d))
        out = torch.zeros(*lead, self.num_segments, m * d, dtype=dtype, device=a.device)
        for s, e, g0, g1, local in self.blocks(block):
            outer = (a[..., s:e, :].unsqueeze(-1) * b[..., s:e, :].unsqueeze(-2)).flatten(-2)  # (..., B, m d)
            out[..., g0:g1, :] += local.sum(outer.expand(*lead, e - s, m * d), dim=-2)
        return out.unflatten(-1, (m, d))


def index_sum(x: torch.Tensor, index: torch.Tensor, num_segments: int, dim: int = 0) -> torch.Tensor:
    """The deterministic twin of ``x.new_zeros(...).index_add(dim, index, x)``: sums of the
    entries of x along ``dim`` grouped by index (P,) into num_segments outputs. Plans once per
    call (O(P log P)); for repeated use keep a ``Segments``.

        >>> import torch
        >>> from fast.segments import index_sum
        >>> index_sum(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1, 0, 1]), 3).tolist()
        [2.0, 5.0, 0.0]
    """
    return Segments(index, num_segments).sum(x, dim)


def add_into(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``out.index_add_(dim, index, src)`` with the same bits on every run: in place, returns out.

    For accumulations into a large ``out`` from many small batches of rows (a backward's edge
    blocks), where a Segments of out's size per batch would cost O(size of out) each time. CPU:
    index_add_ itself (deterministic there). Elsewhere: src summed per distinct index (a Segments
    over torch.unique's inverse) and added to those rows once, read-modify-write with index_copy_
    (each row written once: no two threads meet). One host read per call there (unique's size).
    Not differentiable (in place): for backward passes written by hand.

        >>> import torch
        >>> from fast.segments import add_into
        >>> add_into(torch.ones(3), torch.tensor([2, 2]), torch.tensor([1.0, 4.0])).tolist()
        [1.0, 1.0, 6.0]
    """
    dim = dim % out.dim()
    if backend(out.device) == "index_add":
        return out.index_add_(dim, index, src)
    keys, inverse = torch.unique(index, return_inverse=True)
    partial = Segments(inverse, int(keys.numel()), longest=int(index.numel())).sum(src, dim)
    return out.index_copy_(dim, keys, out.index_select(dim, keys) + partial.to(out.dtype))


class IndexAdd:
    """``out.index_add_(dim, index, src)`` and its adjoint ``x.index_select(dim, index)`` for a fixed
    index (P,), planned once: the same bits on every run, on every device, and twice
    differentiable. For sums into a LARGE tensor that lives across many calls (an accumulator
    filled in chunks, a tree level updated in place), where a Segments' fresh output per call would
    cost O(rows of out) each time, and for gathers from it whose backward would be such a sum.

        add_into(out (..., R, ...), src (..., P, ...), dim) -> out   in place: out[index[p]] += src[p]
        take(x (..., R, ...), dim)                        -> (..., P, ...)   row p = x[index[p]]

    index: (P,) integer, values in [0, R) (not checked: the callers build it); src has out's dtype.
    CPU: index_add_ and index_select themselves (deterministic there). Elsewhere: src summed per
    distinct row of index (Segments, planned once per device: one host read) and added to out's
    rows read-modify-write with index_copy_, each row written once. Work O(P C) per call.
    TypeError for a non-integer or non-1-D index.

        >>> import torch
        >>> from fast.segments import IndexAdd
        >>> plan = IndexAdd(torch.tensor([2, 0, 2]))
        >>> plan.add_into(torch.zeros(3, 1), torch.tensor([[1.0], [2.0], [4.0]]), dim=0).flatten().tolist()
        [2.0, 0.0, 5.0]
        >>> plan.take(torch.tensor([[7.0], [8.0], [9.0]]), dim=0).flatten().tolist()
        [9.0, 7.0, 9.0]
    """

    __slots__ = ("index", "n", "_plans")

    def __init__(self, index: torch.Tensor):
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype.is_floating_point \
                or index.dtype.is_complex or index.dtype == torch.bool:
            raise TypeError(f"index must be a 1-D integer tensor (P,) of row ids, got {index!r:.80}")
        self.index = index.to(torch.int64)
        self.n = int(index.numel())
        self._plans: dict = {}

    def __repr__(self) -> str:
        return f"IndexAdd(n={self.n})"

    def index_on(self, device: torch.device) -> torch.Tensor:
        key = ("index", str(device))
        if key not in self._plans:
            self._plans[key] = self.index if self.index.device == device else self.index.to(device)
        return self._plans[key]

    def _keys(self, device: torch.device) -> tuple:
        """(keys (K,), Segments of the rows by their place among keys, IndexAdd of keys) on device."""
        key = ("keys", str(device))
        if key not in self._plans:
            keys, inverse, counts = torch.unique(self.index_on(device), return_inverse=True, return_counts=True)
            longest = int(counts.max()) if counts.numel() else 0  # the plan's one host read
            seg = Segments(inverse, int(keys.numel()), longest=longest)
            place = IndexAdd(keys)
            place._plans[("keys", str(device))] = (keys, None, place)  # keys are distinct: their own keys
            self._plans[key] = (keys, seg, place)
        return self._plans[key]

    def add_into(self, out: torch.Tensor, src: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """out.index_add_(dim, index, src), in place; returns out. Differentiable in out and src."""
        dim = dim % out.dim()
        if backend(out.device) == "index_add":
            return out.index_add_(dim, self.index_on(out.device), src)
        keys, seg, place = self._keys(out.device)
        partial = src if seg is None else seg.sum(src, dim)
        return _AddRows.apply(out, partial, place, dim)

    def take(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """x.index_select(dim, index): (..., R, ...) -> (..., P, ...). Differentiable (backward: add_into)."""
        dim = dim % x.dim()
        if backend(x.device) == "index_add":
            return x.index_select(dim, self.index_on(x.device))
        return _TakeRows.apply(x, self, dim)


class _AddRows(torch.autograd.Function):
    """out[keys] += partial along dim, in place, keys distinct (IndexAdd.add_into off CPU): read-modify-
    write with index_copy_. Backward: g for out, g's rows at keys (IndexAdd.take of keys) for partial."""

    @staticmethod
    def forward(ctx, out, partial, place, dim):
        keys = place.index_on(out.device)
        out.index_copy_(dim, keys, out.index_select(dim, keys) + partial)
        ctx.mark_dirty(out)
        ctx.place, ctx.dim = place, dim
        return out

    @staticmethod
    def backward(ctx, g):
        return g, ctx.place.take(g, ctx.dim), None, None


class _TakeRows(torch.autograd.Function):
    """x.index_select(dim, index) (IndexAdd.take off CPU); backward: IndexAdd.add_into on zeros of x's
    shape, where torch's own would index_add_ with atomics."""

    @staticmethod
    def forward(ctx, x, plan, dim):
        ctx.plan, ctx.dim, ctx.shape = plan, dim, x.shape
        return x.index_select(dim, plan.index_on(x.device))

    @staticmethod
    def backward(ctx, g):
        return ctx.plan.add_into(g.new_zeros(ctx.shape), g, ctx.dim), None, None
