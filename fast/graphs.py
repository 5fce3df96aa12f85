"""Graph: the one canonical undirected weighted graph every graph-kernel mask of fast/ reads.

A Graph is an adjacency W (n, n) stored as CSR on torch: crow (n + 1,), col (E,) int64 (each
row's columns sorted, no duplicates), weight (E,) float64 (> 0, finite); row (E,) (crow
expanded), degree (n,) (stored neighbours; a self-loop counts once), weighted_degree (n,)
(d_i = sum_j W_ij, docs/papers.md Sec. 3). E counts stored entries: an undirected edge {i, j},
i != j, twice, a self-loop once. Immutable (``to`` returns a new one).

Conversion (``as_graph`` / ``Graph.from_any``), O(E log E) on the target device:

- inputs: a Graph (passed through); a PyG ``edge_index`` (2, E) integer tensor or ndarray with
  optional ``edge_weight`` (E,) (default 1; n defaults to max index + 1); a torch sparse COO or
  CSR (n, n); any scipy.sparse (n, n); a networkx graph (nodes relabelled 0..n-1 in ``G.nodes``
  order, attribute "weight", default 1; a DiGraph is an asymmetric input, a MultiGraph's parallel
  edges are summed).
- dense adjacency matrices are refused (unlike reference.graphs.adjacency: pass
  ``scipy.sparse.csr_matrix(A)`` or ``A.to_sparse()``); an integer (2, 2) array is ambiguous and
  refused unless ``n`` or ``edge_weight`` marks it as an edge_index.
- duplicates are summed, then explicit zeros dropped; weights finite and >= 0; indices in
  [0, n); n >= 1 (self-loops, isolated nodes and several components are fine).
- W must equal W^T: entries that agree to a relative SYMMETRY_RTOL count as equal (round-off of
  d_i^-1/2 w_ij d_j^-1/2 computed in another order) and the larger is stored, so the result is
  exactly symmetric; otherwise ValueError naming one pair, unless ``symmetrize=True`` (max(W, W^T),
  an entry missing on one side counting 0).
- weights are data: a tensor requiring grad is detached (a learnable reweighting of the same
  sparsity goes through ``csr(dtype, values=...)``).

Errors are ValueError (bad values or shapes) or TypeError (not a graph), naming the argument
(``name``), what was expected and what came.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from fast.segments import Segments, segment_max
from fast.sparse import check_csr, csr_matrix, row_pointers
from fast.validation import check_allocation, check_device, check_positive_int

__all__ = ["Graph", "as_graph", "normalized_adjacency", "SYMMETRY_RTOL"]

#: Relative tolerance under which W[i, j] and W[j, i] count as equal (see the module docstring).
SYMMETRY_RTOL = 1e-12

#: The most nodes a Graph may have: a node pair (i, j) is located by the int64 key i n + j, so n^2 <= 2^63.
MAX_NODES = math.isqrt(2**63 - 1)

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _check_n(n: object, name: str) -> int | None:
    if n is None:
        return None
    return check_positive_int(f"n (the number of nodes of {name})", n, ">= 1", type_error=True)


def _check_size(n: int, where: str, device) -> None:
    """Refuse a node count before anything of its size is allocated: MemoryError (fast.validation.
    check_allocation) when the per-node arrays (row pointers, degrees, weighted degrees) would not fit,
    ValueError past MAX_NODES. ``where`` says where n came from."""
    check_allocation(where, (n + 1,), torch.int64, device, copies=3,
                     what="the graph's per-node arrays (row pointers, degrees, weighted degrees)")
    if n > MAX_NODES:
        raise ValueError(f"{where}: a graph may have at most MAX_NODES = {MAX_NODES} nodes (node pairs are located by "
                         f"the int64 key i n + j), got n = {n}")


def _as_index_tensor(x: Any, what: str, device) -> torch.Tensor:
    """An integer tensor (int64) from a tensor or ndarray, refusing floats and bools."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(f"{what} must be a dense integer tensor, got layout {x.layout}")
        if x.dtype not in _INT_DTYPES:
            raise TypeError(f"{what} must hold integer indices, got dtype {x.dtype}")
        return x.to(device=device, dtype=torch.int64)
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{what} must hold integer indices, got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64, copy=False), device=device)


