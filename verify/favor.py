"""FAVOR+ registry records: the one place for their problem, dense truth and runner factories.

Every masked family (sequence, positional, tree, later graphs) is FAVOR+ attention (choromanski22
Eq. 3 with Performer's positive random features, docs/papers.md Sec. 0) times a mask operator, so
the record of such a mechanism only names its problem and its two masks:

    register(favor_mechanism("causal", "Causal mask", "choromanski22 Sec. 3.1", "N",
                             problem=favor_problem, dense_mask=causal_dense, fast_mask=causal_fast))

- favor_problem(n, seed, **extras): Q, K (N, D_QK) of row norm 1, V (N, D_V), W (M_FEATURES, D_QK).
- favor_reference(problem, mask): float64 NumPy truth (reference/), mask (N, N) or None.
- favor_fast_setup(make_mask) / favor_dense_setup(make_dense_mask): runner factories with the
  Mechanism.fast_setup signature (problem, device, dtype, requires_grad=False) -> runner.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

import fast
import reference.attention as ref_attention
import reference.features as ref_features
from verify.dense import dense_masked_attention
from verify.problems import Problem, qkv, rng_for
from verify.registry import Mechanism, Runner

D_QK = 16  # query/key width
D_V = 16  # value width
M_FEATURES = 16  # random features

#: make_mask(problem, device) -> a fast/ mask operator (None: unmasked).
FastMask = Callable[[Problem, Any], Any]
#: make_dense_mask(problem) -> (N, N) ndarray (None: unmasked).
DenseMask = Callable[[Problem], np.ndarray]


def favor_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), **extras) -> Problem:
    """Q, K (*batch, N, 16) of row norm 1, V (*batch, N, 16), an iid Gaussian projection W (16, 16);
    extras as given. With batch dims the (batch, head) slices differ by orders of magnitude
    (``batch_magnitudes``: values 1e-3 .. 1e3, one slice of keys >= ~125 below the others in
    FAVOR+ exponent); unbatched problems are the plain draws (sweeps, scale)."""
    batch = tuple(int(b) for b in batch)
    if any(b < 1 for b in batch):
        raise ValueError(f"batch dims must be positive ints, got {batch}")
    q, k, v = qkv(n, D_QK, D_V, batch=batch, seed=seed)
    w = ref_features.gaussian_projection(M_FEATURES, D_QK, rng_for(seed, 10))
    if batch:
        k, v = batch_magnitudes(k, v, w, seed)
    return Problem(n=n, seed=seed, q=q, k=k, v=v, projection=w, extras=extras)


#: Values of the (batch, head) slices are scaled by 10^e, e evenly spaced over this range.
V_DECADES = (-3.0, 3.0)
#: The slice (flat index over the batch dims) whose keys are quiet, when there are >= 2 slices.
QUIET_SLICE = 1
#: Norm of the quiet keys: their FAVOR+ exponents w.k/2 - |k|^2/8 sit below -|k|^2/8 = -128.
QUIET_NORM = 32.0
#: Angular spread of the quiet keys around their common direction (relative Gaussian noise).
QUIET_SPREAD = 0.01


def quiet_direction(w: np.ndarray) -> np.ndarray:
    """A unit u (d,) with w_f . u < 0 for every row of W (m, d) when m <= d and W has full rank:
    -W^+ 1, normalised. Keys along u have every FAVOR+ exponent below -|k|^2 / 8."""
    u = -np.linalg.lstsq(w, np.ones(w.shape[0]), rcond=None)[0]
    return u / np.linalg.norm(u)


def batch_magnitudes(k: np.ndarray, v: np.ndarray, w: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The magnitude profile of batched problems (issue 9): k, v (*batch, N, d) -> new k, v.

    - values: slice s (flat over the batch dims) is scaled by 10^e_s, e_s evenly spaced over
      V_DECADES (1e-3 .. 1e3 for 4 slices), so a result that mixes slices (a causal state leaking
      from one batch element into the next, a sum over the wrong axis) is off by orders of
      magnitude in the slice it lands in, which equivalence compares on its own;
    - keys: slice QUIET_SLICE's keys are near-identical vectors of norm QUIET_NORM = 32 along
      ``quiet_direction(W)`` (w_f . u < 0 for every feature f). fast.favor_attention feeds
      x = k / d^(1/4) = k / 2 to FAVOR+, whose exponents z_f = w_f . x - |x|^2 / 2 are then all
      below -|k|^2 / 8 = -128, while the other slices' unit keys have |z| <= |w_f| / 2 + 1/8, a
      few units. Measured over 200 seeds x N in (1, 37, 300): the quiet slice's largest exponent
      lies >= 126.6 (median 130) below every other slice's. A key stabiliser taken across slices
      (a max over the batch) subtracts the loud slices' max from the quiet slice: exp(-127)
      underflows float32 (smallest subnormal exp(-103.3)), the quiet slice's denominators vanish
      (DenominatorError) or lose all precision, so float32 fails; float64 (underflow at
      exp(-745)) and the unstabilised float64 reference represent exp(-128 - ...) ~ 1e-56 fine.

    Why this profile. No key can be LOUDER than a few units (z_f <= |w_f|^2 / 2, reached at
    x = w_f), so the slices are told apart by one quiet slice instead. Within the quiet slice the
    keys are nearly parallel (QUIET_SPREAD = 0.01 moves any z_f by <= 7.2 across keys, measured
    as above; with the default mask-oblivious stabiliser a larger in-slice spread would make
    causal/Toeplitz/tree outputs lose float32 precision, which is issue 10's business, not this
    one's), and its queries keep norm 1 (their stabiliser is per row; large queries would only
    sharpen the softmax kernel and cost float32 precision in q . k). The cost: the exponents'
    float32 round-off grows with |k|^2 / 8 = 128, so the quiet slice has the largest float32
    errors of every mechanism, ~4e-6 .. 1.1e-5, within equivalence's 1e-4 by 9x or more.

    >>> import numpy as np
    >>> from verify.favor import batch_magnitudes
    >>> rng = np.random.default_rng(0)
    >>> k, v = rng.standard_normal((2, 2, 5, 16)), rng.standard_normal((2, 2, 5, 16))
    >>> k2, v2 = batch_magnitudes(k, v, rng.standard_normal((16, 16)), seed=0)
    >>> k2.shape, bool(np.allclose(np.linalg.norm(k2[0, 1], axis=-1), 32.0))  # slice QUIET_SLICE = 1: quiet keys
    ((2, 2, 5, 16), True)
    """
    lead = k.shape[:-2]
    s = int(np.prod(lead))
    v = v * (10.0 ** np.linspace(*V_DECADES, s)).reshape(*lead, 1, 1)
    if s < 2:  # one slice: nothing to tell apart
        return k, v
    n, d = k.shape[-2:]
    u = quiet_direction(w)
    g = rng_for(seed, 11).standard_normal((n, d))
    quiet = u + QUIET_SPREAD * g
    quiet = QUIET_NORM * quiet / np.linalg.norm(quiet, axis=-1, keepdims=True)
    k = k.reshape(s, n, d).copy()
    k[QUIET_SLICE] = quiet
    return k.reshape(*lead, n, d), v


