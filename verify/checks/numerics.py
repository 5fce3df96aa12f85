"""numerics/<mechanism>: float32 and bfloat16 against the float64 run of the same estimator, at the
magnitudes real models produce (issue 10, "The numerics sweep").

For every registered mechanism, its fast path (``Mechanism.fast_setup``: fast.favor_attention with
the mechanism's operator for the FAVOR+ records, fast.softmax_attention for softmax) runs in
float32 and in bfloat16 and is compared, row by row, with the SAME fast path in float64 on the
SAME inputs: the float64 run is the exact value of the estimator (the random features are one
fixed draw), so what differs is round-off, underflow and the stabilisers, nothing statistical.

Inputs, per N and head dimension d (one problem per (N, d), every std in one batched call):

- the mechanism's default-variant problem at N (``Mechanism.problem``, batch (1, S)): its mask
  parameters exactly as the registry builds them; with one sample, per-sample mask data (segment
  ids, key masks) are shared by the S heads;
- q, k of shape (1, S, N, d) with entries std * N(0, 1), std in ``STDS`` (``draws_per_std(N)``
  heads per std, so S = len(STDS) * draws), v ~ N(0, 1) of the same shape, and an iid Gaussian FAVOR+ projection W
  (``FEATURES`` = 16 rows, the registry's m, of width d); fixed seeds (rng_for(seed, SALT, N, d));
- bfloat16: q, k, v and W are rounded to bfloat16 first, and the float64 run that judges the
  bfloat16 run gets those rounded values (upcast exactly), so input rounding is not counted;
  any rounding the fast path adds on the way (e.g. scaling q by d^(-1/4) in bfloat16 before the
  float32 features: the exponent |x|^2 / 2 ~ 360 at std 8, d = 128 then moves by ~0.7) is.

Per row i (every query row of every head; padded queries included, their outputs are defined):

- refusal: the call raised ``fast.DenominatorError``. A call refuses as a whole. To say which
  rows a refusal is due to, every head of a refused call is re-run on its own (same mask, one
  head): heads that refuse alone are the refusing ones, the other heads are judged from their
  own calls; if no head refuses alone, the refusal depends on the rest of the batch and every
  head of the call counts as refused (with a reason saying so). Any other exception is an error:
  the rows of that call count as failed (``errors``), and the reason names the exception.
- silent error: no exception and ||out_i - ref_i||_2 / ||ref_i||_2 > ROW_TOL (float32 1e-3,
  bfloat16 1e-2; NaN or inf counts). float32 carries ~7 digits and every mechanism's row sums
  are well conditioned (positive terms), so 1e-3 leaves two decades for exponent round-off
  (|z| u with |z| up to ~500 at std 8, d = 128: ~3e-5) and growth (measured, full sweep on the
  fixed paths: worst 4.5e-5); bfloat16 outputs are rounded to 8 significant bits (unit round-off
  2^-9 = 0.2% per entry, so per row), so 1e-2 leaves 3x (measured: worst 3.4e-3 for the FAVOR+
  paths, features formed in float32; 4.9e-3 for softmax, whose SDPA computes in bfloat16).
- disallowed refusal: a refused head whose every row has ratio_i >= 2^-126 (float32's and
  bfloat16's smallest normal number), where (``log_ratio``)

      ratio_i = D_i / (max_a phi_q_ia * max_{j: M_ij != 0, a} phi_k_ja * max_j |M_ij|)

  in float64, from the UNSTABILISED FAVOR+ exponents z = W x - |x|^2 / 2, x = q / d^(1/4) (the
  1/sqrt(m) factors cancel) and the registry's dense mask M; D_i = sum_j M_ij phi_q_i . phi_k_j
  is the row's exact denominator (float64 in log space, no underflow at these magnitudes). A
  stabilised path whose largest query and visible-key features are 1 holds this row's
  denominator as ratio_i * max_j |M_ij|: when ratio_i >= 2^-126 it is a normal float32 number,
  so refusing it is the stabiliser's or the guard's fault, not the input's. A head with some row
  below 2^-126 may refuse (that row cannot be represented; a call refuses as a whole).
  A mechanism that is not linear (softmax) has no FAVOR+ features: its denominator is at least
  its largest term (1 after the max shift), so any refusal there is disallowed. The ratio is
  computed only for heads that refused (the dense mask is built at the first one).
- the float64 run itself refusing a head: those rows cannot be judged (``unjudged``); a float64
  refusal of a head whose rows all have normal ratios counts as a disallowed refusal as well
  (``reference_disallowed``).

The check passes iff, for both dtypes, silent errors, disallowed refusals, errors (and the float64
run's disallowed refusals) are all 0. The statistic is their sum in rows (threshold 0, "<=").
The details carry one cell per (dtype, std, d, N): rows, silent, refusals, disallowed, errors,
unjudged, worst relative row error, the smallest log2 ratio seen in refused heads, so that the
report draws a heatmap (reports.sections.numerics.plot_numerics).

Sizes: quick N = 512 with 2 heads per std (1,024 rows per cell, 15,360 per dtype); full also
N = 4096 with 1 head per std (76,800 rows per dtype). Measured on 2 cores, torch pinned to 1
thread while it runs, all 12 mechanisms, load average ~3-4 (other work running): quick 40 s
with the issue 10 fixes (95 s at the base commit, whose many refusals re-run every head alone);
full 4.3 min (8.3 min at the base commit); block-toeplitz, tree-diam and softmax (dense at
N = 4096) take most of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch

import fast
import reference.features as ref_features
import reference.latent.nodeformer as ref_nodeformer
from fast.errors import DenominatorError
from measure.timing import pinned_threads
from reference.masks import diffusion as ref_diffusion
from results.check import Check, Outcome, judged
from verify.checks.equivalence import TOL, operator_and_dense, slice_errors
from verify.favor import M_FEATURES, numpy_values
from verify.mechanisms import mechanisms
from verify.problems import Problem, rng_for
from verify.registry import EQUIVALENCE_BATCH, Mechanism

#: Standard deviations of the entries of q and k.
STDS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: Head dimensions d (of q, k and v).
DIMS = (16, 64, 128)
QUICK_SIZES = (512,)
FULL_SIZES = (512, 4096)
#: Random features of the FAVOR+ projection: the registry's m.
FEATURES = M_FEATURES
#: The dtypes under test, and their row tolerance (relative l2 error of one output row).
DTYPES = (("float32", torch.float32), ("bfloat16", torch.bfloat16))
ROW_TOL = {"float32": 1e-3, "bfloat16": 1e-2}
#: log of float32's (and bfloat16's) smallest normal number 2^-126.
LOG_TINY = -126 * math.log(2.0)
#: Rows per block in log_ratio (a (block, N) float64 temporary: 4 MiB at N = 4096).
RATIO_BLOCK = 128
#: rng_for(seed, SALT, N, d) draws q, k, v; SALT + 1 the projection; SALT + 2 (N) value-overflow's x (no other
#: check uses 93, 94, 95).
SALT = 93
#: torch intra-op threads while the sweep runs (restored after): results are bitwise reproducible.
THREADS = 1
UNIT = "count"


def draws_per_std(n: int) -> int:
    """Heads per std: 2 up to N = 1024 (at least 512 rows per cell), 1 above."""
    return 2 if n <= 1024 else 1


# ------------------------------------------------------------------------------ inputs


def draw_inputs(n: int, d: int, draws: int, seed: int) -> tuple[np.ndarray, ...]:
    """q, k (1, S, n, d) with entries std * N(0, 1), std = STDS[s // draws]; v (1, S, n, d) ~ N(0, 1);
    W (FEATURES, d) iid N(0, 1). S = len(STDS) * draws."""
    g = rng_for(seed, SALT, n, d)
    heads = len(STDS) * draws
    std = np.repeat(np.asarray(STDS, dtype=np.float64), draws).reshape(1, heads, 1, 1)
    q = std * g.standard_normal((1, heads, n, d))
    k = std * g.standard_normal((1, heads, n, d))
    v = g.standard_normal((1, heads, n, d))
    w = ref_features.gaussian_projection(FEATURES, d, rng_for(seed, SALT + 1, n, d))
    return q, k, v, w


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """a rounded to the nearest bfloat16 (ties to even), returned as float64 (exact)."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(torch.bfloat16).double().numpy()


def with_inputs(problem: Problem, q, k, v, w) -> Problem:
    """The problem with q, k, v, projection replaced (mask data shared)."""
    return replace(problem, q=q, k=k, v=v, projection=w)


def head_problem(problem: Problem, h: int) -> Problem:
    """Head h alone: q, k, v (1, 1, N, d); mask data (shaped (1, 1, N) or shared) unchanged."""
    return replace(problem, q=problem.q[:, h:h + 1], k=problem.k[:, h:h + 1], v=problem.v[:, h:h + 1])


# ------------------------------------------------------------------------------ the ratio


def favor_exponents(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Unstabilised FAVOR+ exponents z = W x' - |x'|^2 / 2 of x' = x / d^(1/4): x (..., N, d),
    w (m, d) -> (..., N, m), float64 (phi = exp(z) / sqrt(m), the softmax-kernel features of
    fast.favor_attention)."""
    x = np.asarray(x, dtype=np.float64) * x.shape[-1] ** -0.25
    return x @ np.asarray(w, dtype=np.float64).T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)


def log_ratio(zq: np.ndarray, zk: np.ndarray, mask: np.ndarray | None, block: int = RATIO_BLOCK) -> np.ndarray:
    """log ratio_i of every row (N,), float64 (module docstring):

        ratio_i = sum_j M_ij sum_a exp(zq_ia + zk_ja) / (exp(max_a zq_ia) exp(max_{j: M_ij != 0, a} zk_ja) max_j |M_ij|)

    zq (N, m), zk (N, m): FAVOR+ exponents; mask (N, N) or None (all ones). -inf where the row
    sees no key or its signed sum cancels to float64 round-off (|sum| <= 4 N eps sum |terms|).

    Computed without underflow: K_ij = exp(cq_i + ck_j) G_ij with cq_i = max_a zq_ia,
    ck_j = max_a zk_ja and G = A B^T, A = exp(zq - cq), B = exp(zk - ck) (largest entry 1 per
    row), so G_ij >= exp(-(spread of zk_j over a)) stays far above float64's range; the row sum
    is a log-sum-exp over j of log |M_ij| + log K_ij. Rows in blocks of ``block`` (an (N, N)
    float64 temporary per block row set, never N x N x m).
    """
    zq = np.asarray(zq, dtype=np.float64)
    zk = np.asarray(zk, dtype=np.float64)
    n = zk.shape[0]
    cq = zq.max(axis=1)
    ck = zk.max(axis=1)
    a = np.exp(zq - cq[:, None])
    b = np.exp(zk - ck[:, None])
    out = np.empty(zq.shape[0])
    eps = np.finfo(np.float64).eps
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, zq.shape[0], block):
            rows = slice(start, min(start + block, zq.shape[0]))
            log_k = cq[rows, None] + ck[None, :] + np.log(a[rows] @ b.T)  # (b, N)
            if mask is None:
                m_rows = np.ones((log_k.shape[0], n))
            else:
                m_rows = np.asarray(mask[rows], dtype=np.float64)
            visible = m_rows != 0
            any_visible = visible.any(axis=1)
            max_m = np.abs(m_rows).max(axis=1)
            ck_visible = np.where(visible, ck[None, :], -np.inf).max(axis=1)
            log_t = np.where(visible, np.log(np.abs(m_rows)) + log_k, -np.inf)
            shift = log_t.max(axis=1)
            shift = np.where(np.isfinite(shift), shift, 0.0)
            terms = np.exp(log_t - shift[:, None])
            signed = np.sum(np.sign(m_rows) * terms, axis=1)
            total = np.sum(terms, axis=1)
            cancelled = np.abs(signed) <= 4 * n * eps * total
            log_d = shift + np.log(np.abs(signed))
            r = log_d - cq[rows] - ck_visible - np.log(max_m)
            out[rows] = np.where(any_visible & ~cancelled, r, -np.inf)
    return out


def dense_mask_of(mech: Mechanism, problem: Problem) -> np.ndarray | None:
    """The registry's exact (N, N) mask, or (1, H, N, N)-broadcastable per-sample masks; None for
    an unmasked linear mechanism. For a mechanism that is not linear: None (no ratio)."""
    if not mech.linear or mech.fast_mask is None or mech.dense_mask is None:
        return None
    return np.asarray(mech.dense_mask(problem), dtype=np.float64)


def head_mask(mask: np.ndarray | None, heads: int, h: int) -> np.ndarray | None:
    """Head h's (N, N) slice of a mask shaped (N, N) or broadcastable to (1, heads, N, N)."""
    if mask is None or mask.ndim == 2:
        return mask
    n = mask.shape[-1]
    return np.broadcast_to(mask, (1, heads, n, n))[0, h]


# ------------------------------------------------------------------------------ running


@dataclass
class CallResult:
    """One (batched) call and its localisation: per head, status "ok" | "refused" | "error",
    the output (N, d_v) float64 where ok, and a message where not; ``batch_dependent``: the
    batched call refused but no head refused alone."""

    status: list[str]
    outputs: list[np.ndarray | None]
    messages: list[str]
    batch_dependent: bool = False
    batch_message: str = ""


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def run_call(mech: Mechanism, problem: Problem, dtype: torch.dtype, device) -> CallResult:
    """mech.fast_setup(problem, device, dtype)() on all heads at once; on DenominatorError every head
    again on its own (module docstring). An output of the wrong dtype or shape is an error."""
    heads = problem.q.shape[1]

    def call(p: Problem) -> np.ndarray:
        with torch.no_grad():
            got = mech.fast_setup(p, device, dtype)()
        if not isinstance(got, torch.Tensor) or got.dtype != dtype:
            raise TypeError(f"fast returned {getattr(got, 'dtype', type(got).__name__)} for {dtype} inputs")
        want = (*p.q.shape[:-1], mech.output_columns or p.v.shape[-1])
        if tuple(got.shape) != want:
            raise ValueError(f"fast returned shape {tuple(got.shape)}, expected {want}")
        return numpy_values(got)

    try:
        out = call(problem)
        return CallResult(["ok"] * heads, [out[0, h] for h in range(heads)], [""] * heads)
    except DenominatorError as exc:
        batch_message = _short(exc)
    except Exception as exc:  # noqa: BLE001 - any other exception fails the rows of the call
        return CallResult(["error"] * heads, [None] * heads, [_short(exc)] * heads)
    res = CallResult([], [], [], batch_message=batch_message)
    for h in range(heads):
        try:
            res.outputs.append(call(head_problem(problem, h))[0, 0])
            res.status.append("ok")
            res.messages.append("")
        except DenominatorError as exc:
            res.outputs.append(None)
            res.status.append("refused")
            res.messages.append(_short(exc))
        except Exception as exc:  # noqa: BLE001
            res.outputs.append(None)
            res.status.append("error")
            res.messages.append(_short(exc))
    if "refused" not in res.status:
        res.batch_dependent = True
        res.status = ["refused" if s == "ok" else s for s in res.status]
        res.outputs = [None] * heads
        res.messages = [m or batch_message for m in res.messages]
    return res


def row_errors(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """||got_i - ref_i||_2 / ||ref_i||_2 per row (N,) of (N, d_v); NaN/inf in got -> inf."""
    err = np.linalg.norm(got - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), np.finfo(float).tiny)
    return np.where(np.isfinite(err), err, np.inf)


def _new_cell(dtype: str, std: float, d: int, n: int) -> dict:
    return {"dtype": dtype, "std": std, "d": d, "n": n, "rows": 0, "silent": 0, "refusals": 0, "disallowed": 0,
            "errors": 0, "unjudged": 0, "reference_refusals": 0, "reference_disallowed": 0,
            "worst_row_error": 0.0, "min_log2_ratio_refused": None, "batch_dependent_refusals": 0}


def _note_ratio(cell: dict, log_r: np.ndarray) -> None:
    lo = float(np.min(log_r)) / math.log(2.0)
    old = cell["min_log2_ratio_refused"]
    cell["min_log2_ratio_refused"] = lo if old is None else min(old, lo)


def sweep_cells(mech: Mechanism, n: int, d: int, seed: int, device, note: Callable[[str], None] = lambda m: None,
                dtypes=DTYPES) -> tuple[list[dict], list[str]]:
    """The cells of one (N, d) (one per dtype and std) and the messages of refusals and errors."""
    draws = draws_per_std(n)
    heads = len(STDS) * draws
    base = mech.problem(n, seed, batch=(1, heads))
    q, k, v, w = draw_inputs(n, d, draws, seed)
    inputs = {"float64": (q, k, v, w), "bfloat16": tuple(round_to_bf16(a) for a in (q, k, v, w))}
    mask: list[np.ndarray | None] = []  # built on the first refusal: (N, N) float64 is 128 MiB at N = 4096
    ratios: dict[tuple[str, int], np.ndarray | None] = {}

    def ratio_of(kind: str, h: int) -> np.ndarray | None:
        """log ratio (N,) of head h on the inputs of ``kind``; None: not a FAVOR+ mechanism."""
        if not mech.linear:
            return None
        if (kind, h) not in ratios:
            if not mask:
                mask.append(dense_mask_of(mech, base))
            iq, ik, _, iw = inputs[kind]
            ratios[kind, h] = log_ratio(favor_exponents(iq[0, h], iw), favor_exponents(ik[0, h], iw),
                                        head_mask(mask[0], heads, h))
        return ratios[kind, h]

    def normal(log_r: np.ndarray | None) -> bool:
        return log_r is None or bool(np.all(log_r >= LOG_TINY))

    cells: list[dict] = []
    messages: list[str] = []
    for name, dtype in dtypes:
        kind = "bfloat16" if dtype == torch.bfloat16 else "float64"
        problem = with_inputs(base, *inputs[kind])
        note(f"numerics/{mech.id} N={n} d={d} float64 ({kind} inputs)")
        ref = run_call(mech, problem, torch.float64, device)
        note(f"numerics/{mech.id} N={n} d={d} {name}")
        got = run_call(mech, problem, dtype, device)
        by_std = {s: _new_cell(name, s, d, n) for s in STDS}
        for h in range(heads):
            cell = by_std[STDS[h // draws]]
            cell["rows"] += n
            where = f"{name} N={n} d={d} std={STDS[h // draws]:g} head {h}"
            if ref.status[h] != "ok":
                cell["unjudged"] += n
                if ref.status[h] == "refused":
                    cell["reference_refusals"] += n
                    log_r = ratio_of(kind, h)
                    if normal(log_r):
                        cell["reference_disallowed"] += n
                    messages.append(f"{where}: the float64 run refused ({ref.messages[h]})")
                else:
                    cell["errors"] += n
                    messages.append(f"{where}: the float64 run raised {ref.messages[h]}")
            if got.status[h] == "refused":
                cell["refusals"] += n
                cell["batch_dependent_refusals"] += n if got.batch_dependent else 0
                log_r = ratio_of(kind, h)
                if log_r is not None:
                    _note_ratio(cell, log_r)
                if normal(log_r):
                    cell["disallowed"] += n
                    messages.append(f"{where}: refused although every row's ratio >= 2^-126"
                                    + (" (the batched call refused, no head alone)" if got.batch_dependent else "")
                                    + f": {got.messages[h]}")
            elif got.status[h] == "error":
                cell["errors"] += 0 if ref.status[h] == "error" else n  # rows count once
                messages.append(f"{where}: raised {got.messages[h]}")
            elif ref.status[h] == "ok":
                err = row_errors(got.outputs[h], ref.outputs[h])
                cell["silent"] += int(np.sum(err > ROW_TOL[name]))
                cell["worst_row_error"] = max(cell["worst_row_error"], float(err.max()))
        cells.extend(by_std.values())
    return cells, messages


# ------------------------------------------------------------------------------ the check


def failed_rows(cell: dict) -> int:
    """Rows a cell counts against the check: silent errors, disallowed refusals (the float64 run's
    too) and rows of calls that raised something else."""
    return int(cell["silent"] + cell["disallowed"] + cell["reference_disallowed"] + cell["errors"])


def totals(cells: list[dict]) -> dict[str, dict[str, Any]]:
    """{dtype: {rows, silent, refusals, disallowed, errors, unjudged, reference_refusals,
    reference_disallowed, worst_row_error}} summed over the cells."""
    out: dict[str, dict[str, Any]] = {}
    keys = ("rows", "silent", "refusals", "disallowed", "errors", "unjudged", "reference_refusals",
            "reference_disallowed")
    for c in cells:
        t = out.setdefault(c["dtype"], {**{k: 0 for k in keys}, "worst_row_error": 0.0})
        for key in keys:
            t[key] += int(c[key])
        t["worst_row_error"] = max(t["worst_row_error"], float(c["worst_row_error"]))
    return out


def run_sweep(mech: Mechanism, sizes, seed: int = 0, device="cpu", note: Callable[[str], None] = lambda m: None,
              dims=None, dtypes=None) -> Outcome:
    """The whole sweep of one mechanism over ``sizes`` x ``dims`` (None: DIMS) and ``dtypes``
    (None: DTYPES, (name, torch dtype) pairs), every std: its Outcome."""
    dims = DIMS if dims is None else tuple(dims)
    dtypes = DTYPES if dtypes is None else tuple(dtypes)
    cells: list[dict] = []
    messages: list[str] = []
    with pinned_threads(THREADS):
        for n in sorted({mech.admissible(n) for n in sizes}):
            for d in dims:
                c, m = sweep_cells(mech, n, d, seed, device, note, dtypes)
                cells += c
                messages += m
    tot = totals(cells)
    statistic = float(sum(failed_rows(c) for c in cells))
    reasons = []
    for name, t in tot.items():
        if t["silent"]:
            reasons.append(f"{name}: {t['silent']} of {t['rows']} rows silently off by more than {ROW_TOL[name]:g} "
                           f"relative (worst {t['worst_row_error']:.3g})")
        if t["disallowed"]:
            reasons.append(f"{name}: {t['disallowed']} rows refused (DenominatorError) where every row's float64 "
                           f"denominator is >= 2^-126 of its largest terms")
        if t["reference_disallowed"]:
            reasons.append(f"{name}: the float64 run refused {t['reference_disallowed']} rows whose denominators "
                           "are normal")
        if t["errors"]:
            reasons.append(f"{name}: {t['errors']} rows in calls that raised something else than DenominatorError")
    reasons += [m for m in messages if "refused although" in m or "raised" in m][:8]
    return judged(statistic == 0 and not reasons, statistic, reasons,
                  cells=cells, totals=tot, messages=messages[:40], sizes=sorted({c["n"] for c in cells}),
                  dims=list(dims), stds=list(STDS), tolerance=ROW_TOL, features=FEATURES,
                  draws_per_std={str(n): draws_per_std(n) for n in sorted({c["n"] for c in cells})},
                  device=str(device), linear=mech.linear,
                  statistic="rows wrong without an exception (silent) + rows refused where every float64 ratio "
                            "is >= 2^-126 (disallowed) + rows of calls that raised another exception, both dtypes")


def check_for(mech: Mechanism) -> Check:
    """numerics/<id> of one record (registered or not)."""
    return Check(f"numerics/{mech.id}", f"float32 / bfloat16 vs float64 at std 0.5..8, d 16..128: {mech.title}",
                 "fast/ in float32, bfloat16 vs float64 (issue 10)", "numerics",
                 run=lambda ctx: run_sweep(mech, QUICK_SIZES if ctx.quick else FULL_SIZES, ctx.seed, ctx.device,
                                           ctx.note),
                 threshold=0.0, compare="<=", unit=UNIT)


# ------------------------------------------------------------------------------ numerics/value-overflow
#
# Intermediate sums of values near the dtype's maximum overflow where the output does not (issue 24):
# a driver's numerator sums N v_j's, a series' powers B^k x reach a star's degree times |x|. The fast
# paths then redo the sums on v 2^-s and multiply back (fast.scaling), exactly. This check takes those
# branches on purpose. Per registered mechanism whose output is attention over v (every record but
# those with output_columns, whose output is not v-shaped) and per dtype (float32, float64): the
# default variant's problem at OVERFLOW_N with batch EQUIVALENCE_BATCH, and two value families:
#
# - "random": the problem's v with every (slice, column) rescaled by a power of two 2^e so that the
#   larger of the column's max |v| and its exact output's max |out| lies in [2^(E-2), 2^(E-1)) (E =
#   max_exponent: float32 128, float64 1024): the output cannot overflow, while every row whose weights
#   sum past ~4 overflows its plain numerator. Expected: 2^e ref(v) per column (attention is linear in v
#   and column-separable), compared as 2^-e got against ref(v) (both exact scalings);
# - "constant": every v entry the same large value c (the input: difformer with v = 3e38). For
#   the records whose weights are normalised (ref(1) = 1 to round-off) c = 3e38 in float32 and 1.7e308
#   in float64, within a few ulps of the maximum (the output is c exactly); for the others (a relational
#   bias adds sigma(b) A~ v) c is the power of two that puts max |ref(c 1)| in [2^(E-2), 2^(E-1)).
#
# plus, for a linear record with one (N, N) mask, its operator's public matmul and rmatmul on x (N, 3)
# scaled alike (MaskOperator.matmul's own redo, fast.operator); fast.expm_action (its own redo) on a
# star of OVERFLOW_STAR nodes, kinds laplacian and random-walk, x 2^e (a column of ones and one of
# alternating 1, 1/2; e puts the larger of max |x| and the result's max in [2^(E-1), 2^E): B^k x
# reaches the centre's degree times |x|), against the dense exponential of reference.masks.diffusion;
# and fast.relational_bias (its own redo) on the same star with the gate b = OVERFLOW_GATE, "sym" and
# raw, where A~ v passes the maximum and sigmoid(b) A~ v does not (reference.latent.nodeformer).
#
# Statistic: the worst relative Frobenius error per (batch, head) slice (equivalence.slice_errors; an
# inf or NaN, or an exception, is an infinite error) over equivalence's tolerance of the dtype (float64
# 1e-10, float32 1e-4), <= 1 passes. The scalings are exact, so only the fast path's round-off (as in
# equivalence) and the rescale's subnormal tail (below 2^-100 relative) separate got from ref.

#: N of the problems (sums of ~N |v| overflow at |v| ~ 2^(E-2)) and of expm_action's star.
OVERFLOW_N = 100
OVERFLOW_STAR = 50
#: relational_bias's gate b on the star: sigmoid(-5) ~ 1/150, below 1 / sqrt(49) and 1 / 49.
OVERFLOW_GATE = -5.0
#: The near-maximum constants of the "constant" family (issue 24's 3e38).
NEAR_MAX = {"float32": 3e38, "float64": 1.7e308}


def _max_exponent(dtype: torch.dtype) -> int:
    return math.frexp(torch.finfo(dtype).max)[1]


def _pow2_to_top(top: np.ndarray, e_max: int) -> np.ndarray:
    """Integer e per entry with top 2^e in [2^(e_max - 2), 2^(e_max - 1)) (top > 0; 0 where top is 0)."""
    with np.errstate(divide="ignore"):
        return np.where(top > 0, (e_max - 2) - np.floor(np.log2(np.where(top > 0, top, 1.0))), 0).astype(np.int64)


def _record_products(mech: Mechanism, problem: Problem, name: str, dtype, ctx, record) -> None:
    """A linear record's operator (``fast_mask``): its public matmul (and rmatmul, where offered) on x
    (N, 3) ~ N(0, 1) times 2^e, the larger of max |x| and max |M x| (|M^T x|) per column in
    [2^(E-2), 2^(E-1)), against the dense mask (module block comment: their own redo)."""
    pair = operator_and_dense(mech, problem, ctx.device)
    if pair is None:
        return
    op, dense = pair
    if dense.ndim != 2:  # per-sample masks (padding, packing): the attention cases reach their products
        return
    x = rng_for(ctx.seed, SALT + 2, problem.n).standard_normal((problem.n, 3))
    products = [("matmul", op.matmul, dense)]
    if getattr(op, "has_rmatmul", False):
        products.append(("rmatmul", op.rmatmul, dense.T))
    for what, apply, m in products:
        exact = m @ x
        top = np.maximum(np.abs(x).max(axis=0, keepdims=True), np.abs(exact).max(axis=0, keepdims=True))
        e = _pow2_to_top(top, _max_exponent(dtype))

        def product(apply=apply, exact=exact, e=e):
            with torch.no_grad():
                got = apply(torch.as_tensor(np.ldexp(x, e), dtype=dtype, device=ctx.device))
            return slice_errors(exact, np.ldexp(got.detach().cpu().double().numpy(), -e))

        record(f"{mech.id}/{name}/{what}", product)


def _value_overflow_rows(ctx, ids: tuple[str, ...] | None = None) -> tuple[dict, list[str]]:
    errors: dict[str, float] = {}
    reasons: list[str] = []

    def record(key: str, fn) -> None:
        try:
            err = float(np.max(fn()))
        except Exception as exc:  # noqa: BLE001 - a refusal or a crash of valid input is a finding
            err = float("inf")
            reasons.append(f"{key}: raised {_short(exc)}")
        err = err if np.isfinite(err) else float("inf")
        errors[key] = err
        tol = TOL[key.split("/")[1]]
        if not err <= tol and not any(r.startswith(key + ":") for r in reasons):
            reasons.append(f"{key}: relative error {err:.3g} > {tol:g} (an overflowed sum not redone exactly)")

    for mech in mechanisms():
        if mech.output_columns is not None or (ids is not None and mech.id not in ids):
            continue
        n = mech.admissible(OVERFLOW_N)
        problem = mech.problem(n, ctx.seed, batch=EQUIVALENCE_BATCH)
        v = np.asarray(problem.v, dtype=np.float64)
        ref = np.asarray(mech.reference(problem), dtype=np.float64)
        ones = replace(problem, v=np.ones_like(v))
        ref_ones = np.asarray(mech.reference(ones), dtype=np.float64)
        normalised = bool(np.max(np.abs(ref_ones - 1.0)) <= 1e-12)
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            e_max = _max_exponent(dtype)
            top = np.maximum(np.abs(v).max(axis=-2, keepdims=True), np.abs(ref).max(axis=-2, keepdims=True))
            e = _pow2_to_top(top, e_max)  # (*batch, 1, d)

            def random_case(e=e, dtype=dtype):
                with torch.no_grad():
                    got = mech.fast_setup(replace(problem, v=np.ldexp(v, e)), ctx.device, dtype)()
                return slice_errors(ref, np.ldexp(got.detach().cpu().double().numpy(), -e))

            if normalised:
                c = float(torch.tensor(NEAR_MAX[name], dtype=dtype))  # the dtype's own number
            else:
                c = math.ldexp(1.0, int(_pow2_to_top(np.abs(ref_ones).max(), e_max)))

            def constant_case(c=c, dtype=dtype):
                with torch.no_grad():
                    got = mech.fast_setup(replace(problem, v=np.full_like(v, c)), ctx.device, dtype)()
                return slice_errors(ref_ones, got.detach().cpu().double().numpy() / c)

            ctx.note(f"numerics/value-overflow {mech.id} {name}")
            record(f"{mech.id}/{name}/random", random_case)
            record(f"{mech.id}/{name}/constant", constant_case)
            _record_products(mech, problem, name, dtype, ctx, record)

    # expm_action's own redo: a star, whose random-walk powers B^k x reach the centre's degree times |x|
    n = OVERFLOW_STAR
    star = sp.csr_matrix((np.ones(2 * (n - 1)), (np.r_[np.zeros(n - 1, int), np.arange(1, n)],
                                                  np.r_[np.arange(1, n), np.zeros(n - 1, int)])), shape=(n, n))
    x = np.ones((n, 2))
    x[1::2, 1] = 0.5
    for kind in ("laplacian", "random-walk") if ids is None or "expm_action" in ids else ():
        dense = ref_diffusion.diffusion_mask(star, 0.5, kind) @ x
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            # x 2^e with the larger of max |x| and max |exp(-lam T) x| in [2^(E-1), 2^E), the result's own
            # binade below the maximum: the random-walk kind keeps column sums, not rows (the centre's entry
            # is ~16 |x|, its powers B^k x ~49 |x|), so only this top binade leaves the sums room to overflow
            e = int(_pow2_to_top(np.maximum(np.abs(x).max(), np.abs(dense).max()), _max_exponent(dtype) + 1))

            def action(kind=kind, dtype=dtype, e=e):
                got = fast.expm_action(star, torch.as_tensor(np.ldexp(x, e), dtype=dtype, device=ctx.device), 0.5,
                                  kind=kind, tol=1e-12)
                return slice_errors(dense, np.ldexp(got.detach().cpu().double().numpy(), -e))

            record(f"expm_action-{kind}/{name}/star", action)

    # relational_bias's own redo: on the star A~ v reaches sqrt(degree) |v| (raw: degree |v|), and a small
    # gate sigmoid(b) brings the term back below the maximum (the records' grids never overflow A~ v)
    for normalize in ("sym", None) if ids is None or "relational_bias" in ids else ():
        dense = ref_nodeformer.relational_bias(x, star, OVERFLOW_GATE, normalize=normalize)
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            e = int(_pow2_to_top(np.maximum(np.abs(x).max(), np.abs(dense).max()), _max_exponent(dtype)))

            def bias(normalize=normalize, dtype=dtype, e=e):
                got = fast.relational_bias(torch.as_tensor(np.ldexp(x, e), dtype=dtype, device=ctx.device), star,
                                           OVERFLOW_GATE, normalize=normalize)
                return slice_errors(dense, np.ldexp(got.detach().cpu().double().numpy(), -e))

            record(f"relational_bias-{normalize or 'raw'}/{name}/star", bias)
    return errors, reasons


def _value_overflow(ctx, ids: tuple[str, ...] | None = None) -> Outcome:
    with pinned_threads(THREADS):
        errors, reasons = _value_overflow_rows(ctx, ids)
    normalised = {k: e / TOL[k.split("/")[1]] for k, e in errors.items()}
    worst = max(normalised, key=lambda k: np.inf if np.isnan(normalised[k]) else normalised[k])
    return judged(not reasons, float(normalised[worst]), reasons[:12], errors=errors, worst=worst, tolerance=TOL,
                  n=OVERFLOW_N, star=OVERFLOW_STAR, device=str(ctx.device),
                  statistic="max over mechanisms, dtypes and value families of the relative error per (batch, "
                            "head) slice against the exact (float64, rescaled) result, over equivalence's "
                            "tolerance of the dtype")


def value_overflow_check(ids: tuple[str, ...] | None = None) -> Check:
    """numerics/value-overflow: values near the dtype's maximum, whose sums overflow where the output
    does not, against the exact result (the block comment above). ids: only these mechanism ids (and
    "expm_action", "relational_bias"), for tests; None: all."""
    title = "values near the dtype's maximum: overflowed sums redone exactly" + (f" ({', '.join(ids)})" if ids else "")
    return Check("numerics/value-overflow", title, "fast.scaling (issue 24)", "equivalence",
                 run=lambda ctx: _value_overflow(ctx, ids), threshold=1.0, compare="<=", unit="ratio")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()] + [value_overflow_check()]
