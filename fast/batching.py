"""Batches of several graphs in one node set: the PyG batch vector (wu22; issue 13).

The nodes of G graphs are concatenated along the node axis N and ``batch`` (N,) gives each node's
graph id: sorted nondecreasing, values in [0, G), graph g owning the contiguous nodes
ptr[g]:ptr[g + 1] (labels may skip values: empty graphs). ``check_batch`` validates it (one host
read) and returns a ``BatchIndex`` with the per-graph reductions, never across graphs:

    segment_sum(x (..., N, c)) -> (..., G, c)       segment_max(x (..., N, c)) -> (..., G, c)
    gather(y (..., G, c)) -> (..., N, c)            row u gets y[batch[u]]
    segment_outer(a (..., N, m), b (..., N, d)) -> (..., G, m, d)     sum_{u in g} a_u b_u^T
    apply_state(x (..., N, m), state (..., G, m, d)) -> (..., N, d)   row u = x_u^T state[batch[u]]

O(N c), or O(N m d) for the outer products, computed by fast.segments.SortedSegments: no atomic
adds, so the same inputs give the same bits on every run, and perturbing one graph's inputs
leaves every other graph's outputs bit for bit unchanged. The per-graph loop for few graphs reads
the graph boundaries to the host once per BatchIndex; nothing else synchronises.
"""
from __future__ import annotations

import numpy as np

import torch

from fast.segments import Segments, SortedSegments
from fast.validation import broadcast_shape, check_allocation, check_positive_int, check_same_device

