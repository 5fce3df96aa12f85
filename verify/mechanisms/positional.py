"""Registry records: toeplitz-1d, block-toeplitz, low-rank, hypercube-gdk (choromanski22 Sec. 3.2,
3.4, 4.1; docs/papers.md Sec. 1).

Every problem is FAVOR+ attention (favor_problem: d_qk = d = m = 16, q, k, v of shape
(*batch, N, 16)) with a positional mask whose parameters live in problem.extras as NumPy arrays,
so reference/ and fast/ build their masks from identical numbers. The masks are positive
(coefficients drawn in log space and exponentiated, FAVOR+ factors, tanh^dist); one mask serves
every (batch, head) slice.

Mask parameters (Mechanism.mask_params): the positive Toeplitz coefficients "coeffs" (2N - 1,),
the block-Toeplitz "table" (2 n_1 - 1, ..., 2 n_d - 1), the hypercube's diffusion time "lam"
(0-d) and the low-rank encodings / RPE projection. The fast masks take them through
``verify.favor.mask_tensor``, which hands a torch.Tensor over without copying, so the "update"
(in-place change, an optimiser step) and "learnable" (leaves requiring grad) protocols of
equivalence reach the operator. Options of the fast operators that the default problems leave
at their defaults (a construction path, a CLS token, a 3-D grid, chunked transforms, a causal
table) are extras too, set by equivalence-only variants (sweep=False: none changes the cost class).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

import fast
from fast.fft import fast_fft_size
from fast.masks.hypercube import GROUP_BITS
from measure import roofline
from reference.masks import hypercube as ref_hypercube
from reference.masks import lowrank as ref_lowrank
from reference.masks import toeplitz as ref_toeplitz
from verify.favor import favor_draw, favor_mechanism, favor_problem, mask_tensor, numpy_values
from verify.problems import Problem, rng_for
from verify.registry import Mechanism, Roofline, Variant, backward_variant, register

#: Relative-position decay length as a fraction of the sequence (grid side): the mask is neither
#: near-diagonal nor near-constant at any N, so both near and far offsets matter.
DECAY_FRACTION = 1 / 8
#: Standard deviation of the random part of the logits: makes the tables asymmetric and
#: seed-dependent, so an offset off by one or a flipped sign shows.
LOGIT_NOISE = 0.3
RPE_FEATURES = 16  # r: random features of the stochastic RPE
RPE_FREQS = 4  # K: sinusoidal frequencies, encodings of width 2K
HYPERCUBE_LAMBDA = 0.5  # diffusion time: t = tanh(0.5) = 0.46
#: The "chunked" block-Toeplitz variant's max_chunk_bytes holds the spectra of this many columns
#: (complex128; twice as many in float32): odd, so it divides none of the column counts (multiples
#: of 16 per (batch, head) slice) and every product ends on a ragged chunk. attend's feature
#: blocks scale with the same budget (~CHUNK_COLUMNS / 8 features at (2, 2) batch dims), so every
#: transform runs in ~8 chunks whatever the value; 63 keeps the number of calls small (~20 per
#: attention call at N = 300) where 5 would make ~200.
CHUNK_COLUMNS = 63
#: How the Toeplitz operators are built from the problem's positive coefficients / table:
#: "direct" (ToeplitzMask(coeffs), BlockToeplitzMask(shape, table): the default), "log"
#: (from_log_coefficients / from_log_table of their logarithm), "causal-function" (1-D only:
#: ToeplitzMask.from_function(f, N, causal=True) with f the coefficients at offsets >= 0).
BUILDS = ("direct", "log", "causal-function")


def grid_shape(n: int, dims: int = 2) -> tuple[int, ...]:
    """A near-square (near-cube) grid of ``dims`` sides, ascending, whose product is n.

    Greedy: the first side is the largest divisor a of n with a^dims <= n, the others
    grid_shape(n // a, dims - 1). dims = 2: 2^20 -> (1024, 1024), 2^17 -> (256, 512),
    300 -> (15, 20), a prime p -> (1, p); dims = 3: 300 -> (5, 6, 10), 64 -> (4, 4, 4).
    """
    if dims < 1 or n < 1:
        raise ValueError(f"grid_shape needs n >= 1 and dims >= 1, got n={n!r}, dims={dims!r}")
    if dims == 1:
        return (n,)
    a = max(d for d in range(1, int(round(n ** (1 / dims))) + 2) if n % d == 0 and d**dims <= n)
    return tuple(sorted((a, *grid_shape(n // a, dims - 1))))


def _log_coefficients(offsets: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """b(delta) = -|delta|_1 / tau (faster decay for keys after the query) + noise."""
    tau = max(2.0, scale * DECAY_FRACTION)
    l1 = np.abs(offsets).sum(-1)
    ahead = offsets.reshape(-1, offsets.shape[-1])[:, 0].reshape(l1.shape) < 0  # first axis: key after query
    return -l1 / tau * np.where(ahead, 2.0, 1.0) + LOGIT_NOISE * rng.standard_normal(l1.shape)


def _check_build(build: str, allowed: tuple[str, ...]) -> str:
    if build not in allowed:
        raise ValueError(f"build must be one of {allowed}, got {build!r}")
    return build


# ---------------------------------------------------------------------------------- toeplitz-1d


def toeplitz_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), build: str = "direct") -> Problem:
    """FAVOR+ inputs and positive coefficients coeffs = exp(b) (2N - 1,) over offsets -(N-1)..N-1.

    build (BUILDS): how the fast operator is made from them (kept in extras when not "direct").
    "causal-function" zeroes the coefficients of keys after the query (offsets < 0) here, in
    NumPy, while the fast side gets its zeros from from_function(causal=True).
    """
    _check_build(build, BUILDS)
    offsets = np.arange(-(n - 1), n)[:, None]
    coeffs = np.exp(_log_coefficients(offsets, n, rng_for(seed, 40)))
    extras = {"coeffs": coeffs}
    if build == "causal-function":
        coeffs[: n - 1] = 0.0
    if build != "direct":
        extras["build"] = build
    return favor_problem(n, seed, batch=batch, **extras)


def _toeplitz_dense(p: Problem) -> np.ndarray:
    return ref_toeplitz.toeplitz_mask(numpy_values(p.extras["coeffs"]))


def _toeplitz_fast(p: Problem, device) -> fast.ToeplitzMask:
    coeffs = mask_tensor(p.extras["coeffs"], device)
    build = p.extras.get("build", "direct")
    if build == "log":
        return fast.ToeplitzMask.from_log_coefficients(torch.log(coeffs))
    if build == "causal-function":
        at_or_before = coeffs[p.n - 1:]  # xi(0), ..., xi(N - 1): the query at or after the key
        return fast.ToeplitzMask.from_function(lambda d: at_or_before[d.long()], p.n, causal=True,
                                               dtype=coeffs.dtype, device=device)
    return fast.ToeplitzMask(coeffs)


# ------------------------------------------------------------------------------- block-toeplitz


def _spectrum_bytes(shape: tuple[int, ...]) -> int:
    """Bytes of one column's complex128 spectrum on the circulant embedding of ``shape`` (what
    BlockToeplitzMask charges per column, times two: the column's transform and the product)."""
    n_fft = [fast_fft_size(2 * s - 1) for s in shape]
    return 2 * 16 * math.prod(n_fft[:-1]) * (n_fft[-1] // 2 + 1)


def block_toeplitz_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), dims: int = 2,
                           cls_token: bool = False, chunked: bool = False, build: str = "direct") -> Problem:
    """FAVOR+ inputs on the grid ``grid_shape(n, dims)`` and a positive table exp(b) (2a - 1, 2b - 1, ...).

    cls_token: token 0 is a CLS token (weight 1 to and from every token) and the grid holds the
    other n - 1 tokens (at n = 1 there is no room for a grid beside it: the problem is then the
    plain 1-node grid). chunked: max_chunk_bytes in extras holds CHUNK_COLUMNS spectra, so every
    transform runs in several chunks. build: "direct" or "log" (BUILDS). Options away from their
    default are recorded in extras (cls_token, max_chunk_bytes, build).
    """
    _check_build(build, BUILDS[:2])
    cls = bool(cls_token) and n > 1
    shape = grid_shape(n - int(cls), dims)
    table = np.exp(_log_coefficients(ref_toeplitz.grid_offsets(shape), max(shape), rng_for(seed, 41)))
    extras = {"grid_shape": np.asarray(shape), "table": table}
    if cls:
        extras["cls_token"] = True
    if chunked:
        extras["max_chunk_bytes"] = CHUNK_COLUMNS * _spectrum_bytes(shape)
    if build != "direct":
        extras["build"] = build
    return favor_problem(n, seed, batch=batch, **extras)