def mask_tensor(value, device, dtype=None) -> torch.Tensor:
    """A mask parameter from problem.extras as a tensor on ``device``: a torch.Tensor already there
    (and of ``dtype`` when given) is returned itself, never copied, so in-place updates and
    requires_grad reach the operator (Mechanism.mask_params); anything else is converted."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype)  # Tensor.to returns the tensor itself when nothing changes
    return torch.as_tensor(np.asarray(value), device=device, dtype=dtype)


def numpy_values(x) -> np.ndarray:
    """x as float64 NumPy, whether it is an array(-like) or a tensor (any device and dtype, a leaf
    that requires grad included; a tensor is copied): a mask parameter from problem.extras for
    the dense masks, or a fast output for a NumPy comparison."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float64).numpy().copy()
    return np.asarray(x, dtype=np.float64)


def favor_draw(problem: Problem, generator: torch.Generator) -> Problem:
    """The problem with its FAVOR+ projection W (m, d_qk) drawn by fast.gaussian_projection from
    ``generator`` (reproducibility/<id>); q, k, v and the mask data stay."""
    w = fast.gaussian_projection(M_FEATURES, problem.q.shape[-1], generator=generator, device=generator.device,
                                 dtype=torch.float64)
    return replace(problem, projection=w.cpu().numpy())