__all__ = ["BatchIndex", "check_batch"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class BatchIndex:
    """A validated, sorted PyG batch vector (module doc). Build with ``check_batch``.

    Attributes: ``n`` (N), ``num_graphs`` (G), ``index`` (N,) int64 tensor (sorted graph ids),
    ``ptr`` (G + 1,) int64 tensor (graph g = nodes ptr[g]:ptr[g + 1]), ``sizes`` (G,) int64
    tensor (nodes per graph; 0 for an empty label), ``device``.

        >>> import torch
        >>> from fast.batching import check_batch
        >>> b = check_batch(torch.tensor([0, 0, 2]), 3)
        >>> b.num_graphs, b.segment_sum(torch.ones(3, 1)).flatten().tolist()
        (3, [2.0, 0.0, 1.0])
    """

    __slots__ = ("n", "num_graphs", "index", "ptr", "sizes", "_segments", "cache")

    def __init__(self, index: torch.Tensor, num_graphs: int):
        """Trusts its arguments (``check_batch`` validates): index (N,) int64 sorted in [0, num_graphs)."""
        self.n = int(index.numel())
        self.num_graphs = int(num_graphs)
        self.index = index
        self.sizes = torch.bincount(index, minlength=self.num_graphs)
        ptr = torch.zeros(self.num_graphs + 1, dtype=torch.int64, device=index.device)
        torch.cumsum(self.sizes, 0, out=ptr[1:])
        self.ptr = ptr
        self._segments: SortedSegments | None = None
        #: derived layouts of this batch that its users build once (e.g. fast.latent.nodeformer's padding slots)
        self.cache: dict = {}

    @property
    def device(self) -> torch.device:
        return self.index.device

    def to(self, device) -> "BatchIndex":
        """The same batch on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device or (device.index is None and device.type == self.device.type):
            return self
        out = BatchIndex.__new__(BatchIndex)
        out.n, out.num_graphs = self.n, self.num_graphs
        out.index, out.ptr, out.sizes = self.index.to(device), self.ptr.to(device), self.sizes.to(device)
        out._segments = self._segments  # device-independent plans with the host pointers (fast.segments)
        out.cache = {}
        return out

    def host_ptr(self) -> list[int]:
        """ptr as a Python list (one host read, cached)."""
        return self.segments().pointers()

    def __repr__(self) -> str:
        return f"BatchIndex(n={self.n}, num_graphs={self.num_graphs}, device={self.device})"

    def segments(self) -> SortedSegments:
        """The N nodes in their G graphs as a fast.segments.SortedSegments (planned once)."""
        if self._segments is None:
            self._segments = SortedSegments(self.index, self.num_graphs, ptr=self.ptr)
        return self._segments

    def node_blocks(self, block: int) -> list[tuple[int, int, int, int, Segments]]:
        """Nodes in blocks of ``block`` rows: (s, e, g0, g1, segments) per block, nodes s:e lying in
        graphs g0:g1 (fast.segments.SortedSegments.blocks; cached per block)."""
        return self.segments().blocks(block)

    # ------------------------------------------------------------------ reductions
    def _nodes(self, name: str, x: object, min_dim: int = 2) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < min_dim or x.shape[-2] != self.n:
            raise ValueError(f"{name} must have shape (..., N, c) with N = {self.n} nodes (the batch's) on axis -2, "
                             f"got {tuple(x.shape)}")
        return x

    def segment_sum(self, x: torch.Tensor) -> torch.Tensor:
        """sum_{u in g} x_u per graph: x (..., N, c) -> (..., G, c) (0 for an empty graph). O(N c);
        differentiable (fast.segments: deterministic forward and backward)."""
        x = self._nodes("x", x)
        return self.segments().sum(x, dim=-2)

    def segment_max(self, x: torch.Tensor) -> torch.Tensor:
        """max_{u in g} x_u per graph, entrywise: x (..., N, c) -> (..., G, c) (-inf for an empty graph).
        Meant for stabilising constants (callers detach it); differentiable as torch's amax scatter
        (fast.segments.segment_max)."""
        x = self._nodes("x", x)
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating tensor (the maxima are stabilising constants), got {x.dtype}")
        return self.segments().max(x, dim=-2)

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """Per-graph rows back to nodes: y (..., G, c) -> (..., N, c), row u = y[..., batch[u], :]."""
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if y.dim() < 2 or y.shape[-2] != self.num_graphs:
            raise ValueError(f"y must have shape (..., G, c) with G = {self.num_graphs} graphs on axis -2, got "
                             f"{tuple(y.shape)}")
        return self.segments().expand(y, dim=-2)  # index_select's own backward would index_add

    def apply_state(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Row u times its graph's matrix: x (..., N, m), state (..., G, m, d) -> (..., N, d),
        row u = x_u^T state[batch[u]] (the transpose of ``segment_outer``'s job).

        Never materialises N x m x d: few graphs, one GEMM per graph's contiguous slice; many, node
        blocks with their graphs' states gathered (fast.segments.SortedSegments.apply, which chooses
        by fast.segments.few_segments). Differentiable, with a deterministic backward. TypeError naming
        x or state for a non-tensor or dtypes that differ; ValueError naming them for a wrong N, a
        wrong graph count G, widths m that differ, leading dims that do not broadcast, or two devices.

            >>> import torch
            >>> from fast.batching import check_batch
            >>> b = check_batch([0, 0, 1], 3)
            >>> b.apply_state(torch.ones(3, 2), torch.stack([torch.eye(2), 2 * torch.eye(2)])).tolist()
            [[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]]
        """
        x = self._nodes("x", x)
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"state must be a torch.Tensor (..., G, m, d), got {type(state).__name__}")
        m = x.shape[-1]
        if state.dim() < 3 or state.shape[-3] != self.num_graphs or state.shape[-2] != m:
            raise ValueError(f"state must have shape (..., G, m, d) with G = {self.num_graphs} graphs (the batch's) "
                             f"and m = {m} (x's width), got {tuple(state.shape)}")
        broadcast_shape(tuple(x.shape[:-2]), tuple(state.shape[:-3]), "x's and state's leading dims")
        if state.dtype != x.dtype:
            raise TypeError(f"x and state must have one dtype, got {x.dtype} and {state.dtype}")
        check_same_device(x=x, state=state)
        return self.segments().apply(x, state)

    def segment_outer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """sum_{u in g} a_u b_u^T per graph: a (..., N, m), b (..., N, d) -> (..., G, m, d).

        Never materialises the N x m x d outer products: few graphs, one GEMM per graph's contiguous
        slice (the boundaries read to the host once per BatchIndex); many, node blocks whose outer
        products are summed per graph without atomics (fast.segments.SortedSegments.outer, which
        chooses by fast.segments.few_segments). Work O(N m d). a and b broadcast in their leading
        dims. Differentiable in a and b (both sides).
        """
        a, b = self._nodes("a", a), self._nodes("b", b)
        return self.segments().outer(a, b)


