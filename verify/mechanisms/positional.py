"""Registry records: toeplitz-1d, block-toeplitz, low-rank, hypercube-gdk (choromanski22 Sec. 3.2,
3.4, 4.1; docs/papers.md Sec. 1).

Every problem is FAVOR+ attention (favor_problem: d_qk = d = m = 16) with a positional mask whose
parameters live in problem.extras as NumPy arrays, so reference/ and fast/ build their masks from
identical numbers. The masks are positive (log-space coefficients, FAVOR+ factors, tanh^dist).
"""
from __future__ import annotations

import math

import numpy as np
import torch

import fast
from reference.masks import hypercube as ref_hypercube
from reference.masks import lowrank as ref_lowrank
from reference.masks import toeplitz as ref_toeplitz
from verify.favor import favor_mechanism, favor_problem
from verify.problems import Problem, rng_for
from verify.registry import Mechanism, register

#: Relative-position decay length as a fraction of the sequence (grid side): the mask is neither
#: near-diagonal nor near-constant at any N, so both near and far offsets matter.
DECAY_FRACTION = 1 / 8
#: Standard deviation of the random part of the logits: makes the tables asymmetric and
#: seed-dependent, so an offset off by one or a flipped sign shows.
LOGIT_NOISE = 0.3
RPE_FEATURES = 16  # r: random features of the stochastic RPE
RPE_FREQS = 4  # K: sinusoidal frequencies, encodings of width 2K
HYPERCUBE_LAMBDA = 0.5  # diffusion time: t = tanh(0.5) = 0.46


def grid_shape(n: int) -> tuple[int, int]:
    """A 2-D grid (a, n // a) with a the largest divisor of n at most sqrt(n): 2^20 -> (1024, 1024),
    2^17 -> (256, 512), 300 -> (15, 20), a prime p -> (1, p)."""
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return a, n // a