def _block_dense(p: Problem) -> np.ndarray:
    return ref_toeplitz.block_toeplitz_mask(tuple(int(s) for s in p.extras["grid_shape"]),
                                            numpy_values(p.extras["table"]),
                                            cls_token=bool(p.extras.get("cls_token", False)), n=p.n)


def _block_fast(p: Problem, device) -> fast.BlockToeplitzMask:
    shape = tuple(int(s) for s in p.extras["grid_shape"])
    table = mask_tensor(p.extras["table"], device)
    kw = {"cls_token": bool(p.extras.get("cls_token", False)), "n": p.n}
    if "max_chunk_bytes" in p.extras:
        kw["max_chunk_bytes"] = int(p.extras["max_chunk_bytes"])
    if p.extras.get("build", "direct") == "log":
        return fast.BlockToeplitzMask.from_log_table(shape, torch.log(table), **kw)
    return fast.BlockToeplitzMask(shape, table, **kw)


# ------------------------------------------------------------------------------------ low-rank


def low_rank_problem(n: int, seed: int, *, batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs, sinusoidal encodings P (N, 2K) and an RPE projection (r, 2K)."""
    enc = ref_lowrank.sinusoidal_encodings(n, RPE_FREQS)
    w = rng_for(seed, 42).standard_normal((RPE_FEATURES, enc.shape[1]))
    return favor_problem(n, seed, batch=batch, encodings=enc, rpe_projection=w)


def _low_rank_dense(p: Problem) -> np.ndarray:
    enc, w = (numpy_values(p.extras[k]) for k in ("encodings", "rpe_projection"))
    return ref_lowrank.low_rank_mask(*ref_lowrank.stochastic_rpe_factors(enc, w))


def _low_rank_fast(p: Problem, device) -> fast.LowRankMask:
    enc, w = (mask_tensor(p.extras[k], device) for k in ("encodings", "rpe_projection"))
    return fast.LowRankMask.stochastic_rpe(enc, w)


def low_rank_draw(p: Problem, generator: torch.Generator) -> Problem:
    """favor_draw's problem with the RPE projection (r, 2K) redrawn too, by fast.gaussian_projection
    from the same ``generator`` (the low-rank mask's own random features)."""
    p = favor_draw(p, generator)
    w = fast.gaussian_projection(RPE_FEATURES, p.extras["encodings"].shape[-1], generator=generator,
                                 device=generator.device, dtype=torch.float64)
    return replace(p, extras={**p.extras, "rpe_projection": w.cpu().numpy()})


# ------------------------------------------------------------------------------- hypercube-gdk


def hypercube_problem(n: int, seed: int, *, batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs on the hypercube with n = 2^k nodes (ValueError otherwise), lam (0-d)."""
    ref_hypercube.hypercube_dimension(n)
    return favor_problem(n, seed, batch=batch, lam=np.float64(HYPERCUBE_LAMBDA))


def _hypercube_dense(p: Problem) -> np.ndarray:
    return ref_hypercube.hypercube_mask(p.n, float(numpy_values(p.extras["lam"])))


def _hypercube_fast(p: Problem, device) -> fast.HypercubeDiffusionMask:
    return fast.HypercubeDiffusionMask(p.n, mask_tensor(p.extras["lam"], device))


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


# ---------------------------------------------------------------------------------- rooflines


def low_rank_flops(op, n: int, c: int) -> tuple[float, float]:
    """(useful, executed) FLOPs of LowRankMask.matmul on x (N, c): left (right x), two GEMMs of
    2 N r c each (r = op.rank): 4 N r c, executed as counted."""
    flops = 4.0 * n * int(op.rank) * c
    return flops, flops


def hypercube_flops(op, n: int, c: int) -> tuple[float, float]:
    """(useful, executed) FLOPs of HypercubeDiffusionMask.matmul on x (N, c), N = 2^k.

    useful: one 2 x 2 factor [[1, t], [t, 1]] per bit, 3 FLOPs per entry (x0 + t x1: two
    multiply-adds share the 1): 3 N c k. executed: the passes of GROUP_BITS bits, a batched GEMM
    with the 2^g x 2^g factor each, 2^(g + 1) FLOPs per entry: sum over passes of 2^(g + 1) N c.
    """
    k = int(op.k)
    passes = [min(GROUP_BITS, k - b) for b in range(0, k, GROUP_BITS)]
    return 3.0 * n * c * k, float(sum(2.0 ** (g + 1) for g in passes)) * n * c


#: perf/<id> of the FFT masks: the product on (N, 64) columns vs the bare batched transforms of the
#: same columns; the issue's target: within 1.5x of them (fraction >= 1 / 1.5).
FFT_ROOFLINE = Roofline("fft", roofline.mask_product_case("fft"), target=1 / 1.5)

# ------------------------------------------------------------------------------------ records


def protocol_variants(what: str, update: bool = True) -> tuple[Variant, ...]:
    """The "update" (in-place change of ``what`` between two calls of one operator) and "learnable"
    (``what`` a leaf requiring grad) variants of the default problem; equivalence-only."""
    out = (Variant("update", f"{what} changed in place between two calls of one operator", sweep=False,
                   protocol="update"),) if update else ()
    return out + (Variant("learnable", f"{what} a leaf that requires grad: forward and gradient", sweep=False,
                          protocol="learnable"),)


def _register(id, title, source, complexity, problem, dense_mask, fast_mask, **kw) -> Mechanism:
    return register(favor_mechanism(id, title, source, complexity, problem=problem, dense_mask=dense_mask,
                                    fast_mask=fast_mask, **kw))


_register(
    "toeplitz-1d", "1-D relative-position (Toeplitz) mask, FFT", "choromanski22 Sec. 3.2", "N log N",
    toeplitz_problem, _toeplitz_dense, _toeplitz_fast,
    mask_params=("coeffs",), roofline=FFT_ROOFLINE,
    variants=(
        Variant("default", "ToeplitzMask(coeffs), coeffs = exp(b) asymmetric"),
        Variant("from-log-coefficients", "ToeplitzMask.from_log_coefficients(log coeffs)",
                params={"build": "log"}, sweep=False),
        Variant("causal-function", "from_function(f, N, causal=True): zero weight on keys after the query",
                params={"build": "causal-function"}, sweep=False),
        *protocol_variants("coeffs"),
    ),
    notes="M_ij = exp(b(i - j)), asymmetric; circulant embedding, n_fft the 5-smooth size >= 2N - 1.",
)
_register(
    "block-toeplitz", "2-D grid RPE (2-level block-Toeplitz), rfftn", "choromanski22 Sec. 3.2, Lemma 3.3",
    "N log N", block_toeplitz_problem, _block_dense, _block_fast,
    # 2-D circulant embedding transforms 4N points per column: 2^15 keeps the quick sweep short
    quick_fast_sizes=tuple(2**p for p in range(7, 16)),
    scale=True, scale_train=True,
    mask_params=("table",), roofline=FFT_ROOFLINE,
    variants=(
        Variant("default", "BlockToeplitzMask(grid_shape(N), table) on the near-square 2-D grid"),
        Variant("cls-token", "cls_token=True: a CLS token and a grid of N - 1 tokens", params={"cls_token": True},
                sweep=False),
        Variant("grid-3d", "a 3-level block-Toeplitz table on the near-cube grid grid_shape(N, 3)",
                params={"dims": 3}, sweep=False),
        Variant("chunked", f"max_chunk_bytes of {CHUNK_COLUMNS} column spectra: several transforms per product",
                params={"chunked": True}, sweep=False),
        Variant("from-log-table", "BlockToeplitzMask.from_log_table(shape, log table)", params={"build": "log"},
                sweep=False),
        *protocol_variants("table"),
    ),
    notes="M_xy = exp(b(x - y)) on the near-square grid grid_shape(N), row-major order.",
)
_register(
    "low-rank", "Stochastic RPE: low-rank FAVOR+ mask", "choromanski22 Sec. 3.4", "N",
    low_rank_problem, _low_rank_dense, _low_rank_fast,
    # the factors phi(P) are computed once, at construction: an in-place change of P or W does not
    # reach them (no "update" variant); gradients do flow through them ("learnable")
    mask_params=("encodings", "rpe_projection"), draw=low_rank_draw,
    roofline=Roofline("matmul", roofline.mask_product_case("matmul", flops=low_rank_flops)),
    variants=(Variant("default", f"r = {RPE_FEATURES} FAVOR+ features of sinusoidal encodings"),
              *protocol_variants("the encodings and the RPE projection", update=False)),
    notes=f"M = phi(P) phi(P)^T, r = {RPE_FEATURES}, unbiased for exp(p_i . p_j) (sinusoidal P).",
)
_register(
    "hypercube-gdk", "Hypercube diffusion kernel, Kronecker", "choromanski22 Sec. 4.1", "N log N",
    hypercube_problem, _hypercube_dense, _hypercube_fast,
    size_rule=_power_of_two_at_most,
    mask_params=("lam",),
    roofline=Roofline("matmul", roofline.mask_product_case("matmul", flops=hypercube_flops)),
    variants=(Variant("default", f"lambda = {HYPERCUBE_LAMBDA}"), *protocol_variants("the diffusion time lam"),
              backward_variant()),
    notes=f"M_ij = tanh(lambda)^dist(i, j), lambda = {HYPERCUBE_LAMBDA}; N = 2^k only.",
)
