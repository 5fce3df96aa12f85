"""Graph random features (GRF) as sparse mask operators: reid25 Algorithm 1 / Eq. 10, App. D.

G (N, N) has rows phi_hat(v_i) = (1/n) sum over node i's walks and their prefixes u_0..u_t
(t <= len(f) - 1) of f_t load_t e_{u_t}, with load_t = prod_{s < t} W[u_s, u_{s+1}] deg(u_s) /
(1 - p_halt) (deg = stored neighbours; p_halt = 0 for fixed-length walks). E[G] = sum_k f_k W^k
(capped at the longest walk), so M_hat = G_q G_k^T estimates M_alpha = Phi Phi^T (alpha the
self-convolution of f) and is unbiased for independent query and key ensembles.

``WalkFeatures`` builds the sparsity of G once from the walks: one entry per (row, column,
prefix length t) with base value load_t / n (duplicates merged), and the CSR (row, column) pairs
they sum into, with the permutation that orders the pairs by column (the CSR of G^T). The values
sum_t base f[t] are recomputed from f whenever f changes (its version counter: any in-place update,
an optimiser step or ``copy_``, reaches the next call; an update through ``f.data`` bypasses the
counter and is not seen), so f can be a learnable tensor, held, not copied. Products are torch
sparse CSR x dense (O(nnz c)) inside an autograd Function whose backward gives x's gradient by the
transposed product and f's by a sampled dense-dense product over the stored pairs
(dL/dG_pc = <g_row, x_col>, torch.sparse.sampled_addmm), then one scatter over t; no per-node loops.

GRFMask: M_hat = G_q G_k^T, matmul = G_q (G_k^T x). With features_k=None one ensemble is used on
both sides (G_q = G_k): M_hat is then biased on the diagonal (E[G_i . G_i] exceeds
E[G_i] . E[G_i] by the variance of row i), as reid25 notes; pass independent ensembles for an
unbiased mask. GRFAsymMask (App. D, Eq. 24): the key side one-hot, M_hat = G with f = alpha.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fast.graphs import Graph, as_graph
from fast.masks.base import MaskOperator
from fast.validation import check_tokens, compute_dtype
from fast.walks import Walks

_WALK_FIELDS = ("n_nodes", "n_walkers", "p_halt", "length", "offsets", "nodes")

#: Entries x columns gathered at once in the f-gradient under double backward (bounds its memory).
_GATHER_CHUNK = 1 << 24

#: The (row, column, t) sort key row * N * (K + 1) + column * (K + 1) + t must stay below this.
_KEY_LIMIT = 2**62


def as_walks(walks: Any, graph: Graph, name: str = "walks") -> Walks:
    """``walks`` (a fast.walks.Walks, a dict of its fields such as reference walks' or ``to_numpy()``'s,
    or any object with those attributes) as a validated Walks on ``graph``'s device, for ``graph``'s n."""
    if not isinstance(walks, Walks):
        get = (lambda k: walks[k]) if isinstance(walks, Mapping) else (lambda k: getattr(walks, k))
        try:
            fields = {k: get(k) for k in _WALK_FIELDS}
        except (KeyError, AttributeError) as e:
            raise TypeError(f"{name} must be a fast.walks.Walks or a dict/object with fields "
                            f"{', '.join(_WALK_FIELDS)}; {type(walks).__name__} lacks {e}") from None
        walks = Walks.from_arrays(**fields, device=graph.device)
    if walks.n_nodes != graph.n:
        raise ValueError(f"{name} were sampled on a graph of {walks.n_nodes} nodes, but the graph has {graph.n} nodes")
    if not 0.0 <= walks.p_halt < 1.0:
        raise ValueError(f"{name}.p_halt must be in [0, 1) (0 for fixed-length walks), got {walks.p_halt!r}")
    return walks.to(graph.device)


def as_modulation(f: Any, name: str = "f") -> torch.Tensor:
    """f as a 1-D floating tensor (f_0, ..., f_K): a tensor is kept as it is (no copy: learnable,
    updatable in place); a sequence or NumPy array becomes float64. Non-empty and finite."""
    if not isinstance(f, torch.Tensor):
        a = np.asarray(f)
        if a.dtype.kind not in "iuf" or a.dtype == np.bool_:
            raise TypeError(f"{name} must be a 1-D tensor or sequence of real numbers, got dtype {a.dtype}")
        f = torch.as_tensor(a.astype(np.float64))
    elif not f.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating tensor (learnable), got dtype {f.dtype}")
    if f.dim() != 1 or f.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence (f_0, ..., f_K), got shape {tuple(f.shape)}")
    if not bool(torch.isfinite(f.detach()).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return f


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, (n, n), check_invariants=False)


def _pointers(rows: torch.Tensor, n: int) -> torch.Tensor:
    counts = torch.bincount(rows, minlength=n)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


class WalkPrefixes:
    """The sparsity of a walk-built (N, N) matrix: entries (row, column, t) with base values, summed
    into CSR pairs (row, column); values per pair = sum_t base_e coef[t_e] for a coefficient
    vector coef (GRF: f; the loads are in the bases). Built once; transpose = a permutation.

    Attributes: n, pair_row, pair_col (P,), crow (n + 1,), entry_pair, entry_t (E,), base (E,)
    float64, perm_t (P,) (pairs in column order), crow_t, col_t (the CSR of the transpose)."""

    def __init__(self, n: int, row: torch.Tensor, col: torch.Tensor, t: torch.Tensor, base: torch.Tensor,
                 num_t: int):
        self.n, self.num_t = n, num_t
        device = row.device
        if n * n * num_t < _KEY_LIMIT:  # one sort by (row, column, t)
            key = (row * n + col) * num_t + t
        else:  # too wide for int64: number the (row, column) pairs first
            key = torch.unique(row * n + col, return_inverse=True)[1] * num_t + t
        key, order = torch.sort(key, stable=True)
        new = torch.ones(key.numel(), dtype=torch.bool, device=device)
        new[1:] = key[1:] != key[:-1]
        inverse = torch.cumsum(new, 0) - 1
        key = key[new]
        # duplicates (same row, column and t: walks of one node meeting) merge into one entry
        self.base = torch.zeros(key.numel(), dtype=torch.float64, device=device).index_add_(0, inverse, base[order])
        self.entry_t = key % num_t
        pair_key = key // num_t
        first = torch.ones(key.numel(), dtype=torch.bool, device=device)
        first[1:] = pair_key[1:] != pair_key[:-1]
        self.entry_pair = torch.cumsum(first, 0) - 1
        rows_cols = (row * n + col)[order][new][first]  # the (row, column) of each pair, sorted
        self.pair_row, self.pair_col = rows_cols // n, rows_cols % n
        self.nnz = int(rows_cols.numel())
        #: True when every pair holds one entry: the values are then the entries' (no segment sum)
        self.one_per_pair = self.base.numel() == self.nnz
        self.crow = _pointers(self.pair_row, n)
        # pairs are in (row, column) order; a stable sort by column gives the CSR of the transpose
        self.perm_t = torch.sort(self.pair_col, stable=True)[1]
        self.crow_t = _pointers(self.pair_col, n)
        self.col_t = self.pair_row[self.perm_t]
        self._index: dict = {}
        self._base: dict = {}

    def index(self, device: torch.device) -> dict:
        """Int32 (or int64 when large) CSR structure and int64 gather indices on ``device``, built once."""
        key = str(device)
        if key not in self._index:
            small = max(self.nnz, self.n) < 2**31
            ix = torch.int32 if small else torch.int64
            self._index[key] = {
                "crow": self.crow.to(device, ix), "col": self.pair_col.to(device, ix),
                "crow_t": self.crow_t.to(device, ix), "col_t": self.col_t.to(device, ix),
                "perm_t": self.perm_t.to(device), "row": self.pair_row.to(device), "pcol": self.pair_col.to(device),
                "entry_pair": self.entry_pair.to(device), "entry_t": self.entry_t.to(device)}
        return self._index[key]

    def bases(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (str(device), dtype)
        if key not in self._base:
            self._base[key] = self.base.to(device=device, dtype=dtype)
        return self._base[key]

    def values(self, coef: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(P,) pair values sum_t base coef[t] in ``dtype`` (differentiable in coef)."""
        ix = self.index(device)
        contrib = self.bases(device, dtype) * coef.to(device=device, dtype=dtype)[ix["entry_t"]]
        if self.one_per_pair:
            return contrib
        # one segment sum (entries are sorted by pair): out-of-place so double backward can see it
        return torch.zeros(self.nnz, dtype=dtype, device=device).index_add(0, ix["entry_pair"], contrib)

    def coef_grad(self, grad_values: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """d L / d coef (num_t,) from d L / d values (P,): sum over entries of base * grad[pair], by t."""
        ix = self.index(device)
        g = grad_values if self.one_per_pair else grad_values[ix["entry_pair"]]
        contrib = self.bases(device, dtype) * g
        return torch.zeros(self.num_t, dtype=dtype, device=device).index_add(0, ix["entry_t"], contrib)

    def matrix(self, values: torch.Tensor, transpose: bool) -> torch.Tensor:
        """The CSR tensor (N, N) of these values (or of the transpose) on values' device."""
        ix = self.index(values.device)
        if transpose:
            return _csr(ix["crow_t"], ix["col_t"], values[ix["perm_t"]], self.n)
        return _csr(ix["crow"], ix["col"], values, self.n)

    def value_grad(self, g: torch.Tensor, x: torch.Tensor, transpose: bool) -> torch.Tensor:
        """dL/dvalue_p for y = A x (A = the matrix, or its transpose), g = dL/dy, x (N, C):
        <g[row_p], x[col_p]> (transpose: <x[row_p], g[col_p]>), a sampled dense-dense product.

        Plain backward: torch.sparse.sampled_addmm on the pattern (no (P, C) temporary). Under
        double backward (grad mode on): gathers and a row-wise dot, chunked, differentiable."""
        left, right = (x, g) if transpose else (g, x)
        if not torch.is_grad_enabled():
            key = ("pattern", str(g.device), g.dtype)
            if key not in self._base:
                ix = self.index(g.device)
                ones = torch.ones(self.nnz, dtype=g.dtype, device=g.device)
                self._base[key] = _csr(ix["crow"], ix["col"], ones, self.n)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.sparse.sampled_addmm(self._base[key], left, right.mT, beta=0.0).values()
        ix = self.index(g.device)
        step = max(1, _GATHER_CHUNK // max(1, g.shape[1]))
        parts = [(left.index_select(0, ix["row"][s:s + step]) * right.index_select(0, ix["pcol"][s:s + step])).sum(-1)
                 for s in range(0, self.nnz, step)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class _WalkProduct(torch.autograd.Function):
    """y = A x with A = G(f) or G(f)^T (CSR), x (N, C); gradients for x and f."""

    @staticmethod
    def forward(ctx, x, f, features, transpose):
        ctx.save_for_backward(x, f)
        ctx.features, ctx.transpose = features, transpose
        return features.csr(x.device, x.dtype, transpose) @ x

    @staticmethod
    def backward(ctx, g):
        x, f = ctx.saved_tensors
        features, transpose = ctx.features, ctx.transpose
        grad_x = grad_f = None
        if ctx.needs_input_grad[0]:
            grad_x = _WalkProduct.apply(g, f, features, not transpose)
        if ctx.needs_input_grad[1]:
            prefixes = features.prefixes
            gv = prefixes.value_grad(g, x, transpose)
            grad_f = prefixes.coef_grad(gv, g.device, g.dtype).to(device=f.device, dtype=f.dtype)
        return grad_x, grad_f, None, None


def _flatten(x: torch.Tensor, n: int) -> tuple[torch.Tensor, tuple, torch.dtype]:
    check_tokens("x", x, n)
    work = compute_dtype(x.dtype)
    return x.to(work).movedim(-2, 0).reshape(n, -1), tuple(x.shape[:-2]), work


def _unflatten(y: torch.Tensor, lead: tuple, x: torch.Tensor) -> torch.Tensor:
    return y.reshape(y.shape[0], *lead, x.shape[-1]).movedim(0, -2).to(x.dtype)


class WalkFeatures:
    """G (N, N), the GRF matrix of rows phi_hat(v_i) (Eq. 10) from one walk ensemble and modulation f.

    graph: anything ``fast.graphs.as_graph`` accepts (the weighted W); walks: sampled on it with
    uniform neighbour choice (fast.walks.Walks or a dict of its fields); f: (K + 1,) tensor or
    sequence; prefixes longer than K hops are dropped. The structure is built once (O(total walk
    length) work, one loop over hops); ``product`` costs O(nnz c). Attributes: n, f, n_walkers,
    p_halt, nnz (stored pairs), prefixes (the WalkPrefixes)."""

    def __init__(self, graph: Any, walks: Any, f: Any, *, name: str = "f"):
        graph = as_graph(graph)
        walks = as_walks(walks, graph)
        self.f = as_modulation(f, name)
        self.name = name
        self.n, self.n_walkers, self.p_halt = graph.n, walks.n_walkers, float(walks.p_halt)
        num_t = int(self.f.numel())
        walker, t = walks.positions()
        nodes, offsets, length = walks.nodes, walks.offsets, walks.length
        # load_t = load_{t-1} * (W[u_{t-1}, u_t] deg(u_{t-1}) / (1 - p_halt)), the reference's order of
        # products: one pass per depth over the walkers still going (the active set shrinks; total
        # work = number of entries), prefixes of at most K = len(f) - 1 hops
        degree = graph.degree.to(torch.float64)
        load = torch.ones(nodes.numel(), dtype=torch.float64, device=nodes.device)
        off_edge = torch.zeros((), dtype=torch.bool, device=nodes.device)
        active = torch.nonzero(length >= 1).flatten()
        depth = 1
        while depth < num_t and active.numel():
            idx = offsets[active] + depth
            src, dst = nodes[idx - 1], nodes[idx]
            weight = graph.edge_weight(src, dst)
            off_edge |= (weight <= 0).any()
            load[idx] = load[idx - 1] * (weight * degree[src] / (1.0 - self.p_halt))
            depth += 1
            active = active[length[active] >= depth]
        if bool(off_edge):
            src, dst = walks.hops()
            k = int(torch.nonzero(graph.edge_weight(src, dst) <= 0)[0, 0])
            raise ValueError(f"walks: a walk steps from node {int(src[k])} to node {int(dst[k])}, which is not an "
                             "edge of the graph")
        row = walker // self.n_walkers
        if int(length.max()) >= num_t:  # drop the prefixes longer than K hops
            keep = torch.nonzero(t < num_t).flatten()
            row, nodes, t, load = row[keep], nodes[keep], t[keep], load[keep]
        self.prefixes = WalkPrefixes(self.n, row, nodes, t, load / self.n_walkers, num_t)
        self.nnz = self.prefixes.nnz
        self._stamp, self._csr = None, {}

    # ------------------------------------------------------------------ products
    def csr(self, device: torch.device, dtype: torch.dtype, transpose: bool = False,
            absolute: bool = False) -> torch.Tensor:
        """G (transpose: G^T; absolute: built from |f|) as a CSR tensor with the current f, no
        gradient. Cached per device, dtype and kind while f is unchanged: the cache is keyed on f's
        version counter and storage, which every in-place update (an optimiser step) bumps."""
        try:
            stamp = (self.f._version, self.f.data_ptr())
        except RuntimeError:  # an inference tensor tracks no version: rebuild at every call
            stamp = object()
        if stamp != self._stamp:
            self._stamp, self._csr = stamp, {}
        key = (str(device), dtype, transpose, absolute)
        if key not in self._csr:
            with torch.no_grad():
                f = self.f.detach().abs() if absolute else self.f.detach()
                values = self.prefixes.values(f, device, dtype)
            self._csr[key] = self.prefixes.matrix(values, transpose)
        return self._csr[key]

    def product(self, x: torch.Tensor, transpose: bool = False, absolute: bool = False) -> torch.Tensor:
        """G x (transpose: G^T x; absolute: with |f|, no gradient) for x (N, C) in a floating dtype."""
        if absolute:
            with torch.no_grad():
                return self.csr(x.device, x.dtype, transpose, absolute=True) @ x
        if torch.is_grad_enabled() and (x.requires_grad or self.f.requires_grad):
            return _WalkProduct.apply(x, self.f, self, transpose)
        return self.csr(x.device, x.dtype, transpose) @ x

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """G x for x (..., N, c) -> (..., N, c)."""
        flat, lead, _ = _flatten(x, self.n)
        return _unflatten(self.product(flat), lead, x)

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """G^T x for x (..., N, c) -> (..., N, c)."""
        flat, lead, _ = _flatten(x, self.n)
        return _unflatten(self.product(flat, transpose=True), lead, x)

    def to_dense(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """G as a dense (N, N) tensor with the current f (for tests and small N)."""
        p = self.prefixes
        return p.matrix(p.values(self.f, p.crow.device, dtype), False).to_dense()

    # ------------------------------------------------------------------ properties
    @property
    def nonnegative(self) -> bool:
        """True when the current f >= 0 (the loads are >= 0 since W >= 0), so G >= 0."""
        return bool((self.f.detach() >= 0).all())

    @property
    def nnz_per_row(self) -> torch.Tensor:
        """Stored entries (distinct columns) of each feature row phi_hat(v_i), (N,) int64."""
        return self.prefixes.crow[1:] - self.prefixes.crow[:-1]

    def nnz_stats(self) -> dict:
        """{"mean": float, "max": int} of ``nnz_per_row`` (Lemma 3.2 bounds it by n ceil(b) + 1 w.h.p.)."""
        counts = self.nnz_per_row
        return {"mean": self.nnz / self.n, "max": int(counts.max()) if counts.numel() else 0}

    def parameters(self) -> list[torch.Tensor]:
        """[f] when f requires grad, else []."""
        return [self.f] if self.f.requires_grad else []


def grf_features(graph: Any, walks: Any, f: Any) -> WalkFeatures:
    """The GRF matrix G (Eq. 10) of ``walks`` on ``graph`` with modulation f: ``WalkFeatures``."""
    return WalkFeatures(graph, walks, f)


def _check_features(name: str, value: object) -> WalkFeatures:
    if not isinstance(value, WalkFeatures):
        raise TypeError(f"{name} must be a WalkFeatures (fast.masks.grf.grf_features(graph, walks, f)), "
                        f"got {type(value).__name__}")
    return value


class GRFMask(MaskOperator):
    """M_hat = G_q G_k^T (reid25 Sec. 3, Algorithm 1): a sparse low-rank mask, O(nnz c) per product.

    features_q, features_k: WalkFeatures of two independent ensembles (unbiased, E M_hat = M_alpha);
    features_k=None: one shared ensemble, G_k = G_q (the diagonal is then biased upwards, module
    docstring). matmul(x) = G_q (G_k^T x), rmatmul(x) = G_k (G_q^T x); nonnegative when both f >= 0;
    abs_matmul(x) = |G_q| (|G_k|^T x) with |G| built from |f| (>= |G| entrywise since loads >= 0)."""

    def __init__(self, features_q: WalkFeatures, features_k: WalkFeatures | None = None):
        self.features_q = _check_features("features_q", features_q)
        self.shared = features_k is None
        self.features_k = self.features_q if features_k is None else _check_features("features_k", features_k)
        if self.features_k.n != self.features_q.n:
            raise ValueError(f"features_q and features_k must be for one graph, got N = {self.features_q.n} "
                             f"and N = {self.features_k.n}")
        self.n = self.features_q.n

    def _apply(self, x: torch.Tensor, first: WalkFeatures, second: WalkFeatures, absolute: bool = False):
        flat, lead, _ = _flatten(x, self.n)
        y = second.product(first.product(flat, transpose=True, absolute=absolute), absolute=absolute)
        return _unflatten(y, lead, x)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M x = G_q (G_k^T x) for x (..., N, c) -> (..., N, c)."""
        return self._apply(x, self.features_k, self.features_q)

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T x = G_k (G_q^T x) for x (..., N, c) -> (..., N, c)."""
        return self._apply(x, self.features_q, self.features_k)

    def abs_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """|G_q| (|G_k|^T x) >= |M| x entrywise (for x >= 0), no gradient."""
        with torch.no_grad():
            return self._apply(x.detach(), self.features_k, self.features_q, absolute=True)

    @property
    def nonnegative(self) -> bool:
        """True when f >= 0 on both sides (current values)."""
        return self.features_q.nonnegative and self.features_k.nonnegative

    def nnz_stats(self) -> dict:
        """nnz per feature row, {"mean", "max"}, over both sides' rows (one side when shared)."""
        sides = [self.features_q] if self.shared else [self.features_q, self.features_k]
        stats = [s.nnz_stats() for s in sides]
        return {"mean": sum(s["mean"] for s in stats) / len(stats), "max": max(s["max"] for s in stats)}

    def parameters(self) -> list[torch.Tensor]:
        """The distinct f tensors requiring grad (query side, key side)."""
        out: dict[int, torch.Tensor] = {}
        for side in (self.features_q, self.features_k):
            for t in side.parameters():
                out.setdefault(id(t), t)
        return list(out.values())


class GRFAsymMask(MaskOperator):
    """M_hat = G (asymmetric GRFs, reid25 App. D, Eq. 24): the key side one-hot, f = alpha.

    matmul(x) = G x, rmatmul(x) = G^T x, O(nnz c); nonnegative when alpha >= 0. Masked linear
    attention with it is Eq. 26 / Algorithm 2, correctly normalised (the printed algorithm
    divides by an extra n)."""

    def __init__(self, features: WalkFeatures):
        self.features = _check_features("features", features)
        self.n = features.n

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """G x for x (..., N, c) -> (..., N, c)."""
        return self.features.matmul(x)

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """G^T x for x (..., N, c) -> (..., N, c)."""
        return self.features.rmatmul(x)

    def abs_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """|G| x with |G| built from |alpha| (>= |G| entrywise), no gradient."""
        with torch.no_grad():
            flat, lead, _ = _flatten(x.detach(), self.n)
            return _unflatten(self.features.product(flat, absolute=True), lead, x)

    @property
    def nonnegative(self) -> bool:
        """True when alpha >= 0 (current values)."""
        return self.features.nonnegative

    def nnz_stats(self) -> dict:
        """nnz per row of G, {"mean", "max"}."""
        return self.features.nnz_stats()

    def parameters(self) -> list[torch.Tensor]:
        """[alpha] when it requires grad."""
        return self.features.parameters()
