"""Roofline primitives (issue 11): FLOP counts, the measured fp32 matmul rate, bare primitives of
the same size, interleaved timing, and the validity rule of perf/<id> (verify.checks.perf).

A kernel's speed means more beside what the machine can do (docs/methods.md, "Roofline"). Every
registered mechanism declares a ``verify.registry.Roofline``: what is timed and against what.

- "matmul": the kernel's achieved GFLOP/s (its USEFUL FLOPs / its seconds) as a fraction of this
  machine's fp32 GEMM rate, measured in the same run on the same thread count, interleaved with
  the kernel (``MatmulRate``: a square GEMM of MATMUL_SIZE, 2 n^3 FLOPs per call, cached per run
  with every round timed; a check judges against the GEMM rounds taken beside its own kernel, so
  kernel and peak share the machine's conditions, and reports the run's best). Used for the attention
  drivers (linear, causal, packing, padding: ``favor_case``; softmax: ``softmax_case``) and for
  mask products that are GEMMs (low-rank, hypercube: ``mask_product_case``).
- "fft": the bare batched rfft + irfft (rfftn / irfftn on a grid) of the same columns at the
  mask's own n_fft and in its transform dtype (float64 for float32 inputs since issue 10), on
  columns laid out and zero-padded beforehand, into buffers allocated beforehand (the transforms
  alone: ``bare_fft_runner``), against the mask's product M x of those columns: fraction = bare
  seconds / mask seconds. The float32 bare transforms are timed too and reported.
- "scatter": one bare ``index_add_`` of N x c rows into their parents (the tree's parent
  indices), against the tree mask's product: fraction = bare seconds / mask seconds.

What is timed (a PerfCase), documented once here:

- attention: ``fast.favor_attention(q, k, v, W, mask)`` forward on q, k, v of shape
  (B, H, N, d) = (1, 4, N, 64) with m = 64 FAVOR+ features (B = 1, H = 4 as the issue's peer
  table; d = m = 64 as its targets), float32, under torch.inference_mode(); softmax:
  ``fast.softmax_attention(q, k, v)`` on the same shapes at a smaller N (it is O(N^2)). The
  registry's problems use d = m = 16 (verify.favor); these inputs are drawn here (``attention_inputs``,
  seeded, an explicit torch.Generator). Masked attention takes its mask from the registry
  (``Mechanism.fast_mask`` of the registry's problem at N, e.g. packing's segment ids), except
  causal, which times ``fast.CausalMask(N)`` with its default chunk.
- mask products: ``mask.matmul(x)`` for x of shape (N, c) = (N, 64), float32, with the operator
  of ``Mechanism.fast_mask`` on the registry's problem at N: the public product a user calls, its
  overflow check included (one pass over the output and a host read; the attention drivers call
  ``matmul_unscaled`` instead).

FLOP counts, per (batch, head) slice (``linear_attention_flops``): phi(Q) and phi(K) each
2 N d m (the projection GEMM) + N (3 d + 4 m + 1) elementwise (scale by d^-1/4, |x|^2 / 2, the
subtraction, the stabiliser's max and subtraction, exp counted as one FLOP), K'^T V 2 N m d_v,
Q'(K'^T V) 2 N m d_v, the normaliser K'^T 1 and Q' (K'^T 1) 2 N m each, the division N d_v.
That is the USEFUL count, the same for the causal mask (its prefix sums need exactly as many
multiply-adds); the fraction is computed from it. ``causal_scan_flops`` counts what the chunked
scan EXECUTES on top (the C x C intra-chunk blocks, their weights, the ones column, the chunk
states), reported beside it.

Timing under load (docs/methods.md, "Timing under load"): on the CPU everything runs on ONE torch
thread (measure.timing.pinned_threads) and is judged in CPU seconds of the process per call, the
MINIMUM over rounds (time spent waiting for a core is not counted; load only adds CPU time);
kernel and baseline alternate within every round (``interleaved``), so a slow spell of the
machine hits both. On an accelerator the clock is wall seconds with synchronisation, also the
minimum over rounds (noise only adds time).

Validity (``validity_ceiling``): a fraction is achieved / roofline and cannot honestly exceed 1;
above the ceiling 1 + slack the FLOP count or the baseline is wrong (the measurement is invalid,
perf/<id> fails). slack = clamp(SPREAD_FACTOR (s_kernel + s_baseline), SLACK_FLOOR, SLACK_CAP),
with s = (median - min) / min of a series' rounds in this check: the relative round-to-round
spread of the kernel's and the baseline's min-over-rounds times, doubled (the min can be off by
about the spread it was picked from, in either series). The floor covers what the spread cannot
see: the GEMM rate differs by ~5% between sizes 256..2048 here, and clock-frequency steps.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

import fast
from measure.timing import Counted, cpu_clock_applies, measure

# ------------------------------------------------------------------------------ constants

#: (B, H) of the attention inputs (the issue's peer table: B = 1, H = 4).
BATCH = (1, 4)
#: Query/key width d, value width d_v and FAVOR+ features m of the attention inputs (the issue's targets).
D = 64
M = 64
#: Columns c of the mask products x (N, c).
COLUMNS = 64
#: torch threads of every perf measurement on the CPU (as the sweeps pin: measure.timing.pinned_threads).
THREADS = 1
#: Side of the square fp32 GEMM whose rate is the matmul roofline, per device type. On the CPU the
#: rate was flat from 256 to 2048 (40.4, 40.1, 38.2, 39.0, 40.0 GFLOP/s on one thread here), so a
#: mid size keeps each interleaved GEMM round short (~56 ms); a GPU needs a large GEMM to peak.
MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}
#: Rounds of kernel and baseline per check (quick, full), and of its one re-timing when invalid;
#: no round starts after BUDGET_S wall seconds of rounds once MIN_ROUNDS are done (slow kernels).
ROUNDS = {True: 5, False: 7}
RETRY_ROUNDS = {True: 5, False: 7}
MIN_ROUNDS = 3
BUDGET_S = {True: 3.0, False: 20.0}
#: The validity ceiling's slack: clamp(SPREAD_FACTOR * (s_kernel + s_baseline), SLACK_FLOOR, SLACK_CAP).
SPREAD_FACTOR = 2.0
SLACK_FLOOR = 0.10
SLACK_CAP = 1.0
#: Salts of the perf inputs' generators (independent of the registry problems' draws).
_SALT_ATTENTION, _SALT_COLUMNS, _SALT_GEMM = 1101, 1102, 1103
#: Baselines a Roofline can name (verify.registry.Roofline).
BASELINES = ("matmul", "fft", "scatter")


# ------------------------------------------------------------------------------ FLOP counts


def gemm_flops(n: int) -> float:
    """FLOPs of one n x n by n x n GEMM: 2 n^3 (a multiply and an add per term)."""
    return 2.0 * float(n) ** 3


def feature_map_flops(n: int, d: int, m: int) -> float:
    """FLOPs of stabilised FAVOR+ features of N inputs x (N, d) with m features: the projection
    x W^T (2 N d m) and N (3 d + 4 m + 1) elementwise: x d^-1/4 (N d), |x|^2 (2 N d), its half
    (N), z = x W^T - |x|^2 / 2 (N m), the stabiliser's max (N m) and subtraction (N m), exp (N m,
    counted as one FLOP although it costs more). This is the textbook construction: fast/ folds
    d^-1/4 into W and never forms the queries' |x|^2 / 2 (a per-query constant that cancels), so
    about 1% of this count at d = m = 64 is not executed there, while exp's true cost is above one
    FLOP; the useful count is the computation's, not any implementation's."""
    n, d, m = float(n), float(d), float(m)
    return 2 * n * d * m + n * (3 * d + 4 * m + 1)


def linear_attention_flops(n: int, d: int, m: int, d_v: int | None = None, slices: int = 1) -> float:
    """USEFUL FLOPs of FAVOR+ linear attention (choromanski22 Eq. 3) on ``slices`` (batch x head)
    slices of N tokens: phi(Q), phi(K) (``feature_map_flops`` each), K'^T V (2 N m d_v),
    Q' (K'^T V) (2 N m d_v), the normaliser K'^T 1 and Q' (K'^T 1) (2 N m each), D^-1 (N d_v).
    The causal mask needs the same count (its running sums do the same multiply-adds)."""
    d_v = d if d_v is None else d_v
    n_, m_, dv = float(n), float(m), float(d_v)
    per = 2 * feature_map_flops(n, d, m) + 2 * n_ * m_ * dv + 2 * n_ * m_ * dv + 2 * n_ * m_ + 2 * n_ * m_ + n_ * dv
    return slices * per


def causal_scan_flops(n: int, d: int, m: int, chunk: int, d_v: int | None = None, slices: int = 1) -> float:
    """FLOPs the chunked causal scan EXECUTES (fast.CausalMask.attend with key constants, as
    fast.favor_attention calls it), per the scan in fast/masks/sequence.py, on ``slices`` slices.

    With C = min(chunk, N), nc = ceil(N / C) chunks, Np = nc C padded tokens and e = d_v + 1 (the
    values and the ones column of the denominator): the features (as ``feature_map_flops``, plus
    the running max, N); the intra-chunk weights exp(c_j - r_i) (2 Np C: difference and exp, over
    the whole C x C block); the scores Q K^T (2 Np C m) times the weights (Np C); scores @ [V, 1]
    (2 Np C e); the chunk totals: key factors (2 Np), K * factors (Np m), K^T [V, 1] (2 Np m e);
    the pairwise decayed scan over the chunks (~4 nc m e); the query factors (2 Np), Q * factors
    (Np m), the reads (Q f) S (2 Np m e) and their sum into the output (Np e); D^-1 (N d_v).
    """
    d_v = d if d_v is None else d_v
    c = min(int(chunk), int(n))
    nc = -(-int(n) // c)
    n_, np_, m_, e = float(n), float(nc * c), float(m), float(d_v + 1)
    per = (2 * feature_map_flops(n, d, m) + n_
           + 2 * np_ * c + 2 * np_ * c * m_ + np_ * c + 2 * np_ * c * e
           + 2 * np_ + np_ * m_ + 2 * np_ * m_ * e + 4 * nc * m_ * e
           + 2 * np_ + np_ * m_ + 2 * np_ * m_ * e + np_ * e + n_ * d_v)
    return slices * per


def softmax_flops(n: int, d: int, d_v: int | None = None, slices: int = 1) -> tuple[float, float]:
    """(useful, executed) FLOPs of dense softmax attention on ``slices`` slices of N tokens:
    useful Q K^T (2 N^2 d) + P V (2 N^2 d_v) + exp (N^2) = 4 N^2 d + N^2 for d_v = d; executed
    adds the scaling, the row max, its subtraction and the row sum (4 N^2) and D^-1 (N d_v)."""
    d_v = d if d_v is None else d_v
    n_ = float(n)
    useful = 2 * n_ * n_ * d + 2 * n_ * n_ * d_v + n_ * n_
    return slices * useful, slices * (useful + 4 * n_ * n_ + n_ * d_v)


# ------------------------------------------------------------------------------ inputs


def generator(seed: int, salt: int, device="cpu") -> torch.Generator:
    """A torch.Generator on ``device`` seeded from (seed, salt) through numpy's SeedSequence (never
    global state)."""
    state = int(np.random.SeedSequence([int(seed), int(salt)]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator(device=torch.device(device)).manual_seed(state)


def attention_inputs(n: int, device="cpu", seed: int = 0, *, batch: tuple[int, ...] = BATCH, d: int = D,
                     m: int = M, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """q, k (*batch, N, d) with entries N(0, 1 / d) (row norms ~1, as the registry's problems),
    v (*batch, N, d) standard normal, W (m, d) from fast.gaussian_projection; drawn on the CPU
    from one seeded generator, then moved to ``device`` in ``dtype``."""
    g = generator(seed, _SALT_ATTENTION)
    q = torch.randn(*batch, n, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    k = torch.randn(*batch, n, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    v = torch.randn(*batch, n, d, generator=g, dtype=torch.float64)
    w = fast.gaussian_projection(m, d, generator=g, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v, w))


def columns(n: int, c: int = COLUMNS, device="cpu", seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x (N, c) standard normal (seeded), the columns a mask product is timed on."""
    g = generator(seed, _SALT_COLUMNS)
    return torch.randn(n, c, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------ timing


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def clock_for(device) -> str:
    """"cpu" (process CPU seconds) on the CPU with THREADS = 1 pinned, else "wall" (with sync)."""
    return "cpu" if cpu_clock_applies(device, torch.get_num_threads()) else "wall"


def time_once(runner: Callable[[], Any], device="cpu", clock: str = "cpu") -> float:
    """Seconds per call of ``runner`` in one measurement (measure.timing.measure: calls repeated for
    at least MIN_MEASURE_S wall seconds): process CPU seconds per call on the "cpu" clock, wall
    seconds per call (synchronised) on the "wall" clock."""
    counted = Counted(runner)
    c0 = time.process_time()
    wall = measure(counted, device)
    cpu = (time.process_time() - c0) / max(1, counted.calls)
    return cpu if clock == "cpu" else wall


def interleaved(runners: Mapping[str, Callable[[], Any]], rounds: int, device="cpu",
                clock: str | None = None, timer: Callable | None = None, warm: bool = True,
                budget: float | None = None, min_rounds: int = 1) -> dict[str, list[float]]:
    """{name: [seconds per call in each round]}: every runner measured once per round, the order
    reversed every other round (no runner always goes first), after one warm-up call each
    (warm=False: the caller has warmed them up). budget: wall seconds after which no further round
    starts once ``min_rounds`` are done (None: all ``rounds``). timer(runner, device, clock) ->
    seconds (default ``time_once``; tests plant one)."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    clock = clock_for(device) if clock is None else clock
    timer = time_once if timer is None else timer
    names = list(runners)
    for name in names if warm else ():
        runners[name]()
        sync(device)
    out: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(rounds):
        if budget is not None and r >= min_rounds and time.perf_counter() - start >= budget:
            break
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(float(timer(runners[name], device, clock)))
    return out


def best(rounds: list[float]) -> float:
    """The judged time of a series: the minimum over rounds (NaN when empty or not all finite and > 0)."""
    x = np.asarray(rounds, float)
    if x.size == 0 or not np.all(np.isfinite(x)) or not np.all(x > 0):
        return math.nan
    return float(x.min())


def spread(rounds: list[float]) -> float:
    """Relative round-to-round spread of a series: (median - min) / min (NaN where ``best`` is)."""
    low = best(rounds)
    if not math.isfinite(low):
        return math.nan
    return float((np.median(np.asarray(rounds, float)) - low) / low)


def validity_ceiling(*spreads: float) -> tuple[float, float]:
    """(ceiling, slack) of a fraction: 1 + slack, slack = clamp(SPREAD_FACTOR * sum(spreads),
    SLACK_FLOOR, SLACK_CAP) (module doc). A non-finite spread gives the cap."""
    total = sum(spreads)
    slack = SLACK_CAP if not math.isfinite(total) else min(SLACK_CAP, max(SLACK_FLOOR, SPREAD_FACTOR * total))
    return 1.0 + slack, slack


CEILING_RULE = (f"ceiling = 1 + clamp({SPREAD_FACTOR:g} (s_kernel + s_baseline), {SLACK_FLOOR:g}, {SLACK_CAP:g}); "
                "s = (median - min) / min of a series' rounds in this check")


# ------------------------------------------------------------------------------ the matmul rate


def gemm_operands(n: int, device="cpu", seed: int = 0, dtype: torch.dtype = torch.float32):
    """(a, b, out): two seeded n x n matrices and an output buffer on ``device``."""
    g = generator(seed, _SALT_GEMM)
    a = torch.randn(n, n, generator=g, dtype=dtype).to(device)
    b = torch.randn(n, n, generator=g, dtype=dtype).to(device)
    return a, b, torch.empty(n, n, dtype=dtype, device=device)


def gemm_runner(n: int, device="cpu", seed: int = 0) -> Callable[[], torch.Tensor]:
    """runner() = torch.mm(a, b, out=out) on the operands of ``gemm_operands`` (fp32)."""
    a, b, out = gemm_operands(n, device, seed)
    return lambda: torch.mm(a, b, out=out)


def gflops(flops: float | None, seconds: float) -> float | None:
    """flops / seconds / 1e9 (None without a count; NaN for a time that is not finite and > 0)."""
    if flops is None:
        return None
    return float(flops) / seconds / 1e9 if math.isfinite(seconds) and seconds > 0 else math.nan


def matmul_size(device) -> int:
    """MATMUL_SIZE of the device's type (the CPU's for any other type)."""
    return MATMUL_SIZE.get(torch.device(device).type, MATMUL_SIZE["cpu"])


@dataclass
class MatmulRate:
    """The fp32 GEMM of one run on one device and thread count: its runner (an n x n GEMM, operands
    allocated once) and every round the perf checks have timed it so far (seconds per call,
    ``clock``). Cached per run in the checks' Context cache (``matmul_rate``). Each matmul-baseline
    check times it interleaved with its own kernel and judges against those rounds (the same
    conditions as the kernel's); ``seconds`` / ``gflops`` are the run's best so far (reported)."""

    size: int
    device: str
    threads: int
    clock: str
    rounds: list[float] = field(default_factory=list)
    runner: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float:
        return best(self.rounds)

    @property
    def gflops(self) -> float:
        return gflops(gemm_flops(self.size), self.seconds)

    def add(self, rounds: list[float]) -> None:
        self.rounds.extend(float(r) for r in rounds)


def matmul_rate(cache: dict | None, device="cpu", seed: int = 0) -> MatmulRate:
    """The run's MatmulRate for (device, threads), made on first use and kept in ``cache``
    (results.check.Context.sweeps) under ("roofline", "matmul", device, threads, size); call with
    torch's threads already pinned. Nothing is timed here: the checks time it beside their kernels."""
    size, threads = matmul_size(device), torch.get_num_threads()
    key = ("roofline", "matmul", str(device), threads, size)
    if cache is not None and key in cache:
        return cache[key]
    rate = MatmulRate(size, str(device), threads, clock_for(device), runner=gemm_runner(size, device, seed))
    if cache is not None:
        cache[key] = rate
    return rate


# ------------------------------------------------------------------------------ bare primitives


def bare_fft_runner(x: torch.Tensor, grid_shape: tuple[int, ...], n_fft: tuple[int, ...],
                    dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """The bare transforms of a Toeplitz product on x (N, c): the columns laid out as (c, *grid),
    zero-padded to (c, *n_fft) in ``dtype``, and the spectrum and result buffers allocated, once
    and untimed; runner() = rfftn into the spectrum buffer, irfftn into the result buffer, over
    the grid axes (rfft / irfft in 1-D). Only the transforms: what the mask must do at least,
    without its layout and padding copies, allocations, spectrum, spectral product and crop."""
    c = x.shape[-1]
    cols = torch.zeros(c, *n_fft, dtype=dtype, device=x.device)
    cols[(slice(None),) + tuple(slice(0, s) for s in grid_shape)] = x.detach().transpose(0, 1).reshape(c, *grid_shape)
    dims = tuple(range(1, len(grid_shape) + 1))
    s = list(n_fft)
    spec = torch.empty(c, *n_fft[:-1], n_fft[-1] // 2 + 1, dtype=_complex_of(dtype), device=x.device)
    res = torch.empty_like(cols)
    if len(dims) == 1:
        def run() -> torch.Tensor:
            torch.fft.rfft(cols, dim=1, out=spec)
            return torch.fft.irfft(spec, n=s[0], dim=1, out=res)
    else:
        def run() -> torch.Tensor:
            torch.fft.rfftn(cols, dim=dims, out=spec)
            return torch.fft.irfftn(spec, s=s, dim=dims, out=res)
    return run


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.float32: torch.complex64, torch.float64: torch.complex128}[dtype]


def bare_scatter_runner(x: torch.Tensor, parent) -> Callable[[], torch.Tensor]:
    """One bare scatter over a forest: runner() = zeros(N, c).index_add_(0, parent[child], x[child])
    for every non-root node (parent: (N,) ints, -1 at roots); the rows x[child] are gathered once,
    untimed."""
    p = torch.as_tensor(np.asarray(parent), dtype=torch.int64, device=x.device)
    child = torch.nonzero(p >= 0).squeeze(-1)
    rows = x.detach().index_select(0, child).contiguous()
    idx = p.index_select(0, child).contiguous()
    n, c = x.shape
    return lambda: torch.zeros(n, c, dtype=x.dtype, device=x.device).index_add_(0, idx, rows)


# ------------------------------------------------------------------------------ cases


@dataclass
class PerfCase:
    """One timed case of perf/<id>, built untimed by a Roofline's ``case``.

    kernel() -> Tensor: the timed fast path; expected_shape: its output's shape. baseline: the
    bare primitive's runner ("fft" / "scatter"; None for "matmul"); extra: further runners timed
    in the same rounds and only reported (e.g. the float32 bare transforms). flops_useful /
    flops_executed: counts for the "matmul" baseline (None otherwise). n, d, m, columns: the
    sizes (d, m None for mask products; columns None for attention). what: one line for people.
    info: further details (chunk, n_fft, transform dtype, batch, ...).
    """

    kernel: Callable[[], torch.Tensor]
    expected_shape: tuple[int, ...]
    n: int
    what: str
    baseline: Callable[[], Any] | None = None
    extra: dict[str, Callable[[], Any]] = field(default_factory=dict)
    flops_useful: float | None = None
    flops_executed: float | None = None
    d: int | None = None
    m: int | None = None
    columns: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _slices(batch: tuple[int, ...]) -> int:
    return int(np.prod(batch, dtype=np.int64))


def chunk_of(op: object, m: int | None = None, d: int | None = None) -> int | None:
    """The chunk C a causal operator scans with for features of width m and values of width d: its
    ``chunk_for(m, d)`` when it has one (fast.CausalMask: chunk=None, the default, picks C from
    m and d), else its ``chunk`` attribute when it is a positive int."""
    pick = getattr(op, "chunk_for", None)
    if callable(pick) and m is not None and d is not None:
        return int(pick(m, d))
    c = getattr(op, "chunk", None)
    return int(c) if isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c > 0 else None


def favor_case(mask: str | Callable[[int, Any], Any] | None = None, executed: str = "useful") -> Callable:
    """A Roofline case factory: fast.favor_attention forward on ``attention_inputs`` (1, 4, N, 64),
    m = 64, float32.

    mask: None (unmasked), "registry" (``Mechanism.fast_mask`` of the registry's problem at N:
    the mask data come from the registry, the q, k, v from here), or make(n, device) -> operator.
    executed: "useful" (the executed count is the useful one: two GEMMs and the features),
    "causal" (``causal_scan_flops`` at the operator's chunk), "padding" (useful + N m for the
    key weights), or "unknown" (None: a generic masked path whose work is not counted here).
    """
    if executed not in ("useful", "causal", "padding", "unknown"):
        raise ValueError(f"executed must be 'useful', 'causal', 'padding' or 'unknown', got {executed!r}")

    def case(mech, n: int, device, seed: int) -> PerfCase:
        q, k, v, w = attention_inputs(n, device, seed)
        if mask is None:
            op = None
        elif mask == "registry":
            op = mech.fast_mask(mech.problem(n, seed), device)
        else:
            op = mask(n, device)
        slices = _slices(BATCH)
        useful = linear_attention_flops(n, D, M, D, slices)
        info: dict[str, Any] = {"batch": list(BATCH), "mask": None if op is None else type(op).__name__}
        if executed == "useful":
            done = useful
        elif executed == "padding":
            done = useful + slices * float(n) * M
        elif executed == "causal":
            chunk = chunk_of(op, M, D)
            info["chunk"] = chunk
            done = None if chunk is None else causal_scan_flops(n, D, M, chunk, D, slices)
        else:
            done = None
        what = (f"fast.favor_attention forward, (B, H, N, d) = ({BATCH[0]}, {BATCH[1]}, {n}, {D}), m = {M}, "
                f"{'no mask' if op is None else type(op).__name__}; useful FLOPs / CPU seconds vs the fp32 "
                f"matmul rate")
        return PerfCase(kernel=lambda: fast.favor_attention(q, k, v, w, op), expected_shape=tuple(v.shape), n=n,
                        what=what, flops_useful=useful, flops_executed=done, d=D, m=M, info=info)

    return case


def softmax_case(mech, n: int, device, seed: int) -> PerfCase:
    """A Roofline case: fast.softmax_attention forward on ``attention_inputs`` (1, 4, N, 64),
    4 N^2 d + N^2 useful FLOPs per slice (``softmax_flops``)."""
    q, k, v, _ = attention_inputs(n, device, seed)
    useful, done = softmax_flops(n, D, D, _slices(BATCH))
    what = (f"fast.softmax_attention forward, (B, H, N, d) = ({BATCH[0]}, {BATCH[1]}, {n}, {D}); 4 N^2 d + N^2 "
            f"useful FLOPs per slice / CPU seconds vs the fp32 matmul rate")
    return PerfCase(kernel=lambda: fast.softmax_attention(q, k, v), expected_shape=tuple(v.shape), n=n, what=what,
                    flops_useful=useful, flops_executed=done, d=D, m=None, info={"batch": list(BATCH)})


def mask_product_case(baseline: str, flops: Callable[[Any, int, int], tuple[float, float | None]] | None = None
                      ) -> Callable:
    """A Roofline case factory: op.matmul(x) for x (N, COLUMNS) float32, op = Mechanism.fast_mask of
    the registry's problem at N, against

    - "fft": ``bare_fft_runner`` at the operator's grid (``grid_shape``, default (N,)), ``n_fft``
      and ``transform_dtype`` (the bare float32 transforms are timed too, reported as extra);
    - "scatter": ``bare_scatter_runner`` over the problem's forest (extras["parent"]);
    - "matmul": ``flops(op, n, c) -> (useful, executed)``, the product's FLOP counts.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if baseline == "matmul" and flops is None:
        raise ValueError("a mask product against the matmul rate needs flops(op, n, c) -> (useful, executed)")

    def case(mech, n: int, device, seed: int) -> PerfCase:
        problem = mech.problem(n, seed)
        op = mech.fast_mask(problem, device)
        x = columns(n, COLUMNS, device, seed)
        kind = type(op).__name__
        out = PerfCase(kernel=lambda: op.matmul(x), expected_shape=(n, COLUMNS), n=n, what="", columns=COLUMNS,
                       info={"mask": kind})
        if baseline == "fft":
            grid = tuple(int(s) for s in getattr(op, "grid_shape", (n,)))
            n_fft = tuple(int(s) for s in op.n_fft)
            tdtype = getattr(op, "transform_dtype", torch.float64)
            work = torch.promote_types(torch.float32, tdtype)
            out.baseline = bare_fft_runner(x, grid, n_fft, work)
            out.extra = {"bare_float32": bare_fft_runner(x, grid, n_fft, torch.float32)}
            out.info.update({"grid_shape": list(grid), "n_fft": list(n_fft),
                             "transform_dtype": str(work).replace("torch.", "")})
            out.what = (f"{kind}.matmul on x (N, c) = ({n}, {COLUMNS}) float32 vs the bare batched "
                        f"{'rfft/irfft' if len(grid) == 1 else 'rfftn/irfftn'} of the same columns at n_fft = "
                        f"{'x'.join(map(str, n_fft))} in {out.info['transform_dtype']}; fraction = bare / mask seconds")
        elif baseline == "scatter":
            parent = problem.extras["parent"]
            out.baseline = bare_scatter_runner(x, parent)
            out.info["non_root_nodes"] = int(np.sum(np.asarray(parent) >= 0))
            out.what = (f"{kind}.matmul on x (N, c) = ({n}, {COLUMNS}) float32 vs one bare index_add_ of the "
                        f"non-root rows into their parents; fraction = bare / mask seconds")
        else:
            useful, done = flops(op, n, COLUMNS)
            out.flops_useful, out.flops_executed = float(useful), None if done is None else float(done)
            out.what = (f"{kind}.matmul on x (N, c) = ({n}, {COLUMNS}) float32; useful FLOPs / CPU seconds vs the "
                        f"fp32 matmul rate")
        return out

    return case


# ------------------------------------------------------------------------------ judging


def output_problems(out: object, expected_shape: tuple[int, ...]) -> list[str]:
    """Why a timed output is wrong: not a tensor, another shape, or non-finite entries ([] if fine).
    Cheap on purpose: equivalence/<id> compares the values with the reference."""
    if not isinstance(out, torch.Tensor):
        return [f"the timed fast path returned {type(out).__name__}, not a tensor"]
    if tuple(out.shape) != tuple(expected_shape):
        return [f"the timed fast path returned shape {tuple(out.shape)}, expected {tuple(expected_shape)}"]
    if not bool(torch.isfinite(out).all()):
        return [f"the timed fast path's output has {int((~torch.isfinite(out)).sum())} non-finite entries"]
    return []


@dataclass
class Assessment:
    """The fraction of one attempt and its validity: fraction, ceiling, slack, spreads, reasons."""

    fraction: float
    ceiling: float
    slack: float
    spreads: dict[str, float]
    reasons: list[str]

    @property
    def valid(self) -> bool:
        return not self.reasons


def assess(baseline: str, kernel_rounds: list[float], baseline_rounds: list[float], *,
           flops_useful: float | None = None, peak_seconds: float | None = None, peak_flops: float | None = None
           ) -> Assessment:
    """Fraction and validity from the rounds of one check (pure: tests plant the seconds).

    matmul: fraction = (flops_useful / t_kernel) / (peak_flops / peak_seconds), with t_kernel the
    min of kernel_rounds and peak_seconds the run's best GEMM time (baseline_rounds: the GEMM rounds
    interleaved with the kernel, for the spread). fft / scatter: fraction = t_baseline / t_kernel
    (mins of the two series). Invalid (reasons) when a time or the fraction is not finite and
    > 0, or the fraction exceeds ``validity_ceiling`` of the two series' spreads.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    tk, tb = best(kernel_rounds), best(baseline_rounds)
    spreads = {"kernel": spread(kernel_rounds), "baseline": spread(baseline_rounds)}
    reasons: list[str] = []
    if not math.isfinite(tk):
        reasons.append(f"the kernel's times are not all finite and > 0: {list(kernel_rounds)}")
    if not math.isfinite(tb):
        reasons.append(f"the baseline's times are not all finite and > 0: {list(baseline_rounds)}")
    if baseline == "matmul":
        if not (flops_useful is not None and math.isfinite(flops_useful) and flops_useful > 0):
            reasons.append(f"the useful FLOP count {flops_useful!r} is not finite and > 0")
        ok_peak = (peak_seconds is not None and peak_flops is not None and math.isfinite(peak_seconds)
                   and peak_seconds > 0 and peak_flops > 0)
        if not ok_peak:
            reasons.append(f"no valid matmul peak (seconds {peak_seconds!r}, FLOPs {peak_flops!r})")
        fraction = (flops_useful * peak_seconds / (peak_flops * tk)) if not reasons else math.nan
    else:
        fraction = tb / tk if not reasons else math.nan
    ceiling, slack = validity_ceiling(*spreads.values())
    if not reasons:
        if not (math.isfinite(fraction) and fraction > 0):
            reasons.append(f"the fraction {fraction!r} is not finite and > 0")
        elif fraction > ceiling:
            what = ("achieved GFLOP/s above the measured matmul rate: the FLOP count or the GEMM baseline is wrong"
                    if baseline == "matmul" else
                    f"the mask product is faster than its bare {baseline} primitive(s): the baseline is not the "
                    "work the mask must do (another size, dtype or count)")
            reasons.append(f"fraction {fraction:.3g} above the validity ceiling {ceiling:.3g} ({what})")
    return Assessment(fraction, ceiling, slack, spreads, reasons)
