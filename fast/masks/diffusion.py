"""Graph diffusion-kernel masks M = exp(-lambda T) as an action on vectors (choromanski22 Sec. 4,
Thm. 4.1; docs/papers.md Sec. 3). Dense twin: reference/masks/diffusion.py.

For a graph W >= 0 (symmetric) with weighted degrees d and D = diag(d), T is L = D - W
("laplacian"), L D^-1 ("random-walk") or -W ("adjacency"). ``DiffusionMask`` (and the function
``expm_action``) shifts T to a nonnegative B = c I - T and applies the uniformised Taylor series
exp(-lambda T) x = g sum_k pois(k; Theta) Bh^k x, planned a priori (``plan_terms``) so that
||y - M x||_1 <= tol g ||x||_1 per column: x (..., N, c) -> (..., N, c) in
O((Theta + sqrt(Theta log 1/tol)) (|E| + N) c), Theta = lambda ||B||_1, with no cancellation
between terms and no host sync per product. Derivation, error bound, round-off, learnable
lambda and limits: docs/papers.md, fast.masks.diffusion.

FAVOR+ keys are stabilised per key (fast.stabilizers.LocallyStabilised), as the other graph masks
are: a row of M weighs nearby keys far more than distant ones, so one constant per (batch, head)
slice lets the keys near a quiet query underflow in float32 (an isolated node sees only itself).
The stabilised ``attend`` runs the same series on scaled products (``StabilisedSeries``: it forms
them at each call and has no rmatmul, so it costs more than the plain series, training most);
fast.favor_attention first takes ``attend_optimistic`` (the plain series, keys back at one constant
per slice) and runs the stabilised one only when a denominator is too small to trust.
"""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import torch

from fast.graphs import Graph, as_graph
from fast.operator import MaskOperator
from fast.segments import Segments, segment_max
from fast.sparse import block_diagonal_index, csr_matmul, csr_matrix, index_dtype
from fast.stabilizers import LocallyStabilised, plain_attend, stabilised_inputs
from fast.scaling import times_pow2, value_shift
from fast.validation import check_allocation, check_diffusion_time, check_positive_int, check_tokens, compute_dtype, finite_flag

__all__ = ["KINDS", "DiffusionMask", "StabilisedSeries", "expm_action", "poisson_tail", "plan_terms", "ADJACENCY_STEP_THETA",
           "MAX_PRODUCTS"]

#: The generators T of Thm. 4.1: L = D - W, L D^-1, -W.
KINDS = ("laplacian", "random-walk", "adjacency")

#: Largest theta = lambda d_max / s of one step of the adjacency kind: its Taylor weights theta^k / k!
#: peak near e^theta / sqrt(2 pi theta), far inside float32's range (3e38 = e^88.7).
ADJACENCY_STEP_THETA = 32.0

#: Largest number of sparse products (steps * terms) a plan may need; beyond it DiffusionMask refuses
#: (about lam * beta products: an absurd diffusion time or weight scale, not a useful mask).
MAX_PRODUCTS = 100_000

#: Candidate step counts tried above the smallest admissible one (the cost s m grows with s).
_STEP_SEARCH = 16


def _poisson_pmf(theta: float, k_end: int) -> np.ndarray:
    """pois(k; theta) for k = 0..k_end (float64), theta > 0, by the ratio recurrence outward from the
    mode floor(theta) (each ratio <= 1: no overflow; relative error ~ 2 |k - mode| u), divided by
    the sum over 0..max(k_end, K) with K = theta + 10 sqrt(theta) + 50 (the mass beyond K < 1e-20)."""
    full = max(int(k_end), int(theta + 10.0 * math.sqrt(theta) + 50.0))
    mode = min(int(math.floor(theta)), full)
    p = np.empty(full + 1)
    p[mode] = 1.0
    if mode < full:  # p_k = p_(k-1) theta / k, k > mode: ratios < 1
        p[mode + 1:] = np.cumprod(theta / np.arange(mode + 1, full + 1, dtype=np.float64))
    if mode > 0:  # p_(k-1) = p_k k / theta, k <= mode: ratios <= 1
        p[:mode] = np.cumprod(np.arange(mode, 0, -1, dtype=np.float64) / theta)[::-1]
    p /= p.sum()
    return p[: int(k_end) + 1]


def _tails(theta: float, k_end: int) -> np.ndarray:
    """tails[k] = P(Poisson(theta) > k) for k = 0..k_end (float64, summed from the top: no cancellation).

    The mass beyond k_end is bounded by pmf(k_end) r / (1 - r), r = theta / (k_end + 1) < 1, and added,
    so every entry is an upper bound up to round-off."""
    if theta == 0.0:
        return np.zeros(k_end + 1)
    pmf = _poisson_pmf(theta, k_end)
    r = theta / (k_end + 1)
    rest = pmf[-1] * r / (1.0 - r)
    above = np.cumsum(pmf[::-1])[::-1]  # above[k] = sum_{j >= k} pmf_j (j <= k_end)
    out = np.empty(k_end + 1)
    out[:-1] = above[1:] + rest
    out[-1] = rest
    return out


