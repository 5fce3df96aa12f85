"""Graph random features (GRF) as sparse mask operators: reid25 Algorithm 1 / Eq. 10, App. D
(docs/papers.md Sec. 3). Dense twin: reference/masks/grf.py.

``WalkFeatures`` (``grf_features``) is the sparse matrix G (N, N) of rows phi_hat(v_i) built
from one walk ensemble and a modulation f (learnable): E[G] = sum_k f_k W^k. ``GRFMask`` is
M_hat = G_q G_k^T (unbiased for independent ensembles), ``GRFAsymMask`` the one-sided M_hat = G
(App. D); both apply to x (..., N, c) in O(nnz c). Their FAVOR+ ``attend`` undoes per-key
stabiliser constants with per-entry factors on the stored values (``stabilising_factors``,
``row_factors``, ``ScaledWalkMatrix``, ``StabilisedProduct``; shared with fast.masks.rwgnk).
Derivations (the estimator, the learnable values and their backward, the stabilised products):
docs/papers.md, fast.masks.grf.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fast.graphs import Graph, as_graph
from fast.operator import MaskOperator
from fast.segments import Segments, segment_max
from fast.sparse import block_diagonal_index, csr_matrix, csr_transpose, index_dtype, row_pointers
from fast.stabilizers import LocallyStabilised, plain_attend
from fast.validation import check_tokens, compute_dtype
from fast.walks import Walks

_WALK_FIELDS = ("n_nodes", "n_walkers", "p_halt", "length", "offsets", "nodes")

#: Entries x columns gathered at once in the f-gradient under double backward (bounds its memory).
_GATHER_CHUNK = 1 << 24

#: The (row, column, t) sort key row * N * (K + 1) + column * (K + 1) + t must stay below this.
_KEY_LIMIT = 2**62


def as_walks(walks: Any, graph: Graph, name: str = "walks") -> Walks:
    """``walks`` (a fast.walks.Walks, a dict of its fields such as ``to_numpy()``'s or reference
    walks', or any object with those attributes) as a validated Walks on ``graph``'s device. O(total
    walk length). TypeError naming ``name`` when a field is missing; ValueError when the walks were
    sampled on a graph of another size or p_halt is outside [0, 1).

    >>> import torch
    >>> from fast import as_graph, sample_walks
    >>> from fast.masks.grf import as_walks
    >>> path = as_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]))
    >>> walks = sample_walks(path, 2, p_halt=0.5, generator=torch.Generator().manual_seed(0))
    >>> as_walks(walks.to_numpy(), path).num_walks
    6
    """
    if not isinstance(walks, Walks):
        get = (lambda k: walks[k]) if isinstance(walks, Mapping) else (lambda k: getattr(walks, k))
        try:
            fields = {k: get(k) for k in _WALK_FIELDS}
        except (KeyError, AttributeError) as e:
            raise TypeError(f"{name} must be a fast.walks.Walks or a dict/object with fields "
                            f"{', '.join(_WALK_FIELDS)}; {type(walks).__name__} lacks {e}") from None
        walks = Walks.from_arrays(**fields, device=graph.device)
    else:
        walks.validate()  # a Walks built by hand (dataclasses.replace) is checked as from_arrays checks
    if walks.n_nodes != graph.n:
        raise ValueError(f"{name} were sampled on a graph of {walks.n_nodes} nodes, but the graph has {graph.n} nodes")
    if not 0.0 <= walks.p_halt < 1.0:
        raise ValueError(f"{name}.p_halt must be in [0, 1) (0 for fixed-length walks), got {walks.p_halt!r}")
    return walks.to(graph.device)


def as_modulation(f: Any, name: str = "f") -> torch.Tensor:
    """f as a 1-D floating tensor (f_0, ..., f_K): a tensor is kept as it is (no copy: learnable,
    updatable in place); a sequence or NumPy array becomes float64. TypeError naming ``name`` for
    non-real or non-floating input, ValueError for an empty or non-1-D f or NaN / inf. O(K).

    >>> from fast.masks.grf import as_modulation
    >>> as_modulation([1, 0.5]).dtype
    torch.float64
    """
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


class WalkPrefixes:
    """The sparsity of a walk-built (n, n) matrix: E entries (row, column, t) with base values, summed
    into P CSR pairs (row, column); the value of a pair is sum_t base_e coef[t_e] for a coefficient
    vector coef (num_t,) (GRF: f, the loads in the bases). Built once, O(E log E); the transpose is
    a permutation of the pairs.

    Attributes: n, pair_row, pair_col (P,), crow (n + 1,), entry_pair, entry_t (E,), base (E,)
    float64, perm_t (P,) (pairs in column order), crow_t, col_t (the CSR of the transpose).

    >>> import torch
    >>> from fast.masks.grf import WalkPrefixes
    >>> p = WalkPrefixes(2, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]),
    ...                  torch.tensor([1.0, 2.0, 3.0]), 2)
    >>> values = p.values(torch.tensor([1.0, 0.5]), torch.device("cpu"), torch.float64)
    >>> p.matrix(values, False).to_dense().tolist()
    [[1.0, 1.0], [0.0, 3.0]]
    """

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
        # (a segment sum over the sorted keys, fast.segments: no atomics, the same bits on CUDA too)
        self.base = Segments(inverse, key.numel(), sorted=True).sum(base[order].to(torch.float64), dim=0)
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
        self.crow = row_pointers(self.pair_row, n)
        # pairs are in (row, column) order: the CSR of the transpose by a stable sort by column
        self.crow_t, self.col_t, self.perm_t = csr_transpose(self.crow, self.pair_col, n)
        self._index: dict = {}
        self._base: dict = {}
        #: entries grouped by pair (sorted) and by prefix length t: the sums and gathers of values and
        #: coef_grad, deterministic forward and backward (fast.segments)
        self.by_pair = Segments(self.entry_pair, self.nnz, sorted=True)
        self.by_t = Segments(self.entry_t, num_t)

    def index(self, device: torch.device) -> dict:
        """Int32 (or int64 when large) CSR structure and int64 gather indices on ``device``, built once."""
        key = str(device)
        if key not in self._index:
            ix = index_dtype(self.nnz, self.n)
            self._index[key] = {
                "crow": self.crow.to(device, ix), "col": self.pair_col.to(device, ix),
                "crow_t": self.crow_t.to(device, ix), "col_t": self.col_t.to(device, ix),
                "perm_t": self.perm_t.to(device), "row": self.pair_row.to(device), "pcol": self.pair_col.to(device),
                "entry_pair": self.entry_pair.to(device), "entry_t": self.entry_t.to(device)}
        return self._index[key]

    def block_index(self, device: torch.device, slices: int) -> dict:
        """``index(device)`` for the block-diagonal matrix of ``slices`` copies (``block_diagonal_index``):
        crow, col, crow_t, col_t (its transpose), perm_t (P,) (the transposition of one block).
        slices = 1: ``index(device)`` itself. Cached for the last S used per device only (4 S P
        bytes per index array: a batch's worth, not one per batch shape seen)."""
        if slices == 1:
            return self.index(device)
        key = ("block", str(device))
        cached = self._index.get(key)
        if cached is None or cached[0] != slices:
            base = self.index(device)
            crow, col = block_diagonal_index(base["crow"], base["col"], self.n, slices)
            crow_t, col_t = block_diagonal_index(base["crow_t"], base["col_t"], self.n, slices)
            cached = (slices, {"crow": crow, "col": col, "crow_t": crow_t, "col_t": col_t, "perm_t": base["perm_t"]})
            self._index[key] = cached
        return cached[1]

    def bases(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (str(device), dtype)
        if key not in self._base:
            self._base[key] = self.base.to(device=device, dtype=dtype)
        return self._base[key]

    def values(self, coef: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(P,) pair values sum_t base coef[t] in ``dtype`` (differentiable in coef).

        Formed in float64 and cast once: a load (a product of W deg / (1 - p_halt) over the hops)
        may exceed float32's range where base * coef[t] does not (heavy weights, long walks, a
        decaying f), and casting the base first would turn such an entry into inf (or NaN)."""
        wide = torch.float64 if dtype != torch.float64 and device.type != "mps" else dtype
        contrib = self.bases(device, wide) * self.by_t.expand(coef.to(device=device, dtype=wide), dim=0)
        if not self.one_per_pair:
            contrib = self.by_pair.sum(contrib, dim=0)  # entries are sorted by pair; differentiable twice
        return contrib.to(dtype)

    def coef_grad(self, grad_values: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """d L / d coef (num_t,) from d L / d values (P,): sum over entries of base * grad[pair], by t."""
        g = grad_values if self.one_per_pair else self.by_pair.expand(grad_values, dim=0)
        wide = torch.float64 if dtype != torch.float64 and device.type != "mps" else dtype  # as ``values``
        contrib = self.bases(device, wide) * g.to(wide)
        return self.by_t.sum(contrib, dim=0).to(dtype)

    def matrix(self, values: torch.Tensor, transpose: bool) -> torch.Tensor:
        """The CSR tensor (N, N) of these values (or of the transpose) on values' device."""
        ix = self.index(values.device)
        if transpose:
            return csr_matrix(ix["crow_t"], ix["col_t"], values[ix["perm_t"]], self.n)
        return csr_matrix(ix["crow"], ix["col"], values, self.n)

    def value_grad(self, g: torch.Tensor, x: torch.Tensor, transpose: bool, slices: int = 1) -> torch.Tensor:
        """dL/dvalue_p for y = A x (A the matrix or its transpose), g = dL/dy, x (N, C): <g[row_p], x[col_p]>
        (transpose: <x[row_p], g[col_p]>), by torch.sparse.sampled_addmm (double backward: chunked
        gathers). slices = S > 1: A is block-diagonal, g and x (S N, C), the result (S P,) slice-major.
        """
        left, right = (x, g) if transpose else (g, x)
        total = self.nnz * slices
        if not torch.is_grad_enabled():
            key = ("pattern", str(g.device), g.dtype)  # the last S used only (as block_index)
            cached = self._base.get(key)
            if cached is None or cached[0] != slices:
                ix = self.block_index(g.device, slices)
                ones = torch.ones(total, dtype=g.dtype, device=g.device)
                cached = (slices, csr_matrix(ix["crow"], ix["col"], ones, self.n * slices))
                self._base[key] = cached
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.sparse.sampled_addmm(cached[1], left, right.mT, beta=0.0).values()
        ix = self.index(g.device)
        step = max(1, _GATHER_CHUNK // max(1, g.shape[1]))
        parts = []
        for s in range(0, total, step):  # entry e of the block matrix: slice e // P, pair e % P
            e = torch.arange(s, min(total, s + step), device=g.device)
            shift, pair = (e // self.nnz) * self.n, e % self.nnz
            rows, cols = ix["row"][pair] + shift, ix["pcol"][pair] + shift
            parts.append((left.index_select(0, rows) * right.index_select(0, cols)).sum(-1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class _WalkProduct(torch.autograd.Function):
    """y = A x with A = G(f) or G(f)^T (CSR), x (N, C); gradients for x and f.

    scaled (a ``ScaledWalkMatrix``, or None): A is instead its block-diagonal matrix of S slices
    with values G(f)_p * factor[s, p] (the factor a detached constant), x (S N, C); f's gradient is
    then sum_s factor[s, p] dL/dvalue_sp, pushed through the values' dependence on f as before."""

    @staticmethod
    def forward(ctx, x, f, features, transpose, scaled=None):
        ctx.save_for_backward(x, f)
        ctx.features, ctx.transpose, ctx.scaled = features, transpose, scaled
        if scaled is not None:
            return scaled.csr(transpose) @ x
        return features.csr(x.device, x.dtype, transpose) @ x

    @staticmethod
    def backward(ctx, g):
        x, f = ctx.saved_tensors
        features, transpose, scaled = ctx.features, ctx.transpose, ctx.scaled
        grad_x = grad_f = None
        if ctx.needs_input_grad[0]:
            grad_x = _WalkProduct.apply(g, f, features, not transpose, scaled)
        if ctx.needs_input_grad[1]:
            if scaled is None:
                prefixes = features.prefixes
                gv = prefixes.value_grad(g, x, transpose)
            else:
                prefixes = scaled.prefixes
                gv = prefixes.value_grad(g, x, transpose, scaled.slices)
                gv = (gv.view(scaled.slices, prefixes.nnz) * scaled.factor).sum(0)
            grad_f = prefixes.coef_grad(gv, g.device, g.dtype).to(device=f.device, dtype=f.dtype)
        return grad_x, grad_f, None, None, None


def _flatten(x: torch.Tensor, n: int) -> tuple[torch.Tensor, tuple, torch.dtype]:
    check_tokens("x", x, n)
    work = compute_dtype(x.dtype)
    return x.to(work).movedim(-2, 0).reshape(n, -1), tuple(x.shape[:-2]), work


def _unflatten(y: torch.Tensor, lead: tuple, x: torch.Tensor) -> torch.Tensor:
    return y.reshape(y.shape[0], *lead, x.shape[-1]).movedim(0, -2).to(x.dtype)


# ---------------------------------------------------------------------- per-key stabilisation (fast.stabilizers)


def _masked(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return values if valid is None else values.masked_fill(~valid, -torch.inf)


def _factor(exponent_hi: torch.Tensor, exponent_lo: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """exp(exponent_hi - exponent_lo) where valid and exponent_hi > -inf (there exponent_lo >= exponent_hi is
    finite: a factor in (0, 1]), else 0: never NaN (an excluded entry, or a hub or row without keys,
    whose -inf - (-inf) is NaN, gets 0)."""
    keep = exponent_hi > -torch.inf
    if valid is not None:
        keep = keep & valid
    lo = torch.where(exponent_lo > -torch.inf, exponent_lo, torch.zeros_like(exponent_lo))
    return torch.where(keep, torch.exp(exponent_hi - lo), torch.zeros_like(exponent_hi))


def stabilising_factors(c: torch.Tensor, prefixes_q: "WalkPrefixes", valid_q: torch.Tensor | None,
                        prefixes_k: "WalkPrefixes", valid_k: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(factor_q (S, P_q), factor_k (S, P_k)) for M = G_q G_k^T with per-key constants c (S, N),
    detached: factor_k[s, (j, u)] = exp(c_j - s_u) with s_u the max of c_j over hub u's keys, and
    factor_q[s, (i, u)] = exp(s_u - r_i) with r_i the max of s_u over row i's hubs, so that the
    scaled product is exp(-r_i) times the true row for phi_k_j = phi_true_j exp(-c_j)
    (docs/papers.md, fast.masks.grf). Every factor is <= 1; valid (P,) bool or None (every stored
    entry): entries excluded from the maxima get factor 0. O(S (P_q + P_k)).

    >>> import torch
    >>> from fast.masks.grf import WalkPrefixes, stabilising_factors
    >>> p = WalkPrefixes(2, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]),
    ...                  torch.ones(3), 1)
    >>> factor_q, factor_k = stabilising_factors(torch.tensor([[0.0, -1.0]]), p, None, p, None)
    >>> factor_q.tolist(), [round(float(t), 4) for t in factor_k[0]]
    ([[1.0, 1.0, 1.0]], [1.0, 1.0, 0.3679])
    """
    with torch.no_grad():
        ix_k = prefixes_k.index(c.device)
        ck = _masked(c[:, ix_k["row"]], valid_k)  # (S, P_k): key j's constant at its entries
        hub = segment_max(ck, ix_k["pcol"], prefixes_k.n, dim=-1)  # s_u (S, n)
        factor_k = _factor(ck, hub[:, ix_k["pcol"]], valid_k)
        ix_q = prefixes_q.index(c.device)
        sq = _masked(hub[:, ix_q["pcol"]], valid_q)  # (S, P_q): hub u's scale at the query entries
        top = segment_max(sq, ix_q["row"], prefixes_q.n, dim=-1)  # r_i (S, N)
        factor_q = _factor(sq, top[:, ix_q["row"]], valid_q)
    return factor_q, factor_k


def row_factors(c: torch.Tensor, prefixes: "WalkPrefixes", valid: torch.Tensor | None) -> torch.Tensor:
    """factor (S, P) for M = G itself (GRFAsymMask) with per-key constants c (S, N), detached:
    factor[s, (i, j)] = exp(c_j - r_i), r_i the max of c_j over row i's valid stored entries (<= 1;
    0 where excluded or where row i has no valid entry). O(S P).

    >>> import torch
    >>> from fast.masks.grf import WalkPrefixes, row_factors
    >>> p = WalkPrefixes(2, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]),
    ...                  torch.ones(3), 1)
    >>> [round(float(t), 4) for t in row_factors(torch.tensor([[0.0, -1.0]]), p, None)[0]]
    [1.0, 0.3679, 1.0]
    """
    with torch.no_grad():
        ix = prefixes.index(c.device)
        cg = _masked(c[:, ix["pcol"]], valid)
        top = segment_max(cg, ix["row"], prefixes.n, dim=-1)
        return _factor(cg, top[:, ix["row"]], valid)


class ScaledWalkMatrix:
    """One sparse factor A (n, n) of a stabilised product for S (batch, head) slices: the
    block-diagonal (S n, S n) CSR matrix whose block s has values A_p * factor[s, p].

    prefixes: A's structure (WalkPrefixes); coef: the coefficients A's values are made of (GRF: f;
    RWGNK: a constant [1]); features: the WalkFeatures (or None); values (P,): the current values
    (detached, the compute dtype); factor (S, P) detached, >= 0. ``product(x)`` for x (S n, C) costs
    O(S P C) and is differentiable in x and coef. Memory 2 S P values and S P indices for S > 1.

    >>> import torch
    >>> from fast.masks.grf import ScaledWalkMatrix, WalkPrefixes
    >>> p = WalkPrefixes(2, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]),
    ...                  torch.tensor([1.0, 2.0, 3.0]), 1)
    >>> values = p.values(torch.ones(1), torch.device("cpu"), torch.float64)
    >>> a = ScaledWalkMatrix(p, torch.ones(1), None, values, torch.full((1, 3), 0.5, dtype=torch.float64))
    >>> a.product(torch.ones(2, 1, dtype=torch.float64)).flatten().tolist()    # 0.5 [[1, 2], [0, 3]] 1
    [1.5, 1.5]
    """

    def __init__(self, prefixes: "WalkPrefixes", coef: torch.Tensor, features: "WalkFeatures | None",
                 values: torch.Tensor, factor: torch.Tensor):
        self.prefixes, self.coef, self.features, self.factor = prefixes, coef, features, factor
        self.slices = int(factor.shape[0])
        self._scaled = values.detach()[None, :] * factor  # (S, P)
        self._csr: dict = {}

    def csr(self, transpose: bool) -> torch.Tensor:
        """The block-diagonal CSR (or its transpose: the blocks' transposes), built once."""
        if transpose not in self._csr:
            device = self._scaled.device
            ix = self.prefixes.block_index(device, self.slices)
            n = self.prefixes.n * self.slices
            if transpose:
                vals = self._scaled.index_select(1, ix["perm_t"]).reshape(-1)
                self._csr[transpose] = csr_matrix(ix["crow_t"], ix["col_t"], vals, n)
            else:
                self._csr[transpose] = csr_matrix(ix["crow"], ix["col"], self._scaled.reshape(-1), n)
        return self._csr[transpose]

    def product(self, x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """A' x (transpose: A'^T x) for x (S n, C); differentiable in x and coef."""
        if torch.is_grad_enabled() and (x.requires_grad or self.coef.requires_grad):
            return _WalkProduct.apply(x, self.coef, self.features, transpose, self)
        return self.csr(transpose) @ x


class StabilisedProduct(MaskOperator):
    """The per-call operator behind a stabilised ``attend``: M' = Q' K'^T (K' None: M' = Q') with Q',
    K' ScaledWalkMatrix factors, one block per (batch, head) slice, for
    fast.algebra.masked_products (its blocking and memory-saving backward). matmul(x) / rmatmul(x)
    take x (..., n, c) whose leading dims hold exactly the S slices (ValueError naming x otherwise),
    O(S (P_q + P_k) c). parameters(): those of the mask it stands for.

    >>> import torch
    >>> from fast.masks.grf import ScaledWalkMatrix, StabilisedProduct, WalkPrefixes
    >>> p = WalkPrefixes(2, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]),
    ...                  torch.tensor([1.0, 2.0, 3.0]), 1)
    >>> values = p.values(torch.ones(1), torch.device("cpu"), torch.float64)
    >>> a = ScaledWalkMatrix(p, torch.ones(1), None, values, torch.ones(1, 3, dtype=torch.float64))
    >>> op, dense = StabilisedProduct(2, 1, a, a, []), p.matrix(values, False).to_dense()
    >>> x = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    >>> torch.allclose(op.matmul(x), dense @ dense.T @ x)
    True
    """

    def __init__(self, n: int, slices: int, q_side: ScaledWalkMatrix, k_side: ScaledWalkMatrix | None,
                 params: list[torch.Tensor]):
        self.n, self.slices, self.q_side, self.k_side, self._params = n, slices, q_side, k_side, params

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-2] != self.n or math.prod(x.shape[:-2]) != self.slices:
            raise ValueError(f"x must have shape (..., {self.n}, c) with {self.slices} (batch, head) slices, "
                             f"got {tuple(x.shape)}")
        return x.reshape(self.slices * self.n, x.shape[-1])

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M' x: Q' (K'^T x) per slice, x (..., n, c) -> (..., n, c)."""
        y = self._flat(x)
        if self.k_side is not None:
            y = self.k_side.product(y, transpose=True)
        return self.q_side.product(y).view(x.shape)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M'^T x: K' (Q'^T x) per slice, x (..., n, c) -> (..., n, c)."""
        y = self.q_side.product(self._flat(x), transpose=True)
        if self.k_side is not None:
            y = self.k_side.product(y)
        return y.view(x.shape)

    def parameters(self) -> list[torch.Tensor]:
        return list(self._params)


class WalkFeatures:
    """G (N, N), the GRF matrix of rows phi_hat(v_i) (reid25 Eq. 10) from one walk ensemble and a
    modulation f: E[G] = sum_k f_k W^k.

    graph: anything ``fast.graphs.as_graph`` accepts (the weighted W); walks: sampled on it with
    uniform neighbour choice (fast.walks.Walks or a dict of its fields, ``as_walks``); f: (K + 1,)
    tensor (held, not copied: learnable) or sequence (``as_modulation``); prefixes longer than K hops
    are dropped. Built once in O(total walk length); ``matmul`` / ``rmatmul`` (G x, G^T x for
    x (..., N, c)) cost O(nnz c). ValueError when a walk steps off the graph's edges. Attributes: n,
    f, n_walkers, p_halt, nnz (stored pairs), prefixes (the WalkPrefixes).

    >>> import torch
    >>> from fast import WalkFeatures, sample_walks
    >>> path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])                    # degrees 1, 2, 1
    >>> walks = sample_walks(path, 1, fixed_length=1, generator=torch.Generator().manual_seed(0))
    >>> WalkFeatures(path, walks, [1.0, 0.5]).to_dense().sum(1).tolist()    # f_0 + f_1 deg(i): the load
    [1.5, 2.0, 1.5]
    """

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
        self._sign_key: tuple | None = None
        self._sign = False

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
    def current_values(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The (P,) stored values of G (pair order) with the current f, detached (the cached CSR's)."""
        return self.csr(device, dtype).values()

    def valid_entries(self, values: torch.Tensor) -> torch.Tensor | None:
        """The stored entries that set the stabilisers' maxima: those with a nonzero value (a pair whose
        prefixes all have f_t = 0 holds 0 and must not raise its row's or hub's scale), or None
        (every stored entry) when f requires grad: then no factor may be 0 where the value's
        gradient is not (a zero-valued entry only lowers the scales it takes part in)."""
        return None if self.f.requires_grad else values != 0

    @property
    def nonnegative(self) -> bool:
        """True when the current f >= 0 (the loads are >= 0 since W >= 0), so G >= 0. Read once per
        version of f (f._version and storage; a host sync on CUDA only when f changed; an inference
        tensor keeps no version and is read every time; an edit through ``f.data`` is not seen)."""
        stamp = None if self.f.is_inference() else (id(self.f), self.f._version, self.f.data_ptr())
        if stamp is None or stamp != self._sign_key:
            self._sign = bool((self.f.detach() >= 0).all())
            self._sign_key = stamp
        return self._sign

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
    """The GRF matrix G (reid25 Eq. 10) of ``walks`` on ``graph`` with modulation f: ``WalkFeatures``
    (same arguments, shapes, cost and errors).

    >>> import torch
    >>> from fast import grf_features, sample_walks
    >>> path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    >>> walks = sample_walks(path, 4, p_halt=0.5, generator=torch.Generator().manual_seed(0))
    >>> g = grf_features(path, walks, [1.0, 0.5])
    >>> g.n, tuple(g.to_dense().shape), bool((g.to_dense().diagonal() >= 1.0).all())   # f_0 = 1 on the diagonal
    (3, (3, 3), True)
    """
    return WalkFeatures(graph, walks, f)


def _check_features(name: str, value: object) -> WalkFeatures:
    if not isinstance(value, WalkFeatures):
        raise TypeError(f"{name} must be a WalkFeatures (fast.masks.grf.grf_features(graph, walks, f)), "
                        f"got {type(value).__name__}")
    return value




class GRFMask(LocallyStabilised, MaskOperator):
    """M_hat = G_q G_k^T (reid25 Sec. 3, Algorithm 1): a sparse low-rank mask, O(nnz c) per product.

    features_q, features_k: WalkFeatures of two independent ensembles (unbiased, E M_hat = M_alpha);
    features_k=None: one shared ensemble, G_k = G_q (the diagonal is then biased upwards).
    TypeError naming the argument unless it is a WalkFeatures, ValueError when the two are for
    graphs of different sizes. matmul(x) = G_q (G_k^T x), rmatmul(x) = G_k (G_q^T x) for
    x (..., N, c); nonnegative when both f >= 0; abs_matmul with |f|. The FAVOR+ attend is
    stabilised per key (docs/papers.md, fast.masks.grf).

    >>> import torch
    >>> from fast import GRFMask, grf_features, sample_walks
    >>> g = torch.Generator().manual_seed(0)
    >>> path = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> fq, fk = (grf_features(path, sample_walks(path, 4, p_halt=0.5, generator=g), [1.0, 0.5]) for _ in "qk")
    >>> x = torch.rand(4, 2, generator=g, dtype=torch.float64)
    >>> torch.allclose(GRFMask(fq, fk).matmul(x), fq.to_dense() @ fk.to_dense().T @ x)
    True
    """

    def __init__(self, features_q: WalkFeatures, features_k: WalkFeatures | None = None):
        self.features_q = _check_features("features_q", features_q)
        self.shared = features_k is None
        self.features_k = self.features_q if features_k is None else _check_features("features_k", features_k)
        if self.features_k.n != self.features_q.n:
            raise ValueError(f"features_q and features_k must be for one graph, got N = {self.features_q.n} "
                             f"and N = {self.features_k.n}")
        self.n = self.features_q.n

    def _attend_stabilised(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 with M = G_q G_k^T for phi_q, phi_k (..., N, m),
        v (..., N, d) (S slices) and detached key constants c (S, N): the true products times exp(-r_i)
        (docs/papers.md, fast.masks.grf); gradients reach phi_q, phi_k, v and f on both sides.
        """
        work = phi_k.dtype
        fq, fk = self.features_q, self.features_k
        vq, vk = fq.current_values(c.device, work), fk.current_values(c.device, work)
        factor_q, factor_k = stabilising_factors(c, fq.prefixes, fq.valid_entries(vq), fk.prefixes,
                                                 fk.valid_entries(vk))
        op = StabilisedProduct(self.n, c.shape[0], ScaledWalkMatrix(fq.prefixes, fq.f, fq, vq, factor_q),
                               ScaledWalkMatrix(fk.prefixes, fk.f, fk, vk, factor_k), self.parameters())
        return plain_attend(op, phi_q, phi_k, v)

    def _apply(self, x: torch.Tensor, first: WalkFeatures, second: WalkFeatures, absolute: bool = False):
        flat, lead, _ = _flatten(x, self.n)
        y = second.product(first.product(flat, transpose=True, absolute=absolute), absolute=absolute)
        return _unflatten(y, lead, x)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M x = G_q (G_k^T x) for x (..., N, c) -> (..., N, c)."""
        return self._apply(x, self.features_k, self.features_q)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T x = G_k (G_q^T x) for x (..., N, c) -> (..., N, c)."""
        return self._apply(x, self.features_q, self.features_k)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
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


class GRFAsymMask(LocallyStabilised, MaskOperator):
    """M_hat = G (asymmetric GRFs, reid25 App. D, Eq. 24): the key side one-hot, f = alpha.

    features: a WalkFeatures (TypeError otherwise). matmul(x) = G x, rmatmul(x) = G^T x for
    x (..., N, c), O(nnz c); nonnegative when alpha >= 0. Masked linear attention with it is Eq. 26
    / Algorithm 2, correctly normalised (the printed algorithm divides by an extra n). The FAVOR+
    attend is stabilised per key (docs/papers.md, fast.masks.grf).

    >>> import torch
    >>> from fast import GRFAsymMask, grf_features, sample_walks
    >>> g = torch.Generator().manual_seed(0)
    >>> path = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> features = grf_features(path, sample_walks(path, 4, p_halt=0.5, generator=g), [1.0, 0.5, 0.25])
    >>> x = torch.rand(4, 2, generator=g, dtype=torch.float64)
    >>> torch.allclose(GRFAsymMask(features).matmul(x), features.to_dense() @ x)
    True
    """

    def __init__(self, features: WalkFeatures):
        self.features = _check_features("features", features)
        self.n = features.n

    def _attend_stabilised(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As GRFMask's with M = G: G's values times exp(c_j - r_i) per slice; gradients reach phi_q, phi_k,
        v and alpha.
        """
        work = phi_k.dtype
        g = self.features
        values = g.current_values(c.device, work)
        factor = row_factors(c, g.prefixes, g.valid_entries(values))
        op = StabilisedProduct(self.n, c.shape[0], ScaledWalkMatrix(g.prefixes, g.f, g, values, factor), None,
                               self.parameters())
        return plain_attend(op, phi_q, phi_k, v)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """G x for x (..., N, c) -> (..., N, c)."""
        return self.features.matmul(x)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """G^T x for x (..., N, c) -> (..., N, c)."""
        return self.features.rmatmul(x)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
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