def check_batch(batch: object, n: int, *, name: str = "batch", device=None,
                num_graphs: int | None = None) -> BatchIndex | None:
    """Validate a PyG batch vector for inputs with N = n nodes: None -> None, else a BatchIndex.

    batch: None (one graph), a BatchIndex (its n is checked; moved to ``device``), or an integer
    tensor, NumPy array or sequence (N,), sorted nondecreasing (each graph's nodes contiguous),
    labels >= 0. G = max label + 1 (labels that never occur are empty graphs), or ``num_graphs``
    when given (labels must then be < num_graphs). Without ``num_graphs`` max label + 1 > N is
    refused: at most N graphs can be non-empty, and a label such as 2**33 would make every
    per-graph array that large. device: where the index lives (default: the tensor's, else CPU).

    One host read per call (sortedness, min and max in one transfer). Errors name ``name``:
    TypeError for a non-integer dtype (bools and floats refused); ValueError for a wrong shape, a
    negative label, a label too large, or an unsorted vector (naming the first offending position);
    MemoryError naming num_graphs when its per-graph arrays would not fit in memory.

        >>> from fast.batching import check_batch
        >>> check_batch([0, 0, 1, 1, 1], 5).host_ptr()
        [0, 2, 5]
        >>> check_batch([0, 1, 0], 3)
        Traceback (most recent call last):
        ...
        ValueError: batch must be sorted (PyG convention: ...); batch[2] = 0 follows batch[1] = 1
    """
    n = check_positive_int("n (the number of nodes)", n)
    if num_graphs is not None:
        check_positive_int("num_graphs", num_graphs, "a positive integer or None")
        check_allocation(f"num_graphs = {num_graphs}", (int(num_graphs) + 1,), torch.int64, device, copies=2,
                         what="the per-graph sizes and pointers")
    if batch is None:
        return None
    if isinstance(batch, BatchIndex):
        if batch.n != n:
            raise ValueError(f"{name} has {batch.n} entries but the inputs have N = {n} nodes")
        if num_graphs is not None and batch.num_graphs > num_graphs:
            raise ValueError(f"{name} has {batch.num_graphs} graphs but num_graphs = {num_graphs}")
        return batch if device is None else batch.to(device)
    if isinstance(batch, torch.Tensor):
        if batch.layout != torch.strided:
            raise TypeError(f"{name} must be a dense integer tensor (N,) of graph ids, got layout {batch.layout}")
        if batch.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be an integer tensor or array (N,) of graph ids (PyG batch vector), "
                            f"got dtype {batch.dtype}")
        t = batch.detach()
    else:
        try:
            arr = np.asarray(batch)
        except Exception:  # noqa: BLE001 - anything that is not array-like
            arr = np.asarray(None, dtype=object)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            got = f"dtype {arr.dtype}" if arr.dtype != object else type(batch).__name__
            raise TypeError(f"{name} must be an integer tensor or array (N,) of graph ids (PyG batch vector), "
                            f"got {got}")
        t = torch.as_tensor(arr.astype(np.int64, copy=False))
    if t.dim() != 1:
        raise ValueError(f"{name} must have shape (N,) = ({n},) (one graph id per node), got {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} entries but the inputs have N = {n} nodes")
    t = t.to(device=device if device is not None else t.device, dtype=torch.int64)
    ordered = (t[1:] >= t[:-1]).all() if n > 1 else torch.ones((), dtype=torch.bool, device=t.device)
    ok, lo, hi = torch.stack([ordered.to(torch.int64), t.min(), t.max()]).tolist()  # the one host read
    if lo < 0:
        i = int(torch.nonzero(t < 0)[0, 0])
        raise ValueError(f"{name} labels must be >= 0 (graph ids in [0, G)), got {name}[{i}] = {int(t[i])}")
    if not ok:
        i = int(torch.nonzero(t[1:] < t[:-1])[0, 0]) + 1
        raise ValueError(f"{name} must be sorted (PyG convention: each graph's nodes are contiguous); "
                         f"{name}[{i}] = {int(t[i])} follows {name}[{i - 1}] = {int(t[i - 1])}")
    if num_graphs is None and hi >= n:
        raise ValueError(f"{name} labels must be < N = {n} (at most N graphs can be non-empty; labels may skip "
                         f"values, but G = max label + 1 graphs are allocated, so max label + 1 > N is refused), "
                         f"got max label {hi}")
    g = hi + 1
    if num_graphs is not None:
        if hi >= num_graphs:
            raise ValueError(f"{name} labels must be < num_graphs = {num_graphs}, got {hi}")
        g = int(num_graphs)
    return BatchIndex(t.contiguous(), g)