def poisson_tail(m: int, theta: float) -> float:
    """P(Poisson(theta) > m) (float64): the 1-norm of the omitted terms of one uniformised step.

    m: an int >= 0; theta: a finite real >= 0 (ValueError naming m or theta otherwise). Summed from
    the top with the far tail bounded, so never below the true value up to round-off; O(theta +
    sqrt(theta) + m).

    >>> from fast.masks.diffusion import poisson_tail
    >>> round(poisson_tail(2, 1.0), 6)      # 1 - (1 + 1 + 1/2) / e
    0.080301
    """
    check_positive_int("m", m, "an int >= 0", minimum=0)
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not math.isfinite(theta) or theta < 0:
        raise ValueError(f"theta must be a finite real >= 0, got {theta!r}")
    k_end = int(max(m, theta) + 10 * math.sqrt(theta) + 50)
    check_allocation(f"m = {m}, theta = {theta!r}", (k_end + 1,), torch.float64, copies=4,
                     what="the Poisson weights and tails")
    return float(_tails(float(theta), k_end)[int(m)])


def _min_terms(theta: float, target: float, m_min: int) -> tuple[int, float]:
    """The smallest m >= m_min with P(Poisson(theta) > m) <= target, and that tail."""
    k_end = int(theta + 10 * math.sqrt(theta) + 50)
    while True:
        tails = _tails(theta, k_end)
        ok = np.flatnonzero(tails[m_min:] <= target) if m_min <= k_end else np.zeros(0, dtype=int)
        if ok.size:
            m = int(ok[0]) + m_min
            return m, float(tails[m])
        k_end *= 2


def plan_terms(theta_total: float, tol: float, *, steps: int | None = None,
               max_step_theta: float = math.inf) -> tuple[int, int, float]:
    """(s, m, bound): s steps of m-term series for exp(Theta (Bh - I)) with Theta = theta_total >= 0,
    minimising s * m subject to bound = s * P(Poisson(Theta / s) > m) <= tol and
    Theta / s <= max_step_theta; ``steps`` fixes s instead. Theta = 0 gives (1, 1, 0.0): one term,
    so that a learnable lambda at 0 still gets the exact first derivative -T x. O(Theta) per
    candidate s. ValueError naming theta_total (not a finite real >= 0), tol (not in (0, 1)), steps (not
    None or an int >= 1) or max_step_theta (not a positive real, inf allowed); MemoryError naming
    theta_total when its Poisson weights (about Theta + 10 sqrt(Theta) numbers) would not fit.

    >>> from fast.masks.diffusion import plan_terms
    >>> s, m, bound = plan_terms(10.0, 1e-8)
    >>> s, m, bound <= 1e-8
    (1, 32, True)
    """
    if isinstance(theta_total, bool) or not isinstance(theta_total, numbers.Real) or \
            not math.isfinite(theta_total) or theta_total < 0:
        raise ValueError(f"theta_total must be a finite real >= 0 (Theta = lam * beta), got {theta_total!r}")
    tol = _check_tol(tol)
    if steps is not None:
        steps = check_positive_int("steps", steps, "None (planned) or an int >= 1")
    if isinstance(max_step_theta, bool) or not isinstance(max_step_theta, numbers.Real) or \
            not float(max_step_theta) > 0:
        raise ValueError(f"max_step_theta must be a positive real (inf: no limit), got {max_step_theta!r}")
    theta_total = float(theta_total)
    if theta_total == 0.0:
        return 1, 1, 0.0
    check_allocation(f"theta_total = {theta_total!r}", (int(theta_total + 10 * math.sqrt(theta_total) + 51),),
                     torch.float64, copies=4, what="the Poisson weights and tails")
    if steps is not None:
        candidates = [int(steps)]
    else:
        lo = max(1, math.ceil(theta_total / max_step_theta)) if math.isfinite(max_step_theta) else 1
        candidates = list(range(lo, lo + _STEP_SEARCH))
    best = None
    for s in candidates:
        m, tail = _min_terms(theta_total / s, tol / s, 1)
        if best is None or s * m < best[0] * best[1]:
            best = (s, m, s * tail)
    return best


