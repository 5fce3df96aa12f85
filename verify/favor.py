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


def favor_problem(n: int, seed: int, **extras) -> Problem:
    """Q, K (N, 16) of row norm 1, V (N, 16), an iid Gaussian projection W (16, 16); extras as given."""
    q, k, v = qkv(n, D_QK, D_V, seed=seed)
    w = ref_features.gaussian_projection(M_FEATURES, D_QK, rng_for(seed, 10))
    return Problem(n=n, seed=seed, q=q, k=k, v=v, projection=w, extras=extras)


def favor_reference(problem: Problem, mask: np.ndarray | None) -> np.ndarray:
    """Dense float64 masked kernel attention (N, D_V) with FAVOR+ features of x / d^(1/4):
    out = (M ⊙ phi(Q) phi(K)^T) V / (M ⊙ phi(Q) phi(K)^T) 1, M (N, N) or None (all ones)."""
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
        return lambda: fast.favor_attention(q, k, v, w, mask)

    return setup


def favor_dense_setup(make_dense_mask: DenseMask | None) -> Callable[..., Runner]:
    """Runner factory for the O(N^2) torch twin (verify.dense) with the (N, N) mask
    ``make_dense_mask(problem)`` (None: unmasked); same features as the fast path."""

    def setup(problem: Problem, device, dtype, requires_grad: bool = False) -> Runner:
        q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)
        mask = (None if make_dense_mask is None
                else torch.as_tensor(make_dense_mask(problem), device=device, dtype=dtype))
        fmap = fast.FavorPlus(w, stabilize=True)
        s = q.shape[-1] ** -0.25
        return lambda: dense_masked_attention(fmap(q * s, True), fmap(k * s, False), v, mask)

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
        dense_mask=dense_mask or _all_ones, **kw)