def _log_coefficients(offsets: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """b(delta) = -|delta|_1 / tau (faster decay for keys after the query) + noise."""
    tau = max(2.0, scale * DECAY_FRACTION)
    l1 = np.abs(offsets).sum(-1)
    ahead = offsets.reshape(-1, offsets.shape[-1])[:, 0].reshape(l1.shape) < 0  # first axis: key after query
    return -l1 / tau * np.where(ahead, 2.0, 1.0) + LOGIT_NOISE * rng.standard_normal(l1.shape)


# ---------------------------------------------------------------------------------- toeplitz-1d


def toeplitz_problem(n: int, seed: int) -> Problem:
    """FAVOR+ inputs and log-coefficients b (2N - 1,) over offsets -(N-1)..N-1: M = exp(b)."""
    offsets = np.arange(-(n - 1), n)[:, None]
    return favor_problem(n, seed, log_coeffs=_log_coefficients(offsets, n, rng_for(seed, 40)))


def _toeplitz_dense(p: Problem) -> np.ndarray:
    return ref_toeplitz.toeplitz_mask(np.exp(p.extras["log_coeffs"]))


def _toeplitz_fast(p: Problem, device) -> fast.ToeplitzMask:
    return fast.ToeplitzMask.from_log_coefficients(torch.as_tensor(p.extras["log_coeffs"], device=device))


# ------------------------------------------------------------------------------- block-toeplitz


def block_toeplitz_problem(n: int, seed: int) -> Problem:
    """FAVOR+ inputs on the grid ``grid_shape(n)`` and a log table b (2a - 1, 2b - 1): M = exp(b)."""
    shape = grid_shape(n)
    offsets = ref_toeplitz.grid_offsets(shape)
    log_table = _log_coefficients(offsets, max(shape), rng_for(seed, 41))
    return favor_problem(n, seed, grid_shape=np.asarray(shape), log_table=log_table)


def _block_dense(p: Problem) -> np.ndarray:
    return ref_toeplitz.block_toeplitz_mask(tuple(p.extras["grid_shape"]), np.exp(p.extras["log_table"]), n=p.n)


def _block_fast(p: Problem, device) -> fast.BlockToeplitzMask:
    return fast.BlockToeplitzMask.from_log_table(tuple(int(s) for s in p.extras["grid_shape"]),
                                                 torch.as_tensor(p.extras["log_table"], device=device), n=p.n)


# ------------------------------------------------------------------------------------ low-rank


def low_rank_problem(n: int, seed: int) -> Problem:
    """FAVOR+ inputs, sinusoidal encodings P (N, 2K) and an RPE projection (r, 2K)."""
    enc = ref_lowrank.sinusoidal_encodings(n, RPE_FREQS)
    w = rng_for(seed, 42).standard_normal((RPE_FEATURES, enc.shape[1]))
    return favor_problem(n, seed, encodings=enc, rpe_projection=w)


def _low_rank_dense(p: Problem) -> np.ndarray:
    return ref_lowrank.low_rank_mask(*ref_lowrank.stochastic_rpe_factors(p.extras["encodings"], p.extras["rpe_projection"]))


def _low_rank_fast(p: Problem, device) -> fast.LowRankMask:
    enc, w = (torch.as_tensor(p.extras[k], device=device) for k in ("encodings", "rpe_projection"))
    return fast.LowRankMask.stochastic_rpe(enc, w)


# ------------------------------------------------------------------------------- hypercube-gdk


def hypercube_problem(n: int, seed: int) -> Problem:
    """FAVOR+ inputs on the hypercube with n = 2^k nodes (ValueError otherwise)."""
    ref_hypercube.hypercube_dimension(n)
    return favor_problem(n, seed, lam=np.float64(HYPERCUBE_LAMBDA))


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


# ------------------------------------------------------------------------------------ records


def _register(id, title, source, complexity, problem, dense_mask, fast_mask, **kw) -> Mechanism:
    return register(favor_mechanism(id, title, source, complexity, problem=problem, dense_mask=dense_mask,
                                    fast_mask=fast_mask, **kw))


_register(
    "toeplitz-1d", "1-D relative-position (Toeplitz) mask, FFT", "choromanski22 Sec. 3.2", "N log N",
    toeplitz_problem, _toeplitz_dense, _toeplitz_fast,
    notes="M_ij = exp(b(i - j)), asymmetric; circulant embedding, n_fft the 5-smooth size >= 2N - 1.",
)
_register(
    "block-toeplitz", "2-D grid RPE (2-level block-Toeplitz), rfftn", "choromanski22 Sec. 3.2, Lemma 3.3",
    "N log N", block_toeplitz_problem, _block_dense, _block_fast,
    # 2-D circulant embedding transforms 4N points per column: 2^15 keeps the quick sweep short
    quick_fast_sizes=tuple(2**p for p in range(7, 16)),
    scale=True, scale_train=True,
    notes="M_xy = exp(b(x - y)) on the near-square grid grid_shape(N), row-major order.",
)
_register(
    "low-rank", "Stochastic RPE: low-rank FAVOR+ mask", "choromanski22 Sec. 3.4", "N",
    low_rank_problem, _low_rank_dense, _low_rank_fast,
    notes=f"M = phi(P) phi(P)^T, r = {RPE_FEATURES}, unbiased for exp(p_i . p_j) (sinusoidal P).",
)
_register(
    "hypercube-gdk", "Hypercube diffusion kernel, Kronecker", "choromanski22 Sec. 4.1", "N log N",
    hypercube_problem, lambda p: ref_hypercube.hypercube_mask(p.n, float(p.extras["lam"])),
    lambda p, device: fast.HypercubeDiffusionMask(p.n, float(p.extras["lam"])),
    size_rule=_power_of_two_at_most,
    notes=f"M_ij = tanh(lambda)^dist(i, j), lambda = {HYPERCUBE_LAMBDA}; N = 2^k only.",
)