def check_kind(kind: object) -> str:
    """kind when it is one of KINDS ("laplacian", "random-walk", "adjacency"), else ValueError naming
    kind.

    >>> from fast.masks.diffusion import check_kind
    >>> check_kind("random-walk")
    'random-walk'
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (T = D - W, L D^-1, -W), got {kind!r}")
    return kind


def _check_tol(tol: object) -> float:
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"tol must be a real number in (0, 1) (the truncation error relative to |x|), got {tol!r}")
    return float(tol)


def _check_lam(lam: object) -> float | torch.Tensor:
    """fast.validation.check_diffusion_time: lam >= 0, a tensor kept as given."""
    return check_diffusion_time(lam, positive=False)


def _lam_value(lam: float | torch.Tensor) -> float:
    value = float(lam.detach()) if isinstance(lam, torch.Tensor) else float(lam)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"lam must be a finite diffusion time >= 0, got {value!r} (changed after construction)")
    return value


def _version_of(t: object) -> int | None:
    """t's version counter (bumped by every in-place update), or None for a non-tensor or an
    inference tensor (made under torch.inference_mode: it keeps no version counter)."""
    if not isinstance(t, torch.Tensor) or t.is_inference():
        return None
    return t._version


#: The series' working set (the vectors v, acc and a product's output, about 4 of (N, c)) is kept
#: within this many bytes on the CPU by running it on column blocks: every product re-reads them, and
#: once they spill from the caches each product streams them from memory (docs/papers.md,
#: fast.masks.diffusion).
CHAIN_CACHE_BYTES = 8 * 2**20
#: ... but never narrower than this (a sparse product's cost per column rises below it).
MIN_CHAIN_COLUMNS = 16


def chain_columns(n: int, c: int, itemsize: int) -> int:
    """Columns per block of a chain of sparse products on (n, c) x with ``itemsize``-byte entries: all
    c when 4 vectors fit CHAIN_CACHE_BYTES, else the most that do, at least MIN_CHAIN_COLUMNS. O(1).

    >>> from fast.masks.diffusion import chain_columns
    >>> chain_columns(1000, 64, 4), chain_columns(2**20, 64, 4)
    (64, 16)
    """
    fit = CHAIN_CACHE_BYTES // (4 * n * itemsize)
    return c if fit >= c else max(MIN_CHAIN_COLUMNS, fit)


class DiffusionMask(LocallyStabilised, MaskOperator):
    """M = exp(-lam T) (n, n) for T = L, L D^-1 or -W of ``graph`` (kind "laplacian", "random-walk",
    "adjacency"; choromanski22 Thm. 4.1), applied by the uniformised Taylor series on sparse CSR.

    graph: anything fast.graphs.as_graph accepts; lam >= 0 finite: a real number or a one-element
    tensor (may require grad: a learnable diffusion time, returned by parameters()), read as a
    float64; tol in (0, 1): the a priori truncation bound ||y - M x||_1 <= tol * norm_bound *
    ||x||_1 per column (infinity-norm for rmatmul of random-walk); steps: None (planned) or a fixed
    s >= 1. ``matmul`` / ``rmatmul`` take x (..., n, c) of any float dtype (half computes in float32)
    and cost s m CSR products for all columns at once, O(s m (|E| + n) c). Plan attributes:
    ``steps``, ``terms``, ``products``, ``error_bound``, ``norm_bound`` (1, or e^(lam d_max) for
    adjacency), ``shift``, ``beta``. Raises ValueError naming kind, tol, steps or lam when invalid,
    and when the plan needs more than MAX_PRODUCTS products (or, for adjacency with fixed steps,
    more than ADJACENCY_STEP_THETA per step).

    FAVOR+ keys get one constant each (``key_stabilizer``, fast.stabilizers); ``attend(phi_q, phi_k,
    v, key_log_scale=c)`` undoes them on scaled products (``StabilisedSeries``), so float32 refuses
    only the rows float64 refuses. ``attend_optimistic`` (the driver's first route, fast.operator) runs
    the plain series with the keys back at one constant per slice, and flags the call for
    ``attend_exact`` (= attend) when a denominator is below what underflow could have changed.

    >>> import torch
    >>> from fast import DiffusionMask
    >>> edges = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])      # a path of 4 nodes
    >>> op = DiffusionMask(edges, 0.5, tol=1e-12)
    >>> w = op.graph.csr().to_dense()
    >>> laplacian = torch.diag(w.sum(1)) - w
    >>> x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> torch.allclose(op.matmul(x), torch.linalg.matrix_exp(-0.5 * laplacian) @ x)
    True
    """

    #: exp(-lam T) >= 0 entrywise for every kind (B >= 0: every series term is >= 0).
    nonnegative = True

    def __init__(self, graph, lam: float | torch.Tensor, kind: str = "laplacian", tol: float = 1e-8, *,
                 steps: int | None = None):
        self.kind = check_kind(kind)
        self.tol = _check_tol(tol)
        if steps is not None:
            check_positive_int("steps", steps, "None (planned) or an int >= 1")
        self._fixed_steps = None if steps is None else int(steps)
        self.lam = _check_lam(lam)
        self._row_gain = 1.0  # a bound on ||Bh^k||_inf over k (rows of Bh sum to 1 or less; random-walk below)
        self.graph: Graph = as_graph(graph)
        g = self.graph
        self.n = g.n
        d = g.weighted_degree
        d_max = float(d.max()) if g.n else 0.0
        iso = d == 0
        n_idx = torch.arange(g.n, device=g.device)
        loop = g.row == g.col
        edges = torch.ones_like(loop)  # stored entries of W that enter B
        if self.kind == "laplacian":
            # B = c I - L: off-diagonal w_ij, diagonal c - o_i with o_i = d_i - w_ii summed over the
            # off-diagonal entries only (exact >= 0 diagonal; a heavy loop never enters o_i)
            # segment sums (fast.segments), not index_add_: its atomics give other bits at every CUDA run
            off = Segments(g.row[~loop], g.n, sorted=True).sum(g.weight[~loop], dim=0)
            c = float(off.max()) if g.n else 0.0
            self.shift, self.beta = c, c
            edges = ~loop  # the loops live in the diagonal c - o_i
            values, diag = (g.weight / c, (c - off) / c) if c > 0 else (g.weight, torch.zeros_like(d))
            values_t = None  # symmetric
        elif self.kind == "random-walk":
            self.shift, self.beta = 1.0, 1.0
            d_plus = torch.where(iso, torch.zeros_like(d), 1.0 / torch.where(iso, torch.ones_like(d), d))
            values = g.weight * d_plus[g.col]  # (W D^+)_ij = w_ij / d_j
            values_t = g.weight * d_plus[g.row]  # (D^+ W)_ij = w_ij / d_i: same pattern, W is symmetric
            diag = iso.to(torch.float64)
            # ||Bh^k||_inf <= d_max / d_min over the nodes with edges: Bh = D P D^-1 there, P = D^-1 W
            # row-stochastic (an isolated node's row is its own 1); read by _trust_floor
            self._row_gain = float(d.max() / d[~iso].min()) if bool((~iso).any()) else 1.0
        else:
            self.shift, self.beta = 0.0, d_max
            values = g.weight / d_max if d_max > 0 else g.weight
            diag = torch.zeros_like(d)
            values_t = None
        # T = 0 exactly (then M = I, no product): no edges (adjacency), or only self-loops (L = D - W = 0)
        self._generator_is_zero = g.num_edges == 0 or (self.kind != "adjacency" and bool(loop.all()))
        # Bh (and Bh^T) as CSR with the diagonal merged in: one SpMM per series term.
        keep = diag != 0
        rows = torch.cat([g.row[edges], n_idx[keep]])
        cols = torch.cat([g.col[edges], n_idx[keep]])
        self._parts = {}
        for name, vals in (("a", values), ("t", values_t)):
            if vals is None:
                continue
            with warnings.catch_warnings():  # sparse beta/invariant notices: the indices are canonical here
                warnings.simplefilter("ignore", UserWarning)
                coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.cat([vals[edges], diag[keep]]),
                                              (g.n, g.n), check_invariants=False).coalesce()
                csr = coo.to_sparse_csr()
            index = index_dtype(csr.values().numel(), g.n)
            self._parts[name] = (csr.crow_indices().to(index), csr.col_indices().to(index), csr.values())
        self._cache: dict = {}
        self.replan()

    # ------------------------------------------------------------------ the plan

    def replan(self) -> None:
        """Recompute the plan (s, m) for the current value of lam (reads it: one host sync); call it after
        an edit through ``lam.data``, which the version counter misses. ValueError when the plan needs
        more than MAX_PRODUCTS products, or (adjacency) when a fixed ``steps`` leaves more than
        ADJACENCY_STEP_THETA per step; the previous plan is then kept.
        """
        value = _lam_value(self.lam)
        version = _version_of(self.lam)
        theta_total = value * self.beta
        if self._generator_is_zero:  # M = I exactly
            steps, terms, bound = 1, 0, 0.0
        else:
            what = (f"DiffusionMask(kind={self.kind!r}, lam={value!r}, tol={self.tol!r}) on a graph with "
                    f"beta = {self.beta!r} (Theta = lam * beta = {theta_total!r})")
            if self.kind == "adjacency" and self._fixed_steps is not None and \
                    theta_total / self._fixed_steps > ADJACENCY_STEP_THETA:
                need = math.ceil(theta_total / ADJACENCY_STEP_THETA)
                raise ValueError(f"{what}: steps={self._fixed_steps} leaves theta = Theta / steps = "
                                 f"{theta_total / self._fixed_steps!r} per step, above ADJACENCY_STEP_THETA = "
                                 f"{ADJACENCY_STEP_THETA} (the step's weights e^theta pois(k; theta) would overflow); "
                                 f"pass steps >= {need} or steps=None (planned)")
            # every plan needs s m >= about Theta products (m >= theta per step): refuse before planning
            if theta_total > MAX_PRODUCTS + 1:
                raise ValueError(f"{what} needs at least about {math.floor(theta_total)} sparse products per call, "
                                 f"more than MAX_PRODUCTS = {MAX_PRODUCTS}; reduce lam or the scale of the graph's "
                                 f"weights (beta), since the cost grows like lam * beta")
            limit = ADJACENCY_STEP_THETA if self.kind == "adjacency" else math.inf
            steps, terms, bound = plan_terms(theta_total, self.tol, steps=self._fixed_steps, max_step_theta=limit)
            if steps * terms > MAX_PRODUCTS:
                raise ValueError(f"{what} needs {steps * terms} sparse products per call ({steps} steps of {terms} "
                                 f"terms), more than MAX_PRODUCTS = {MAX_PRODUCTS}; reduce lam or the scale of the "
                                 f"graph's weights (beta), raise tol, or leave steps=None")
        self._planned_value, self._planned_version = value, version
        self.steps, self.terms, self.error_bound = steps, terms, bound
        self.products = self.steps * self.terms
        exponent = value * (self.beta - self.shift)  # 0 except for adjacency
        self.norm_bound = math.exp(exponent) if exponent < 709.0 else math.inf
        self._weights = self._float_weights(theta_total / self.steps)

    def _float_weights(self, theta: float) -> list[float]:
        """Per-step series weights w_0..w_m as Python floats: pois(k; theta) by the ratio recurrence from
        the mode, normalised (docs/papers.md, fast.masks.diffusion), times e^theta for adjacency.
        """
        m = self.terms
        if theta == 0.0:
            return [1.0] + [0.0] * m
        w = _poisson_pmf(theta, m)
        if self.kind == "adjacency":
            w = w * math.exp(theta)
        return [float(v) for v in w]

    def _tensor_weights(self, lam: torch.Tensor) -> torch.Tensor:
        """The same weights as a differentiable function of lam (float64, lam's device): the planned
        weights (at lam0 = the planned value) times pois(k; theta) / pois(k; theta0) =
        exp(k log(lam / lam0) - (theta - theta0)) (adjacency: (lam / lam0)^k): equal to them when
        lam = lam0, with the exact derivatives of the Poisson (Taylor) weights."""
        m = self.terms
        lam = lam.reshape(()).to(torch.float64)
        scale = self.beta / self.steps
        k = torch.arange(m + 1, dtype=torch.float64, device=lam.device)
        lam0 = self._planned_value
        if lam0 == 0.0:  # log(0): use the polynomial form (m = 1 here: w = e^-theta [1, theta])
            theta = lam * scale
            w = torch.pow(theta, k.clamp(min=1.0)) / torch.exp(torch.lgamma(k + 1))
            w = torch.where(k == 0, torch.ones_like(w), w)
            if self.kind != "adjacency":
                w = w * torch.exp(-theta)
            return w
        base = torch.tensor(self._weights, dtype=torch.float64, device=lam.device)
        log_ratio = k * torch.log(lam / lam0)  # exactly 0 at lam = lam0
        if self.kind != "adjacency":
            log_ratio = log_ratio - (lam - lam0) * scale
        return base * torch.exp(log_ratio)

    def _check_plan(self) -> None:
        lam = self.lam
        if not isinstance(lam, torch.Tensor):
            return
        if lam.device.type == "cpu":
            if float(lam.detach()) != self._planned_value:
                self.replan()
        else:
            version = _version_of(lam)
            if version is None or version != self._planned_version:  # an inference tensor has no version
                self.replan()

    # ------------------------------------------------------------------ products

    def _csr_of(self, which: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if which == "t" and "t" not in self._parts:
            which = "a"  # symmetric kinds
        key = (which, str(device), dtype)
        if key not in self._cache:
            crow, col, vals = self._parts[which]
            self._cache[key] = csr_matrix(crow.to(device), col.to(device), vals.to(device=device, dtype=dtype), self.n)
        return self._cache[key]

    def _product(self, x: torch.Tensor, transpose: bool) -> torch.Tensor:
        check_tokens("x", x, self.n)
        self._check_plan()
        work = compute_dtype(x.dtype)
        lead, c = x.shape[:-2], x.shape[-1]
        y = x.to(work).movedim(-2, 0).reshape(self.n, -1)  # (N, batch * c): one SpMM for all columns
        if self.terms == 0:
            return x.clone()  # T = 0: M = I (a new tensor, as every other product returns)
        a = self._csr_of("t" if transpose else "a", x.device, work)
        a_t = self._csr_of("a" if transpose else "t", x.device, work)
        learn = isinstance(self.lam, torch.Tensor) and self.lam.requires_grad and torch.is_grad_enabled()
        w = self._tensor_weights(self.lam).to(device=x.device, dtype=work) if learn else None
        width = chain_columns(self.n, y.shape[1], y.element_size()) if y.device.type == "cpu" else y.shape[1]
        if width < y.shape[1]:  # columns are independent: each block runs the whole chain while it is cached
            y = torch.cat([self._series(y[:, i:i + width], a, a_t, w) for i in range(0, y.shape[1], width)], 1)
        else:
            y = self._series(y, a, a_t, w)
        return y.reshape(self.n, *lead, c).movedim(0, -2).to(x.dtype)

    def _series(self, y: torch.Tensor, a: torch.Tensor, a_t: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        """The planned steps x terms of the series on y (N, c); w: the differentiable weights of a
        learnable lam (None: the planned floats)."""
        learn = w is not None
        grad_x = torch.is_grad_enabled() and y.requires_grad
        for _ in range(self.steps):
            v = y
            acc = v * (w[0] if learn else self._weights[0])
            for k in range(1, self.terms + 1):
                v = csr_matmul(a, v, a_t)
                if learn:
                    acc = torch.addcmul(acc, w[k], v)
                else:
                    acc = acc.add(v, alpha=self._weights[k]) if grad_x else acc.add_(v, alpha=self._weights[k])
            y = acc
            grad_x = grad_x or learn
        return y

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """exp(-lam T) @ x for x (..., n, c) -> (..., n, c): s m CSR products, O(s m (|E| + n) c)."""
        return self._product(x, transpose=False)

    def _attend_stabilised(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 for key features phi_k = exp(z - c) and
        detached key constants c (S, N): the true products times exp(-r_i) per query row
        (``StabilisedSeries``); gradients reach phi_q, phi_k, v and a learnable lam."""
        return plain_attend(StabilisedSeries(self, c), phi_q, phi_k, v)

    def attend_optimistic(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                          key_log_scale: torch.Tensor) -> tuple[object, torch.Tensor | None]:
        """((num, den), trusted) for fast.favor_attention without a host read (the contract's optimistic
        attend, fast.operator): the keys brought back to one constant per (batch, head) slice, R = max_j
        c_j (phi_k exp(c - R) <= phi_k), and the plain series (matmul; rmatmul in the backward), which
        costs what it did before per-key constants (less than ``StabilisedSeries``). The result
        is the true (num, den) times exp(-R). trusted (0-dim bool): every den_i is normal, finite and at
        least ``_trust_floor``, so the keys that underflowed under R (and the series' own underflow) change
        it by less than a unit of round-off; where it reads False the driver calls ``attend_exact`` (the
        per-key series), which refuses only what float64 refuses. A subclass that overrides ``attend``
        gets the contract's default."""
        if type(self).attend is not LocallyStabilised.attend:
            return super().attend_optimistic(phi_q, phi_k, v, key_log_scale)
        phi_q, phi_k, v, c = stabilised_inputs(self.n, phi_q, phi_k, v, key_log_scale)
        if c.shape[0] == 0:  # an empty batch: the exact route's zeros
            return super().attend_optimistic(phi_q, phi_k, v, key_log_scale)
        with torch.no_grad():
            factor = torch.exp(c - c.amax(-1, keepdim=True)).reshape(*phi_k.shape[:-1], 1)  # <= 1, detached
        num, den = plain_attend(self, phi_q, phi_k * factor, v)
        with torch.no_grad():
            low = den.detach()
            trusted = ((low >= self._trust_floor(phi_q)) & (low >= torch.finfo(low.dtype).tiny)
                       & (low <= torch.finfo(low.dtype).max)).all()  # NaN: False
        return (num, den), trusted

    def _trust_floor(self, phi_q: torch.Tensor) -> torch.Tensor:
        """The least den_i (..., N) that the optimistic attend trusts: sum_a |phi_q_ia| G (P + s + 1) tiny / eps,
        G = norm_bound * _row_gain >= ||g Bh^k||_inf, P + s + 1 operations of the series. Each key feature and
        each vector of the series loses at most tiny (flushed) per entry to underflow, so den_i loses at most
        sum_a |phi_q_ia| G (P + s + 1) tiny: at this floor, a relative eps (a unit of round-off). inf (never
        trusted) where G is. O(N m)."""
        info = torch.finfo(phi_q.dtype)
        scale = self.norm_bound * self._row_gain * (self.products + self.steps + 1) * (info.tiny / info.eps)
        return phi_q.detach().abs().sum(-1) * scale

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """exp(-lam T)^T @ x = exp(-lam T^T) x for x (..., n, c) (T^T = T except random-walk: D^-1 L)."""
        return self._product(x, transpose=True)

    def __repr__(self) -> str:
        return (f"DiffusionMask(n={self.n}, kind={self.kind!r}, lam={self._planned_value!r}, tol={self.tol!r}, "
                f"steps={self.steps}, terms={self.terms})")


#: Bytes of scaled products (values, their transposes and the gains) a StabilisedSeries keeps for the
#: length of one attend call; beyond it each product's scaled values are formed at each use.
SCALED_CACHE_BYTES = 256 * 2**20


class StabilisedSeries(MaskOperator):
    """The per-call operator of DiffusionMask's stabilised attend, for key constants c (S, N) of S
    (batch, head) slices: M'_ij = exp(-r_i) M_ij exp(c_j) per slice, M = exp(-lam T) by the same
    planned series (steps s, terms m, weights w_k) on the same Bh.

    Each vector of the series is kept as exp(l) * v~ with a per-node log level l (S, N): the input's
    level is c; a product Bh moves it to l'_i = max of l_j over row i's stored entries, so the scaled
    product is the CSR with values Bh_ij exp(l_j - l'_i) <= Bh_ij (nothing can overflow, and the
    largest key a row reaches keeps its own units); the sum of a step's terms is taken at the level
    L = max_k l_k, term k weighted w_k exp(l_k - L) <= w_k; the next step starts from L, and r is the
    last step's L. The levels depend on c only: they are formed once here (O(s m S |E|)), the scaled
    products at the first product of the call (O(S |E|) each beside its O(S |E| c); kept while they fit
    SCALED_CACHE_BYTES, else formed at each use). matmul(x) takes x (..., n, c) whose
    leading dims hold exactly the S slices (ValueError naming x otherwise), O(s m S (|E| + n) c),
    differentiable in x and lam; no rmatmul (the driver's backward differentiates matmul).

    >>> import torch
    >>> from fast import DiffusionMask
    >>> from fast.masks.diffusion import StabilisedSeries
    >>> mask = DiffusionMask(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 0.5, tol=1e-12)
    >>> c = torch.tensor([[0.0, 3.0, -2.0]], dtype=torch.float64)
    >>> x = torch.rand(3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> y = StabilisedSeries(mask, c).matmul(x)      # exp(-r) * M (exp(c) * x), r: the row levels
    >>> r = torch.tensor([3.0, 3.0, 3.0], dtype=torch.float64)   # every row reaches node 1
    >>> torch.allclose(y, torch.exp(-r)[:, None] * mask.matmul(torch.exp(c[0])[:, None] * x))
    True
    """

    def __init__(self, mask: DiffusionMask, c: torch.Tensor):
        mask._check_plan()
        self.n, self.mask, self.slices = mask.n, mask, int(c.shape[0])
        device = c.device
        crow, col, _ = mask._parts["a"]
        self._crow, self._col = crow.to(device), col.to(device, torch.int64)
        self._row = torch.repeat_interleave(torch.arange(self.n, device=device), self._crow[1:] - self._crow[:-1],
                                            output_size=self._col.numel())
        self._steps: list[list[torch.Tensor]] = []  # per step: the levels l_0..l_m (S, N)
        self._tops: list[torch.Tensor] = []  # per step: L (S, N)
        self._index: dict = {}  # the block-diagonal index and the scaled products, built at first use
        if mask.terms == 0:  # M = I: M' = I (r = c)
            return
        # a term of weight 0 (lam = 0, or underflow) adds nothing: its level must not set the scale L of a row
        # (a learnable lam's weights vary, so then every term counts)
        learnable = isinstance(mask.lam, torch.Tensor) and mask.lam.requires_grad
        counted = [learnable or weight != 0.0 for weight in mask._weights]
        with torch.no_grad():
            level = c.detach()
            for _ in range(mask.steps):
                levels = [level]
                for _ in range(mask.terms):
                    levels.append(segment_max(levels[-1][:, self._col], self._row, self.n, dim=-1))
                # L: finite (a counted term's level is finite on every row that has entries, and l_0 is
                # finite); no counted term's level exceeds it
                top = torch.stack([lv for lv, keep in zip(levels, counted) if keep]).amax(0)
                self._steps.append(levels)
                self._tops.append(top)
                level = top

    def _block_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        if "block" not in self._index:
            self._index["block"] = block_diagonal_index(self._crow, self._col, self.n, self.slices)
        return self._index["block"]

    def _scaled(self, before: torch.Tensor, after: torch.Tensor, dtype: torch.dtype, transpose: bool) -> torch.Tensor:
        """The block-diagonal CSR (S n, S n) of one scaled product: values Bh_ij exp(l_j - l'_i) (transpose:
        the blocks' transposes, Bh^T's values on the same symmetric pattern with the roles of i, j swapped)."""
        part = "t" if transpose and "t" in self.mask._parts else "a"  # symmetric kinds: Bh^T = Bh
        vals = self.mask._parts[part][2].to(device=before.device, dtype=dtype)
        rows, cols = (self._col, self._row) if transpose else (self._row, self._col)
        safe = torch.where(after > -torch.inf, after, torch.zeros_like(after))  # l' = -inf: a row without entries
        values = vals * torch.exp(before[:, cols] - safe[:, rows]).to(dtype)
        crow, bcol = self._block_index()
        return csr_matrix(crow, bcol, values.reshape(-1), self.n * self.slices)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-2] != self.n or math.prod(x.shape[:-2]) != self.slices:
            raise ValueError(f"x must have shape (..., {self.n}, c) with {self.slices} (batch, head) slices, "
                             f"got {tuple(x.shape)}")
        return x.reshape(self.slices * self.n, x.shape[-1])

    def _products(self, dtype: torch.dtype, transposes: bool) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per step, per term k >= 1: (the scaled CSR, its transpose or itself), and per step the gains
        exp(l_k - L) (S n, 1); kept on the operator (one attend call) while they fit SCALED_CACHE_BYTES,
        so the driver's feature blocks and the column blocks reuse them."""
        key = (dtype, transposes)
        if key in self._index:
            return self._index[key]
        out = []
        for levels, top in zip(self._steps, self._tops):
            # exp(l_k - L) <= 1 for a counted term (exp(-inf) = 0); an uncounted term's weight is 0
            gains = [torch.exp(torch.clamp(lv - top, max=0.0)).to(dtype).reshape(-1, 1) for lv in levels]
            mats = []
            for k in range(1, len(levels)):
                a = self._scaled(levels[k - 1], levels[k], dtype, transpose=False)
                mats.append((a, self._scaled(levels[k - 1], levels[k], dtype, transpose=True) if transposes else a))
            out.append((gains, mats))
        per_product = self.slices * (self._col.numel() * (2 if transposes else 1) + self.n) * dtype.itemsize
        if per_product * self.mask.products <= SCALED_CACHE_BYTES:
            self._index[key] = out
        return out

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M' x, x (..., n, c) -> (..., n, c): the planned steps of scaled products (class doc); on the CPU
        in column blocks that stay in cache, as DiffusionMask's products (``chain_columns``)."""
        xf = self._flat(x)
        if not self._steps:
            return x.clone()
        mask, dtype = self.mask, xf.dtype
        learn = isinstance(mask.lam, torch.Tensor) and mask.lam.requires_grad and torch.is_grad_enabled()
        w = mask._tensor_weights(mask.lam).to(device=x.device, dtype=dtype) if learn else mask._weights
        transposes = torch.is_grad_enabled() and (xf.requires_grad or learn)  # CSRProduct's backward needs them
        plan = self._products(dtype, transposes)
        c = xf.shape[1]
        width = chain_columns(xf.shape[0], c, xf.element_size()) if xf.device.type == "cpu" else c
        if width < c and (dtype, transposes) in self._index:  # blocks only reuse kept products
            parts = [self._series(xf[:, i:i + width], plan, w) for i in range(0, c, width)]
            return torch.cat(parts, 1).view(x.shape)
        return self._series(xf, plan, w).view(x.shape)

    @staticmethod
    def _series(y: torch.Tensor, plan, w) -> torch.Tensor:
        for gains, mats in plan:
            acc = y * (gains[0] * w[0])
            v = y
            for k, (a, a_t) in enumerate(mats, start=1):
                v = csr_matmul(a, v, a_t)
                acc = torch.addcmul(acc, gains[k] * w[k], v)
            y = acc
        return y

    def parameters(self) -> list[torch.Tensor]:
        lam = self.mask.lam
        return [lam] if isinstance(lam, torch.Tensor) and lam.requires_grad else []


