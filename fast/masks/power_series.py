"""Power-series graph masks M_alpha = sum_k alpha_k W^k by Horner's rule (reid25 Sec. 3; docs/papers.md
Sec. 3). Dense twin: reference/masks/power_series.py.

``PowerSeriesMask`` applies M to x (..., N, c) with K CSR products, O(K (|E| + N) c), alpha
learnable; its FAVOR+ ``attend`` runs Horner with a per-node log scale so that no key underflows
the keys its row reaches. The coefficient helpers map alpha to f (M_alpha = Phi Phi^T,
Phi = sum_k f_k W^k) and back (``deconvolve``, ``convolve``) and build the heat, diffusion and
regularised-Laplacian series; ``spectral_radius_bounds`` and ``check_series_radius`` certify that
a series converges on a graph. Derivations (the stabilised Horner steps, the bounds):
docs/papers.md, fast.masks.power_series.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from fast.graphs import Graph, as_graph
from fast.operator import MaskOperator, SymmetricMaskOperator
from fast.segments import Segments, segment_max
from fast.sparse import block_diagonal_index, csr_matmul, csr_matrix, index_dtype
from fast.stabilizers import LocallyStabilised, plain_attend
from fast.validation import check_allocation, check_positive_int, check_tokens, compute_dtype

__all__ = ["PowerSeriesMask", "deconvolve", "convolve", "heat_alpha", "diffusion_alpha",
           "regularised_laplacian_alpha", "regularised_laplacian_radius", "spectral_radius_bounds",
           "check_series_radius"]


def check_alpha(alpha: object, name: str = "alpha") -> torch.Tensor:
    """A coefficient vector (K + 1,), K >= 0, finite. A floating tensor is returned itself (no copy,
    requires_grad kept); an integer tensor, a NumPy array or a sequence becomes a float64 tensor.
    TypeError naming ``name`` for complex, bool or non-numeric input, ValueError for an empty or
    non-1-D vector or NaN / inf. O(K).

    >>> from fast.masks.power_series import check_alpha
    >>> a = check_alpha([1, 0.5])
    >>> a.dtype, a.tolist()
    (torch.float64, [1.0, 0.5])
    """
    if isinstance(alpha, torch.Tensor):
        if alpha.is_complex() or alpha.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got a tensor of dtype {alpha.dtype}")
        t = alpha if alpha.is_floating_point() else alpha.to(torch.float64)
    else:
        a = np.asarray(alpha)
        if a.dtype.kind not in "iuf":
            raise TypeError(f"{name} must be a real 1-D sequence or tensor of coefficients, got "
                            f"{type(alpha).__name__} of dtype {a.dtype}")
        t = torch.as_tensor(a.astype(np.float64))
    if t.dim() != 1 or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor of coefficients (K + 1,), got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t.detach()).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return t


class PowerSeriesMask(LocallyStabilised, SymmetricMaskOperator):
    """M = sum_{k=0..K} alpha_k W^k (n, n), W the weighted adjacency of ``graph`` as given (reid25
    Sec. 3, the mask M_alpha that GRFs estimate).

    graph: anything fast.graphs.as_graph accepts; alpha (K + 1,): a floating tensor (held, not
    copied; may require grad: parameters() returns it), or a sequence / NumPy array (float64);
    ``check_alpha``'s errors. ``matmul`` (= ``rmatmul``, M symmetric) takes x (..., n, c) of any
    float dtype (half computes in float32): K CSR products for all columns at once,
    O(K (|E| + n) c). ``nonnegative`` when every alpha_k >= 0 (``refresh_sign`` after an edit
    through alpha.data); ``abs_matmul`` is Horner with |alpha|.

    >>> import torch
    >>> from fast import PowerSeriesMask
    >>> edges = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])      # a path of 4 nodes
    >>> op = PowerSeriesMask(edges, [1.0, 0.5, 0.25])
    >>> w = op.graph.csr().to_dense()
    >>> x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> torch.allclose(op.matmul(x), (torch.eye(4, dtype=torch.float64) + 0.5 * w + 0.25 * w @ w) @ x)
    True
    """

    def __init__(self, graph, alpha):
        self.graph: Graph = as_graph(graph)
        self.n = self.graph.n
        self.alpha = check_alpha(alpha)
        g = self.graph
        index = index_dtype(g.num_edges, g.n)
        self._parts = (g.crow.to(index), g.col.to(index), g.weight)
        self._cache: dict = {}
        self._sign_key: tuple | None = None
        self._sign = False

    @property
    def terms(self) -> int:
        """K: the degree of the polynomial (K CSR products per call)."""
        return int(self.alpha.shape[0]) - 1

    @property
    def nonnegative(self) -> bool:
        """True when every alpha_k >= 0 (then M >= 0, since W >= 0): read from the current alpha once
        per version of it (alpha._version; a host sync on CUDA only when alpha changed)."""
        version = None if self.alpha.is_inference() else self.alpha._version  # inference tensors keep none
        key = (id(self.alpha), version)
        if version is None or key != self._sign_key:
            self._sign = bool((self.alpha.detach() >= 0).all())
            self._sign_key = key
        return self._sign

    def refresh_sign(self) -> bool:
        """Re-read alpha's sign (after an edit through ``alpha.data``, which the version misses)."""
        self._sign_key = None
        return self.nonnegative

    def _csr_of(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (str(device), dtype)
        if key not in self._cache:
            crow, col, w = self._parts
            self._cache[key] = csr_matrix(crow.to(device), col.to(device), w.to(device=device, dtype=dtype), self.n)
        return self._cache[key]

    def _horner(self, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        check_tokens("x", x, self.n)
        work = compute_dtype(x.dtype)
        lead, c = x.shape[:-2], x.shape[-1]
        xf = x.to(work).movedim(-2, 0).reshape(self.n, -1)  # (N, batch * c): one SpMM for all columns
        a = alpha.to(device=x.device, dtype=work)
        w = self._csr_of(x.device, work)
        big_k = a.shape[0] - 1
        y = a[big_k] * xf
        for k in range(big_k - 1, -1, -1):
            wy = csr_matmul(w, y, w)  # W symmetric: its own transpose
            y = torch.addcmul(wy, a[k], xf)
        return y.reshape(self.n, *lead, c).movedim(0, -2).to(x.dtype)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c) by Horner's rule: K CSR products, O(K (|E| + n) c)."""
        return self._horner(x, self.alpha)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """(sum_k |alpha_k| W^k) @ x >= |M| @ x entrywise for x >= 0 (W >= 0), no gradient (contract C1)."""
        with torch.no_grad():
            return self._horner(x.detach(), self.alpha.detach().abs())


    def _structure(self, device: torch.device, slices: int) -> dict:
        """Per device: row (E,) int64, col (E,) int64, w (E,) float64, perm (E,) (the position of
        entry (j, i) for entry (i, j): W is symmetric, so W^T's CSR is W's pattern with the values
        permuted), and crow, bcol: the block-diagonal CSR index of S copies (W's own for S = 1;
        cached for the last S used only: 4 S E bytes)."""
        base_key = ("structure", str(device))
        if base_key not in self._cache:
            g = self.graph
            row, col = g.row.to(device), g.col.to(device)
            keys = row * self.n + col  # sorted (CSR order)
            perm = torch.searchsorted(keys, col * self.n + row)
            self._cache[base_key] = {"row": row, "col": col, "w": g.weight.to(device), "perm": perm,
                                     "crow": self._parts[0].to(device), "bcol": self._parts[1].to(device)}
        base = self._cache[base_key]
        if slices == 1:
            return base
        block_key = ("structure-block", str(device))
        cached = self._cache.get(block_key)
        if cached is None or cached[0] != slices:
            entry = dict(base)
            entry["crow"], entry["bcol"] = block_diagonal_index(base["crow"], base["bcol"], self.n, slices)
            cached = (slices, entry)
            self._cache[block_key] = cached
        return cached[1]

    def _attend_stabilised(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 for phi_q, phi_k (..., N, m), v (..., N, d) (S
        slices) and detached key constants c (S, N): Horner with a per-node log scale, the true products
        times exp(-l_i) (docs/papers.md, fast.masks.power_series); gradients reach phi_q, phi_k, v, alpha.
        """
        return plain_attend(_StabilisedHorner(self, c), phi_q, phi_k, v)

    def __repr__(self) -> str:
        return f"PowerSeriesMask(n={self.n}, K={self.terms})"


class _StabilisedHorner(MaskOperator):
    """The per-call operator of PowerSeriesMask's stabilised attend with key constants c (S, N):
    M'_ij = M_ij exp(c_j - l_i) per slice (docs/papers.md, fast.masks.power_series). Formed once (no
    gradient): per Horner step a block-diagonal CSR with values W_ij exp(l_j - l'_i) <= 1 and the gains
    exp(c - l') of the added term; matmul / rmatmul are then K SpMMs, differentiable in x and alpha.
    """

    def __init__(self, mask: PowerSeriesMask, c: torch.Tensor):
        self.n, self.mask, self.slices = mask.n, mask, int(c.shape[0])
        n, slices, device, dtype = mask.n, self.slices, c.device, c.dtype
        st = mask._structure(device, slices)
        alpha = mask.alpha
        big_k = int(alpha.shape[0]) - 1
        with torch.no_grad():
            if alpha.requires_grad:
                nz = torch.ones(big_k + 1, dtype=torch.bool, device=device)
            else:
                nz = alpha.detach().to(device) != 0
            row, col, perm = st["row"], st["col"], st["perm"]
            w = st["w"].to(dtype)
            zero = torch.zeros_like(c)
            level = torch.where(nz[big_k], c, torch.full_like(c, -torch.inf))  # l after the first term alpha_K x
            gains = [torch.where(nz[big_k], torch.ones_like(c), zero)]  # exp(c - l) per added term, <= 1
            steps = []  # (A_s, A_s^T) for s = 1..K
            for k in range(big_k - 1, -1, -1):
                lj = level[:, col]  # (S, E)
                m = segment_max(lj, row, n, dim=-1)  # (S, N), -inf where the row reaches nothing yet
                new = torch.where(nz[k], torch.maximum(m, c), m)
                new_safe = torch.where(new > -torch.inf, new, zero)  # new = -inf: every l_j = -inf, values 0
                values = w * torch.exp(lj - new_safe[:, row])  # exp(-inf) = 0: no NaN
                gains.append(torch.where(nz[k], torch.exp(c - new_safe), zero))
                steps.append((csr_matrix(st["crow"], st["bcol"], values.reshape(-1), n * slices),
                              csr_matrix(st["crow"], st["bcol"], values[:, perm].reshape(-1), n * slices)))
                level = new
        self._gains = [gain.reshape(-1, 1) for gain in gains]  # K + 1 of (S N, 1), for alpha_K .. alpha_0
        self._steps = steps
        self._big_k = big_k

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-2] != self.n or math.prod(x.shape[:-2]) != self.slices:
            raise ValueError(f"x must have shape (..., {self.n}, c) with {self.slices} (batch, head) slices, "
                             f"got {tuple(x.shape)}")
        return x.reshape(self.slices * self.n, x.shape[-1])

    def _coefs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """alpha_{K-s} E_s (S N, 1) for s = 0..K (differentiable in alpha)."""
        a = self.mask.alpha.to(device=x.device, dtype=x.dtype)
        return [a[self._big_k - s] * gain.to(x.dtype) for s, gain in enumerate(self._gains)]

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M' x by the stabilised Horner steps: y = alpha_K E_0 x; y = A_s y + alpha_{K-s} E_s x."""
        xf = self._flat(x)
        coefs = self._coefs(xf)
        y = coefs[0] * xf
        for s, (mat, mat_t) in enumerate(self._steps, start=1):
            y = torch.addcmul(csr_matmul(mat, y, mat_t), coefs[s], xf)
        return y.view(x.shape)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M'^T x by the transposed steps, last first: h = x, out = alpha_0 E_K h; then for
        s = K..1: h = A_s^T h, out += alpha_{K-s+1} E_{s-1} h."""
        h = self._flat(x)
        coefs = self._coefs(h)
        out = coefs[self._big_k] * h
        for s in range(self._big_k, 0, -1):
            mat, mat_t = self._steps[s - 1]
            h = csr_matmul(mat_t, h, mat)
            out = torch.addcmul(out, coefs[s - 1], h)
        return out.view(x.shape)

    def parameters(self) -> list[torch.Tensor]:
        return [self.mask.alpha] if self.mask.alpha.requires_grad else []


# ---------------------------------------------------------------------------- coefficients


def deconvolve(alpha) -> torch.Tensor:
    """f (K + 1,) with sum_{p=0..k} f_p f_{k-p} = alpha_k, k = 0..K, f_0 = sqrt(alpha_0) (reid25:
    M_alpha = Phi Phi^T with Phi = sum_k f_k W^k). O(K^2).

    alpha: as PowerSeriesMask takes it (a tensor keeps its dtype, device and autograd graph: f is
    differentiable in alpha). ValueError naming alpha_0 unless alpha_0 > 0.

    >>> from fast.masks.power_series import deconvolve, heat_alpha
    >>> [round(float(t), 6) for t in deconvolve(heat_alpha(1.0, 3))]     # (1/2)^k / k!
    [1.0, 0.5, 0.125, 0.020833]
    """
    a = check_alpha(alpha)
    a0 = float(a[0].detach())
    if not a0 > 0:
        raise ValueError(f"deconvolve needs alpha_0 > 0 (f_0 = sqrt(alpha_0)), got alpha_0 = {a0!r}")
    f = [torch.sqrt(a[0])]
    for k in range(1, a.shape[0]):
        # alpha_k = 2 f_0 f_k + sum_{p=1..k-1} f_p f_{k-p}: solve for f_k (previous f's as one dot product)
        cross = torch.dot(torch.stack(f[1:k]), torch.stack(f[k - 1:0:-1])) if k > 1 else torch.zeros((), dtype=a.dtype,
                                                                                                        device=a.device)
        f.append((a[k] - cross) / (2 * f[0]))
    return torch.stack(f)


def convolve(f, k_max: int | None = None) -> torch.Tensor:
    """alpha (k_max + 1,) with alpha_k = sum_{p+q=k} f_p f_q: the coefficients of (sum_k f_k x^k)^2,
    all 2K + 1 of them by default (then Phi Phi^T = M_alpha exactly), truncated (or zero-padded) to
    k_max + 1 when given. Differentiable in f; O(K^2). ``check_alpha``'s errors (naming f), and
    ValueError naming k_max unless it is None or an int >= 0.

    >>> import torch
    >>> from fast.masks.power_series import convolve
    >>> convolve(torch.tensor([1.0, 2.0])).tolist()                    # (1 + 2x)^2
    [1.0, 4.0, 4.0]
    """
    t = check_alpha(f, "f")
    big_k = t.shape[0] - 1
    if k_max is None:
        k_max = 2 * big_k
    else:
        k_max = check_positive_int("k_max", k_max, "None or an int >= 0", minimum=0)
        check_allocation(f"k_max = {k_max}", (k_max + 1,), torch.float64, t.device, what="the convolved coefficients")
    idx = torch.arange(big_k + 1, device=t.device)
    # sums by p + q through fast.segments: a float index_add adds with atomics on CUDA (other bits at every run);
    # no segment has more than K + 1 terms (no host read)
    by_degree = Segments((idx[:, None] + idx[None, :]).reshape(-1), 2 * big_k + 1, longest=big_k + 1)
    full = by_degree.sum(torch.outer(t, t).reshape(-1), dim=0)
    if k_max + 1 <= full.shape[0]:
        return full[: k_max + 1]
    return torch.cat([full, full.new_zeros(k_max + 1 - full.shape[0])])


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def _k_max(k_max: object) -> int:
    k_max = check_positive_int("k_max", k_max, "an int >= 0 (the last power kept)", minimum=0)
    check_allocation(f"k_max = {k_max}", (k_max + 1,), torch.float64, copies=2, what="the series coefficients")
    return k_max


def heat_alpha(beta: float, k_max: int) -> torch.Tensor:
    """alpha_k = beta^k / k!, k = 0..k_max (float64): the truncated series of exp(beta W); its
    deconvolution is f_k = (beta / 2)^k / k!. ValueError naming beta (not finite) or k_max (not an
    int >= 0). O(k_max).

    >>> from fast.masks.power_series import heat_alpha
    >>> [round(float(t), 4) for t in heat_alpha(2.0, 3)]
    [1.0, 2.0, 2.0, 1.3333]
    """
    beta, k_max = _real("beta", beta), _k_max(k_max)
    ratios = beta / torch.arange(1, k_max + 1, dtype=torch.float64)  # alpha_k / alpha_{k-1} = beta / k
    return torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(ratios, 0)])


def diffusion_alpha(beta: float, k_max: int) -> torch.Tensor:
    """alpha_k = e^-beta beta^k / k!, k = 0..k_max (float64): exp(-beta (I - W)) = e^-beta exp(beta W),
    the diffusion kernel of the normalised Laplacian I - W when W is the normalised adjacency.
    Errors as ``heat_alpha``. O(k_max).

    >>> from fast.masks.power_series import diffusion_alpha
    >>> [round(float(t), 4) for t in diffusion_alpha(1.0, 2)]
    [0.3679, 0.3679, 0.1839]
    """
    beta = _real("beta", beta)
    return math.exp(-beta) * heat_alpha(beta, k_max)


def regularised_laplacian_radius(sigma2: float) -> float:
    """(1 + sigma2) / sigma2: the radius of convergence, in W's eigenvalues, of the regularised-Laplacian
    series (inf for sigma2 = 0). ValueError naming sigma2 unless it is finite and >= 0.

    >>> from fast.masks.power_series import regularised_laplacian_radius
    >>> regularised_laplacian_radius(0.5)
    3.0
    """
    sigma2 = _real("sigma2", sigma2)
    if sigma2 < 0:
        raise ValueError(f"sigma2 must be >= 0 (a regularisation strength), got {sigma2!r}")
    return math.inf if sigma2 == 0 else 1.0 + 1.0 / sigma2  # (1 + sigma2) / sigma2


def regularised_laplacian_alpha(sigma2: float, k_max: int, graph=None) -> torch.Tensor:
    """alpha_k = sigma2^k / (1 + sigma2)^(k+1), k = 0..k_max (float64): the truncated Neumann series of
    (I + sigma2 (I - W))^-1 = (1 + sigma2)^-1 (I - r W)^-1, r = sigma2 / (1 + sigma2). O(k_max).
    graph: when given, ``check_series_radius`` certifies convergence first (its ValueError);
    ValueError naming sigma2 or k_max when invalid.

    >>> from fast.masks.power_series import regularised_laplacian_alpha
    >>> regularised_laplacian_alpha(1.0, 3).tolist()
    [0.5, 0.25, 0.125, 0.0625]
    """
    radius = regularised_laplacian_radius(sigma2)
    k_max = _k_max(k_max)
    if graph is not None:
        check_series_radius(graph, radius, "regularised-Laplacian")
    r = float(sigma2) / (1.0 + float(sigma2))
    k = torch.arange(k_max + 1, dtype=torch.float64)
    return torch.pow(torch.tensor(r, dtype=torch.float64), k) / (1.0 + float(sigma2))


def spectral_radius_bounds(graph, *, max_iter: int = 10_000, rtol: float = 1e-9,
                           stop_below: float | None = None, stop_above: float | None = None) -> tuple[float, float]:
    """(lo, hi) with lo <= rho(W) <= hi for the graph's weighted adjacency W: power iteration on W + I
    in float64 with the Collatz-Wielandt bounds and the Rayleigh quotient (docs/papers.md,
    fast.masks.power_series), O(|E| + n) per iteration, until hi - lo <= rtol hi, hi < stop_below,
    lo >= stop_above or max_iter iterations. A graph without edges gives (0, 0). ValueError naming
    max_iter (not an int >= 1), rtol (not a real >= 0), stop_below or stop_above (not None or a real).

    >>> import torch
    >>> from fast.masks.power_series import spectral_radius_bounds
    >>> lo, hi = spectral_radius_bounds(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]))   # path of 3: sqrt(2)
    >>> round(lo, 6), round(hi, 6)
    (1.414214, 1.414214)
    """
    max_iter = check_positive_int("max_iter", max_iter, "an int >= 1 (power iterations)")
    rtol = _real("rtol", rtol)
    if rtol < 0:
        raise ValueError(f"rtol must be a real >= 0 (the relative gap hi - lo at which to stop), got {rtol!r}")
    for name, value in (("stop_below", stop_below), ("stop_above", stop_above)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or
                                  math.isnan(value)):
            raise ValueError(f"{name} must be None or a real number (inf allowed), got {value!r}")
    g = as_graph(graph)
    if g.num_edges == 0:
        return 0.0, 0.0
    index = index_dtype(g.num_edges, g.n)
    w = csr_matrix(g.crow.to(index), g.col.to(index), g.weight, g.n)
    x = torch.ones(g.n, 1, dtype=torch.float64, device=g.device)
    lo, hi = 0.0, math.inf
    tiny = 1e-200  # keeps x > 0: a component that decays relative to the largest must not underflow to 0
    for it in range(max_iter):
        y = w @ x + x
        ratio = y / x
        hi = min(hi, float(ratio.max()) - 1.0)
        lo = max(lo, float(ratio.min()) - 1.0, float((x * y).sum() / (x * x).sum()) - 1.0)
        if hi - lo <= rtol * max(hi, 1e-300) or (stop_below is not None and hi < stop_below) or \
                (stop_above is not None and lo >= stop_above):
            break
        x = torch.clamp(y / y.max(), min=tiny)
    return lo, hi


def check_series_radius(graph, radius: float, name: str = "series", *, max_iter: int = 10_000) -> tuple[float, float]:
    """Bounds (lo, hi) on the spectral radius of the graph's W, certifying hi < radius (the series'
    radius of convergence in W's eigenvalues); ValueError naming the spectral radius (its bounds)
    and the radius when the series diverges (lo >= radius) or convergence could not be certified
    within max_iter power iterations; ValueError naming radius (not a positive real, inf allowed) or
    max_iter. O((|E| + n) iterations).

    >>> import torch
    >>> from fast.masks.power_series import check_series_radius
    >>> check_series_radius(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 1.0, "geometric")
    Traceback (most recent call last):
    ...
    ValueError: the geometric series diverges on this graph: ...
    """
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real) or not float(radius) > 0:
        raise ValueError(f"radius must be a positive real (the series' radius of convergence; inf allowed), got "
                         f"{radius!r}")
    lo, hi = spectral_radius_bounds(graph, max_iter=max_iter, stop_below=radius, stop_above=radius)
    if hi < radius:
        return lo, hi
    if lo >= radius:  # certified divergence; tighten the bounds for the message (the error path only)
        lo, hi = spectral_radius_bounds(graph, max_iter=max_iter)
        raise ValueError(f"the {name} series diverges on this graph: it converges for spectral radius(W) < "
                         f"{radius!r} (its radius of convergence), but the graph's spectral radius is "
                         f"{lo!r} (bounds [{lo!r}, {hi!r}])")
    raise ValueError(f"the {name} series may diverge on this graph: its radius of convergence is {radius!r}, "
                     f"and the graph's spectral radius lies in [{lo!r}, {hi!r}] after {max_iter} power iterations")