def favor_reference(problem: Problem, mask: np.ndarray | None) -> np.ndarray:
    """Dense float64 masked kernel attention (*batch, N, D_V) with FAVOR+ features of x / d^(1/4):
    out = (M ⊙ phi(Q) phi(K)^T) V / (M ⊙ phi(Q) phi(K)^T) 1, M (N, N), per-sample (B, 1, N, N)
    broadcasting over the heads, or None (all ones). Unstabilised: exact in float64 for the
    exponents of batch_magnitudes (the quiet keys' lie in [-140, -126] over 300 seeds, >> -745)."""
    s = problem.q.shape[-1] ** -0.25
    phi_q = ref_features.favor_plus(problem.q * s, problem.projection)
    phi_k = ref_features.favor_plus(problem.k * s, problem.projection)
    return ref_attention.masked_kernel_attention(phi_q, phi_k, problem.v, mask)


def favor_tensors(problem: Problem, device, dtype, requires_grad: bool = False) -> list[torch.Tensor]:
    """[q, k, v, projection] as tensors; with requires_grad, q, k, v are leaves that require grad
    (the projection is a fixed draw, never trained here)."""
    q, k, v, w = (torch.as_tensor(a, device=device, dtype=dtype)
                  for a in (problem.q, problem.k, problem.v, problem.projection))
    if requires_grad:
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    return [q, k, v, w]


def favor_fast_setup(make_mask: FastMask | None) -> Callable[..., Runner]:
    """Runner factory for fast.favor_attention with the operator ``make_mask(problem, device)``
    (None: unmasked). The operator is built in set-up, outside the timed runner."""

    def setup(problem: Problem, device, dtype, requires_grad: bool = False) -> Runner:
        q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)
        mask = make_mask(problem, device) if make_mask else None
        return FavorRunner(q, k, v, w, mask)

    return setup


class FavorRunner:
    """runner() = fast.favor_attention(q, k, v, w, mask): q, k, v, w the tensors of the call and
    ``mask`` the operator it applies (None: unmasked), built once in set-up."""

    def __init__(self, q, k, v, w, mask):
        self.q, self.k, self.v, self.w, self.mask = q, k, v, w, mask

    def __call__(self) -> torch.Tensor:
        return fast.favor_attention(self.q, self.k, self.v, self.w, self.mask)


def favor_dense_setup(make_dense_mask: DenseMask | None) -> Callable[..., Runner]:
    """Runner factory for the O(N^2) torch twin (verify.dense) with the (N, N) mask
    ``make_dense_mask(problem)`` (None: unmasked); the features are fast.favor_features' (the
    fast path's construction) with the default per-(batch, head) key stabiliser."""

    def setup(problem: Problem, device, dtype, requires_grad: bool = False) -> Runner:
        q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)
        mask = (None if make_dense_mask is None
                else torch.as_tensor(make_dense_mask(problem), device=device, dtype=dtype))
        return lambda: dense_masked_attention(*fast.favor_features(q, k, w), v, mask)

    return setup


def _all_ones(p: Problem) -> np.ndarray:
    return np.ones((p.n, p.n))


def favor_mechanism(
    id: str,
    title: str,
    source: str,
    complexity: str,
    *,
    problem: Callable[..., Problem] = favor_problem,
    dense_mask: DenseMask | None,
    fast_mask: FastMask | None,
    **kw,
) -> Mechanism:
    """A Mechanism record for FAVOR+ attention with a mask (not registered: the family registers it).

    problem(n, seed, **variant params) -> Problem; dense_mask(problem) -> (N, N) ndarray and
    fast_mask(problem, device) -> operator build the same matrix (None for both: unmasked).
    kw: any other Mechanism field (variants, sizes, scale, cost_factor, metrics, notes, ...).
    """
    if (dense_mask is None) != (fast_mask is None):
        raise ValueError(f"{id}: dense_mask and fast_mask must both be given or both be None, got "
                         f"dense_mask={dense_mask!r}, fast_mask={fast_mask!r}")
    return Mechanism(
        id=id, title=title, source=source, complexity=complexity, make_problem=problem,
        reference=lambda p: favor_reference(p, None if dense_mask is None else dense_mask(p)),
        fast_setup=favor_fast_setup(fast_mask), dense_setup=favor_dense_setup(dense_mask),
        dense_mask=dense_mask or _all_ones, **{"linear": True, "fast_mask": fast_mask, "draw": favor_draw, **kw})