def expm_action(graph, x: torch.Tensor, lam: float | torch.Tensor, kind: str = "laplacian",
                tol: float = 1e-8) -> torch.Tensor:
    """exp(-lam T) x for x (..., n, c) -> (..., n, c): ``DiffusionMask(graph, lam, kind, tol).matmul(x)``
    as a function (the plan is made on each call; keep a DiffusionMask to reuse it). Raises what
    DiffusionMask raises. The series' powers B^k x can pass the dtype's maximum where the result
    does not (random-walk on a star: B's centre row sums to the degree): a finite x whose result
    came back non-finite is redone on x 2^-s, each column's largest |x| in [0.5, 1), and
    multiplied back by 2^s, exactly (fast.scaling); one host read, O(n c), beside the plan's.

    >>> import torch
    >>> from fast import expm_action
    >>> edges = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])                  # a path of 3 nodes
    >>> y = expm_action(edges, torch.ones(3, 1, dtype=torch.float64), 1.0)  # L 1 = 0, so exp(-L) 1 = 1
    >>> torch.allclose(y, torch.ones(3, 1, dtype=torch.float64)), tuple(y.shape)
    (True, (3, 1))
    """
    op = DiffusionMask(graph, lam, kind, tol)
    out = op.matmul_unscaled(x)  # one host read: the check below
    if not bool(finite_flag(out)) and bool(finite_flag(x)):  # the series' sums overflowed: exact rescale
        work = x.to(compute_dtype(x.dtype))
        shift = value_shift(work)
        out = times_pow2(op.matmul_unscaled(times_pow2(work, -shift)), shift).to(x.dtype)
    return out