def _as_weight_tensor(x: Any, what: str, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(f"{what} must be real, got dtype {x.dtype}")
        return x.detach().to(device=device, dtype=torch.float64)
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged or not array-like
        raise TypeError(f"{what} must be an array of real numbers, got {type(x).__name__} ({exc})") from None
    if arr.dtype.kind not in "biuf":  # strings ('1' would convert quietly), objects, complex, dates
        raise TypeError(f"{what} must be real numbers (an integer or floating array), got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.float64, copy=False), device=device)


def _check_weights(w: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, name: str) -> None:
    if w.numel() == 0:
        return
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        k = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"{name}: edge weights must be finite, got {float(w[k])!r} at entry "
                         f"({int(rows[k])}, {int(cols[k])}) ({int(bad.sum())} non-finite in all)")
    neg = w < 0
    if bool(neg.any()):
        k = int(torch.nonzero(neg)[0, 0])
        raise ValueError(f"{name}: edge weights must be >= 0 (the graph kernels need W >= 0), got "
                         f"{float(w[k])!r} at entry ({int(rows[k])}, {int(cols[k])}) ({int(neg.sum())} negative in all)")


def _check_range(idx: torch.Tensor, n: int, what: str, name: str) -> None:
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0:
        raise ValueError(f"{name}: {what} must be >= 0 (node indices), got {lo}")
    if hi >= n:
        raise ValueError(f"{name}: {what} must be < n={n} (node indices in [0, n)), got {hi}; "
                         f"n must be at least max index + 1 = {hi + 1}")


def _canonical(rows: torch.Tensor, cols: torch.Tensor, w: torch.Tensor, n: int, symmetrize: bool, name: str):
    """(crow, col, weight) of W from unsorted COO triples: duplicates summed, zeros dropped,
    symmetry checked (or max(W, W^T) when symmetrize). All on rows' device, O(E log E)."""
    keys = rows * n + cols
    if keys.numel() > 1 and not bool((keys[1:] > keys[:-1]).all()):  # not already sorted and unique
        keys, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        w = Segments(inverse, keys.numel()).sum(w, dim=0)  # duplicates summed without atomics (fast.segments)
    keep = w != 0
    if not bool(keep.all()):
        keys, w = keys[keep], w[keep]
    rows, cols = torch.div(keys, n, rounding_mode="floor"), keys % n
    t_keys = cols * n + rows  # where W[j, i] would sit
    if symmetrize:
        all_keys = torch.cat([keys, t_keys])
        all_w = torch.cat([w, w])
        keys, inverse = torch.unique(all_keys, sorted=True, return_inverse=True)
        w = segment_max(all_w, inverse, keys.numel(), dim=0)  # every key has an entry, all > 0: no -inf
    elif keys.numel():
        pos = torch.searchsorted(keys, t_keys).clamp_(max=keys.numel() - 1)
        found = keys[pos] == t_keys
        w_t = torch.where(found, w[pos], torch.zeros_like(w))
        close = (w - w_t).abs() <= SYMMETRY_RTOL * torch.maximum(w, w_t)
        if not bool(close.all()):
            k = int(torch.nonzero(~close)[0, 0])
            i, j = int(rows[k]), int(cols[k])
            raise ValueError(f"{name} is not symmetric (W[{i}, {j}] = {float(w[k])!r} but W[{j}, {i}] = "
                             f"{float(w_t[k])!r}); pass symmetrize=True to use max(W, W^T)")
        w = torch.maximum(w, w_t)  # exactly symmetric after round-off-sized differences
    rows, cols = torch.div(keys, n, rounding_mode="floor"), keys % n
    return row_pointers(rows, n), cols.contiguous(), w.contiguous()


def _is_networkx(graph: object) -> bool:
    return type(graph).__module__.split(".")[0] == "networkx"


def _is_scipy_sparse(graph: object) -> bool:
    mod = type(graph).__module__
    if not mod.startswith("scipy.sparse"):
        return False
    import scipy.sparse as sp  # lazily: only when a scipy object came

    return sp.issparse(graph)


class Graph:
    """Canonical undirected graph W (n, n) on torch, CSR with sorted unique columns (module docstring).

    Build with ``Graph.from_any(...)`` or ``as_graph(...)``; the constructor takes canonical
    parts and trusts them (``check=True`` re-validates them: ValueError / TypeError naming the
    broken invariant). O(n + E) memory. The path 0 - 1 - 2:

        >>> import torch
        >>> from fast.graphs import Graph
        >>> g = Graph.from_any(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]))
        >>> g.n, g.num_edges, g.degree.tolist(), g.crow.tolist()
        (3, 4, [1, 2, 1], [0, 1, 3, 4])
        >>> g.csr().to_dense().tolist()
        [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    """

    __slots__ = ("_n", "_crow", "_col", "_weight", "_row", "_degree", "_wdeg", "_keys", "_csr", "cache")

    def __init__(self, n: int, crow: torch.Tensor, col: torch.Tensor, weight: torch.Tensor, *, check: bool = False):
        self._n = int(n)
        self._crow, self._col, self._weight = crow, col, weight
        if check:
            self._validate()
        self._degree = crow[1:] - crow[:-1]
        self._row = torch.repeat_interleave(torch.arange(self._n, device=crow.device), self._degree,
                                            output_size=col.numel())
        self._wdeg: torch.Tensor | None = None  # weighted_degree, formed at its first use
        self._keys = None
        self._csr: dict = {}
        #: what other modules derive from this graph once and reuse while it lives (fast.latent.nodeformer:
        #: the adjacency orders and normalised bias operators), keyed by tuples that start with the
        #: module's name; the graph is immutable, so nothing here goes stale.
        self.cache: dict = {}

    def _validate(self) -> None:
        n, crow, col, w = self._n, self._crow, self._col, self._weight
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if crow.dtype != torch.int64 or col.dtype != torch.int64 or w.dtype != torch.float64:
            raise TypeError(f"crow, col must be int64 and weight float64, got {crow.dtype}, {col.dtype}, {w.dtype}")
        if crow.shape != (n + 1,) or col.dim() != 1 or w.shape != col.shape:
            raise ValueError(f"crow must be (n+1,) = ({n + 1},), col and weight (E,), got "
                             f"{tuple(crow.shape)}, {tuple(col.shape)}, {tuple(w.shape)}")
        row = check_csr(crow, col, n, "graph")
        if not bool(torch.isfinite(w).all()) or not bool((w > 0).all()):
            raise ValueError("weight must be finite and > 0 (explicit zeros dropped)")
        _, _, w2 = _canonical(row, col, w, n, False, "graph")  # the symmetry check
        del w2

    # ------------------------------------------------------------------ read-only attributes
    @property
    def n(self) -> int:
        """Number of nodes."""
        return self._n

    @property
    def crow(self) -> torch.Tensor:
        """CSR row pointers (n + 1,) int64."""
        return self._crow

    @property
    def col(self) -> torch.Tensor:
        """Column indices (E,) int64, sorted within each row, no duplicates."""
        return self._col

    @property
    def weight(self) -> torch.Tensor:
        """Edge weights (E,) float64, > 0 and finite."""
        return self._weight

    @property
    def row(self) -> torch.Tensor:
        """Row index (E,) int64 of each stored entry (crow expanded)."""
        return self._row

    @property
    def degree(self) -> torch.Tensor:
        """Stored neighbours per node (n,) int64 (a self-loop counts 1)."""
        return self._degree

    @property
    def weighted_degree(self) -> torch.Tensor:
        """Row sums d_i = sum_j W_ij (n,) float64 (formed once, at the first call: on CUDA its plan
        reads the largest degree to the host)."""
        if self._wdeg is None:  # row sums in column order (fast.segments: the same bits on every CUDA run)
            self._wdeg = Segments(self._row, self._n, sorted=True).sum(self._weight, dim=0)
        return self._wdeg

    @property
    def num_edges(self) -> int:
        """E: stored (directed) entries, twice the undirected edges plus the self-loops."""
        return int(self._col.numel())

    @property
    def device(self) -> torch.device:
        return self._crow.device

    def keys(self) -> torch.Tensor:
        """row * n + col (E,) int64, globally sorted (searchsorted locates W[u, v]); built once."""
        if self._keys is None:
            self._keys = self._row * self._n + self._col
        return self._keys

    def edge_weight(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """W[u, v] (float64, broadcast shape of u and v) for index tensors u, v; 0 where no edge.

        Vectorised binary search on ``keys()``: O(len log E), no host sync. Indices are not
        range-checked (an out-of-range pair may alias another entry): callers pass node ids."""
        u = torch.as_tensor(u, device=self.device).to(torch.int64)
        v = torch.as_tensor(v, device=self.device).to(torch.int64)
        u, v = torch.broadcast_tensors(u, v)
        keys = self.keys()
        if keys.numel() == 0:
            return torch.zeros(u.shape, dtype=torch.float64, device=self.device)
        q = (u * self._n + v).reshape(-1)
        pos = torch.searchsorted(keys, q).clamp_(max=keys.numel() - 1)
        out = torch.where(keys[pos] == q, self._weight[pos], torch.zeros((), dtype=torch.float64, device=self.device))
        return out.reshape(u.shape)

    def csr(self, dtype: torch.dtype = torch.float64, *, values: torch.Tensor | None = None) -> torch.Tensor:
        """W as a torch sparse CSR tensor (n, n) of ``dtype`` on the graph's device.

        Cached per dtype; ``values`` (E,) replaces the weights (same sparsity; not cached, so a
        tensor requiring grad keeps its autograd graph)."""
        if values is not None:
            if values.shape != (self.num_edges,):
                raise ValueError(f"values must have shape (E,) = ({self.num_edges},), got {tuple(values.shape)}")
            return csr_matrix(self._crow, self._col, values.to(device=self.device, dtype=dtype), self._n,
                              check_invariants=None)  # handed out: torch's global invariant switch applies
        if dtype not in self._csr:
            self._csr[dtype] = csr_matrix(self._crow, self._col, self._weight.to(dtype), self._n,
                                          check_invariants=None)
        return self._csr[dtype]

    def to(self, device) -> "Graph":
        """The same graph on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device or (device.index is None and device.type == self.device.type):
            return self
        return Graph(self._n, self._crow.to(device), self._col.to(device), self._weight.to(device))

    def to_scipy(self):
        """W as scipy.sparse.csr_matrix float64 (n, n) (for tests and for reference/ twins)."""
        import scipy.sparse as sp

        return sp.csr_matrix((self._weight.cpu().numpy(), self._col.cpu().numpy(), self._crow.cpu().numpy()),
                             shape=(self._n, self._n))

    def __repr__(self) -> str:
        return f"Graph(n={self._n}, num_edges={self.num_edges}, device={self.device})"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_any(cls, graph: Any, *, n: int | None = None, edge_weight: Any = None, symmetrize: bool = False,
                 device: Any = None, name: str = "graph") -> "Graph":
        """A Graph from any accepted input (module docstring: inputs, rules, errors).

        graph: Graph | edge_index (2, E) int tensor/ndarray | torch sparse (n, n) |
        scipy.sparse (n, n) | networkx.Graph. n: node count (edge_index: default max index + 1;
        sparse inputs: must equal their size if given). edge_weight: (E,) weights of an
        edge_index's columns (default 1). symmetrize: use max(W, W^T) instead of refusing an
        asymmetric W. device: where the Graph lives (default: the input tensor's device, else
        CPU). name: the argument's name in errors."""
        if not isinstance(symmetrize, bool):
            raise TypeError(f"symmetrize must be a bool, got {type(symmetrize).__name__}")
        if device is not None:
            device = check_device("device", device)
        n = _check_n(n, name)
        if isinstance(graph, Graph):
            if edge_weight is not None:
                raise ValueError(f"edge_weight is only for an edge_index input; {name} is a Graph")
            if n is not None and n != graph.n:
                raise ValueError(f"n={n} does not match {name}'s {graph.n} nodes")
            return graph if device is None else graph.to(device)
        if edge_weight is not None and not (
                (isinstance(graph, torch.Tensor) and graph.layout == torch.strided) or isinstance(graph, np.ndarray)):
            raise ValueError(f"edge_weight is only for an edge_index (2, E) input; {name} is a {type(graph).__name__}")

        if isinstance(graph, torch.Tensor) and graph.layout != torch.strided:
            dev = torch.device(device) if device is not None else graph.device
            size = n_sp = _sparse_size(tuple(graph.shape), name, n, dev)
            if graph.layout == torch.sparse_csr:
                crow = graph.crow_indices().to(dev, torch.int64)
                cols = graph.col_indices().to(dev, torch.int64)
                rows = torch.repeat_interleave(torch.arange(size, device=dev), crow[1:] - crow[:-1],
                                               output_size=cols.numel())
                vals = graph.values()
            else:
                coo = graph if graph.layout == torch.sparse_coo else graph.to_sparse_coo()
                idx = coo._indices().to(dev, torch.int64)  # uncoalesced is fine: duplicates summed below
                rows, cols, vals = idx[0], idx[1], coo._values()
            if vals.dim() != 1:
                raise ValueError(f"{name} must be a 2-D sparse matrix with scalar values, got values of shape {tuple(vals.shape)}")
            w = _as_weight_tensor(vals, f"{name} values", dev)
            return cls._from_coo(rows, cols, w, n_sp, symmetrize, name)

        if isinstance(graph, (torch.Tensor, np.ndarray)):
            dev = torch.device(device) if device is not None else (
                graph.device if isinstance(graph, torch.Tensor) else torch.device("cpu"))
            shape = tuple(graph.shape)
            square = len(shape) == 2 and shape[0] == shape[1]
            dense_hint = ("; a dense adjacency matrix (n, n) is not accepted here: pass scipy.sparse.csr_matrix(A) "
                          "or the torch sparse A.to_sparse()") if square else ""
            if shape[:1] != (2,) or graph.ndim != 2:
                raise ValueError(f"{name} as an edge_index must have shape (2, E), got {shape}{dense_hint}")
            integer = graph.dtype in _INT_DTYPES if isinstance(graph, torch.Tensor) else (
                graph.dtype != np.bool_ and np.issubdtype(graph.dtype, np.integer))
            if shape == (2, 2) and integer and n is None and edge_weight is None:
                raise ValueError(f"{name} of shape (2, 2) is ambiguous: an edge_index (2, E) with E = 2 edges, or a "
                                 f"dense 2 x 2 adjacency matrix (which fast does not accept). For an edge_index pass "
                                 f"n=... (the number of nodes) or edge_weight=...; for an adjacency pass "
                                 f"scipy.sparse.csr_matrix(A) or A.to_sparse()")
            try:
                idx = _as_index_tensor(graph, f"{name} (edge_index)", dev)
            except TypeError as exc:
                raise TypeError(f"{exc}{dense_hint}") from None
            e = idx.shape[1]
            if n is None:
                if e == 0:
                    raise ValueError(f"{name}: n must be given for an edge_index without edges (n = 0 is refused)")
                n = int(idx.max()) + 1
                if n < 1:
                    raise ValueError(f"{name}: edge_index indices must be >= 0, got {int(idx.min())}")
                where = f"{name} (edge_index) with largest node index {n - 1} (n = {n})"
            else:
                where = f"n = {n}"
            if edge_weight is None:
                w = torch.ones(e, dtype=torch.float64, device=dev)
            else:
                w = _as_weight_tensor(edge_weight, "edge_weight", dev)
                if tuple(w.shape) != (e,):
                    raise ValueError(f"edge_weight must have shape (E,) = ({e},) (one weight per edge_index column), "
                                     f"got {tuple(w.shape)}")
            _check_range(idx, n, "edge_index entries", name)
            _check_size(n, where, dev)
            return cls._from_coo(idx[0], idx[1], w, n, symmetrize, name)

        if _is_scipy_sparse(graph):
            dev = torch.device(device) if device is not None else torch.device("cpu")
            size = _sparse_size(tuple(graph.shape), name, n, dev)
            coo = graph.tocoo()
            if np.iscomplexobj(coo.data):
                raise TypeError(f"{name} must have real entries, got dtype {coo.data.dtype}")
            rows = torch.as_tensor(np.asarray(coo.row, dtype=np.int64), device=dev)
            cols = torch.as_tensor(np.asarray(coo.col, dtype=np.int64), device=dev)
            w = torch.as_tensor(np.asarray(coo.data, dtype=np.float64), device=dev)
            return cls._from_coo(rows, cols, w, size, symmetrize, name)

        if _is_networkx(graph):
            dev = torch.device(device) if device is not None else torch.device("cpu")
            nodes = list(graph.nodes)
            size = len(nodes)
            if size == 0:
                raise ValueError(f"{name} must have n >= 1 nodes, got an empty networkx graph")
            if n is not None and n != size:
                raise ValueError(f"n={n} does not match {name}'s {size} nodes")
            label = {v: i for i, v in enumerate(nodes)}
            edges = list(graph.edges(data="weight", default=1.0))
            u = np.fromiter((label[a] for a, _, _ in edges), dtype=np.int64, count=len(edges))
            v = np.fromiter((label[b] for _, b, _ in edges), dtype=np.int64, count=len(edges))
            bad = next(((a, b, x) for a, b, x in edges if not isinstance(x, numbers.Real)), None)
            if bad is not None:  # float("2") would convert a string quietly
                raise TypeError(f"{name}: edge attribute 'weight' must be a real number, got "
                                f"{type(bad[2]).__name__} {bad[2]!r} on edge ({bad[0]!r}, {bad[1]!r})")
            wt = np.array([float(x) for _, _, x in edges], dtype=np.float64)
            if not graph.is_directed():  # each undirected edge stands for W[u, v] and W[v, u] (a loop once)
                off = u != v
                u, v, wt = np.concatenate([u, v[off]]), np.concatenate([v, u[off]]), np.concatenate([wt, wt[off]])
            return cls._from_coo(torch.as_tensor(u, device=dev), torch.as_tensor(v, device=dev),
                                 torch.as_tensor(wt, device=dev), size, symmetrize, name)

        raise TypeError(f"{name} must be a Graph, an edge_index (2, E) integer tensor or ndarray, a torch sparse "
                        f"(COO/CSR) tensor, a scipy.sparse matrix or a networkx graph, got {type(graph).__name__}")

    @classmethod
    def _from_coo(cls, rows: torch.Tensor, cols: torch.Tensor, w: torch.Tensor, n: int, symmetrize: bool,
                  name: str) -> "Graph":
        _check_range(rows, n, "row indices", name)
        _check_range(cols, n, "column indices", name)
        _check_weights(w, rows, cols, name)
        crow, col, weight = _canonical(rows, cols, w, n, symmetrize, name)
        return cls(n, crow, col, weight)


def _sparse_size(shape: tuple[int, ...], name: str, n: int | None, device) -> int:
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"{name} must be a square sparse matrix (n, n), got shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} must have n >= 1 nodes, got shape {shape}")
    if n is not None and n != shape[0]:
        raise ValueError(f"n={n} does not match {name}'s shape {shape}")
    _check_size(int(shape[0]), f"{name} of shape {shape}", device)
    return int(shape[0])


def as_graph(graph: Any, **kw: Any) -> Graph:
    """A Graph passes through (moved to ``device`` if given); anything else goes to Graph.from_any
    (module doc: accepted inputs, rules and errors; O(E log E)).

        >>> import torch
        >>> from fast.graphs import as_graph
        >>> g = as_graph(torch.tensor([[0, 1], [1, 2]]), n=3, symmetrize=True)
        >>> g.num_edges, g.edge_weight(torch.tensor(2), torch.tensor(1)).item()
        (4, 1.0)
        >>> as_graph(torch.tensor([[0], [1]]), n=2)
        Traceback (most recent call last):
        ...
        ValueError: graph is not symmetric (W[0, 1] = 1.0 but W[1, 0] = 0.0); pass symmetrize=True to use max(W, W^T)
    """
    if isinstance(graph, Graph) and not kw:
        return graph
    return Graph.from_any(graph, **kw)


def normalized_adjacency(g: Graph) -> Graph:
    """The graph with weights w_ij / sqrt(d_i d_j), d = weighted degree (reid25's common W).

    Computed as w_ij / (sqrt(d_i) sqrt(d_j)): the product d_i d_j would overflow for weights above
    ~1e154 and underflow below ~1e-162 (giving 0 or inf); the square roots keep every finite graph
    in range. Same sparsity as g (isolated nodes have no entries, so no 0/0 arises). O(n + E).
    TypeError for a g that is not a Graph.

        >>> import torch
        >>> from fast.graphs import as_graph, normalized_adjacency
        >>> a = torch.tensor([[0.0, 1, 0], [1, 0, 3], [0, 3, 0]], dtype=torch.float64)
        >>> d = a.sum(1).rsqrt()
        >>> w = normalized_adjacency(as_graph(a.to_sparse())).csr().to_dense()
        >>> bool(torch.allclose(w, d[:, None] * a * d[None, :]))
        True
    """
    if not isinstance(g, Graph):
        raise TypeError(f"g must be a Graph (use as_graph), got {type(g).__name__}")
    d = g.weighted_degree
    r = torch.sqrt(d)
    w = g.weight / (r[g.row] * r[g.col])
    # sqrt(d_i) sqrt(d_j) is a product of the same two floats for (i, j) and (j, i): exactly symmetric
    return Graph(g.n, g.crow, g.col, w)
