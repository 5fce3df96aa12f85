"""guard/<mechanism>: the attention denominator guard fires where it must and stays silent where
it must not (issue 9, kind 5), for every linear mechanism (Mechanism.linear).

Algorithm 1 divides num_i = phi_q_i^T sum_j M_ij phi_k_j v_j^T by den_i = phi_q_i^T sum_j M_ij
phi_k_j. fast.masked_linear_attention refuses (fast.DenominatorError) a den_i that is 0 or not
finite instead of returning NaN or inf, and validates its inputs (non-finite features are a
ValueError naming the argument). A guard that is missing lets a NaN out; a guard that is too
eager (an absolute threshold such as den < 1e-12, an epsilon added to den, a threshold relative
to the whole batch) refuses or distorts valid inputs whose features merely have another scale.

Set-up, per size N and dtype: the mechanism's problem with batch = EQUIVALENCE_BATCH (4 slices
of different magnitude), its operator M = fast_mask(problem, device), and the features the fast
path itself uses, from the fast path's own construction: fast.favor_features(q, k, W, M)
(stabilised FAVOR+ of q / d^(1/4), k / d^(1/4) with W = problem.projection and the keys'
constants from M's key_stabilizer). Each case of ``CASES`` edits (phi_q, phi_k) and
calls masked_linear_attention(phi_q, phi_k, v, M). Expectations:

- "raise": fast.DenominatorError (a vanished denominator): the features of one REAL query (a
  query the key mask keeps, for padding) of one slice set to 0, so den_i = 0 exactly.
- "refuse": DenominatorError or ValueError, never an output: a +inf or NaN feature.
- "raise-or-exact": DenominatorError, or else an output as for "silent": phi_q and phi_k of one
  slice times 2^E with den overflowing (E = OVERFLOW_EXP: float32 80, float64 540, so den_i
  times 2^(2E) exceeds the dtype's max for every den_i above 2^-32 / 2^-56 while every feature
  stays finite). Today's code raises; an implementation that rescales and returns the right
  output would be correct too.
- "silent": no exception, a finite output, and on every (batch, head) slice the relative
  Frobenius error over the real queries against the unedited call within ``SCALE_TOL``: the
  unedited input; phi_k of the four slices times 2^-S, 2^(-S/3), 2^(S/3), 2^S; phi_q of the
  four slices times the same in reverse (S = SCALE_EXP: float32 66, 2^66 ~ 7e19, 2^-66 ~ 1e-20;
  float64 400, ~1e+-120). Tiny and huge features of one batch at once: an absolute threshold or
  an epsilon trips on the tiny slice, a threshold relative to the batch's largest denominator
  (scales 2^(2S) apart) too, and an overflow inside the guard's own arithmetic on the huge one.
  The exact output is invariant under these scalings.

Tolerance of the silent cases. Multiplying by a power of two is exact in binary floating point
and commutes with every operation on the path (sums, products, FFT butterflies, the division),
so the scaled call reproduces the unscaled one bit for bit except where a term leaves the
normal range: entries below 2^-S times the slice's largest feature become subnormal or 0, and
their share of any sum is below 2^-60 (float32) relative; a GPU may also sum in another order
(atomics), which moves positive sums by at most (N - 1) u relative. SCALE_TOL is equivalence's
round-off budget (float64 1e-10, float32 1e-4), far above both effects and far below what a
distorting guard does (an epsilon 1e-6 added to a den of 1e-20 changes the output by ~100%).
Measured on the real code (CPU): 0 exactly. The ranges: stabilised FAVOR+ features lie in
(0, 1/sqrt(m)] = (0, 0.25], so at 2^66 in float32 den <= N max(M) m / 16 * 2^66 ~ 2e22 max(M)
at N = 300 and numerators ~1e3 times that, well inside float32's 3.4e38 (a sum of SQUARES of
such features, 2^128 each, is not: a guard must not form one in float32); at 2^-66 the largest
terms are ~1e-21, well above float32's smallest normal 1.2e-38.

The statistic is the number of cases that failed (0 passes); the details list every case with
its outcome. A new guard (issue 10's relative guard against cancellation) adds rows to CASES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import fast
from results.check import Check, Context, Outcome, judged
from verify.checks.equivalence import slice_errors as flat_slice_errors
from verify.favor import favor_tensors, numpy_values
from verify.mechanisms import mechanisms
from verify.problems import Problem, rng_for
from verify.registry import EQUIVALENCE_BATCH, Mechanism

#: quick: the default variant at one size above the causal chunk (64) and not a multiple of it.
#: full: the default variant below and well above it too, every other plain variant at the two
#: smaller sizes (tree-diam's path and caterpillar cost O(N^2): ~1.6 s per call at N = 300).
QUICK_SIZES = (100,)
FULL_SIZES = (37, 100, 300)
FULL_VARIANT_SIZES = (37, 100)
DTYPES = (("float64", torch.float64), ("float32", torch.float32))
#: Relative Frobenius error per slice of a silent case against the unedited call (module doc).
SCALE_TOL = {"float64": 1e-10, "float32": 1e-4}
#: Exponent S of the silent scalings 2^+-S (module doc: both stay inside the dtype's normal range).
SCALE_EXP = {"float64": 400, "float32": 66}
#: Exponent E of the overflow case: phi_q, phi_k of one slice times 2^E each (module doc).
OVERFLOW_EXP = {"float64": 540, "float32": 80}
EXPECTATIONS = ("raise", "refuse", "raise-or-exact", "silent")
#: The expectations in words, for the reasons of a failure.
MUST = {"raise": "must raise DenominatorError", "refuse": "must raise DenominatorError or ValueError",
        "raise-or-exact": "must raise DenominatorError or return the unedited output",
        "silent": "must return the unedited output"}
#: The statistic is a count of failed cases.
UNIT = "count"
#: rng_for(seed, SALT, N, dtype index) picks the targets; no other draw in verify/ uses salt 90 first.
SALT = 90


@dataclass(frozen=True)
class Target:
    """Where a case edits: the (batch, head) slice index, a real query and a real key of it, and
    the dtype's name (for the exponents)."""

    slice: tuple[int, ...]
    query: int
    key: int
    dtype: str


#: edit(phi_q, phi_k, target) -> (phi_q, phi_k): the edited features (copies; never in place on the inputs).
Edit = Callable[[torch.Tensor, torch.Tensor, Target], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class GuardCase:
    """One row of the table: a name, what must happen (EXPECTATIONS) and the edit."""

    name: str
    expect: str
    edit: Edit
    doc: str = ""

    def __post_init__(self):
        if self.expect not in EXPECTATIONS:
            raise ValueError(f"case {self.name!r}: expect must be one of {EXPECTATIONS}, got {self.expect!r}")


def _set(t: torch.Tensor, index: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _slice_scaled(t: torch.Tensor, where: tuple[int, ...], exp: int) -> torch.Tensor:
    t = t.clone()
    t[where] = torch.ldexp(t[where], torch.tensor(exp, device=t.device))
    return t


def _per_slice_scales(t: torch.Tensor, exp: int) -> torch.Tensor:
    """t (*batch, N, m) times 2^e, e from -exp to +exp (rounded) evenly over the flattened slices."""
    lead = t.shape[:-2]
    count = int(np.prod(lead))
    exps = np.rint(np.linspace(-exp, exp, count)).astype(np.int64).reshape(*lead, 1, 1)
    return torch.ldexp(t, torch.as_tensor(exps, device=t.device))


CASES: tuple[GuardCase, ...] = (
    GuardCase("zero query", "raise",
              lambda q, k, at: (_set(q, (*at.slice, at.query), 0.0), k),
              "the features of one real query of one slice are 0: den_i = 0"),
    GuardCase("inf key feature", "refuse",
              lambda q, k, at: (q, _set(k, (*at.slice, at.key, 0), float("inf"))),
              "one feature of one real key of one slice is +inf"),
    GuardCase("nan key feature", "refuse",
              lambda q, k, at: (q, _set(k, (*at.slice, at.key, 0), float("nan"))),
              "one feature of one real key of one slice is NaN"),
    GuardCase("nan query feature", "refuse",
              lambda q, k, at: (_set(q, (*at.slice, at.query, 0), float("nan")), k),
              "one feature of one real query of one slice is NaN"),
    GuardCase("overflowing denominator", "raise-or-exact",
              lambda q, k, at: (_slice_scaled(q, at.slice, OVERFLOW_EXP[at.dtype]),
                                _slice_scaled(k, at.slice, OVERFLOW_EXP[at.dtype])),
              "phi_q and phi_k of one slice times 2^E: finite features, den beyond the dtype's max"),
    GuardCase("unedited", "silent", lambda q, k, at: (q, k), "the valid input itself"),
    GuardCase("keys scaled per slice", "silent",
              lambda q, k, at: (q, _per_slice_scales(k, SCALE_EXP[at.dtype])),
              "phi_k of the slices times 2^-S, 2^(-S/3), 2^(S/3), 2^S (tiny and huge keys in one batch)"),
    GuardCase("queries scaled per slice", "silent",
              lambda q, k, at: (_per_slice_scales(q, -SCALE_EXP[at.dtype]), k),
              "phi_q of the slices times 2^S, 2^(S/3), 2^(-S/3), 2^-S (huge and tiny queries in one batch)"),
)


# ------------------------------------------------------------------------------ set-up


def real_tokens(problem: Problem) -> np.ndarray:
    """(*batch, N) bool: the tokens that are real (a padding mechanism's key_mask, else all)."""
    lead = problem.q.shape[:-1]
    mask = problem.extras.get("key_mask")
    if mask is None:
        return np.ones(lead, dtype=bool)
    return np.broadcast_to(np.asarray(mask, dtype=bool), lead)


def features(mech: Mechanism, problem: Problem, device, dtype):
    """(phi_q, phi_k, v, operator): the features fast.favor_attention forms, by its own
    construction (fast.favor_features with the mechanism's operator)."""
    q, k, v, w = favor_tensors(problem, device, dtype)
    op = mech.fast_mask(problem, device) if mech.fast_mask is not None else None
    return (*fast.favor_features(q, k, w, op), v, op)


def pick_target(real: np.ndarray, dtype_name: str, rng: np.random.Generator) -> Target:
    """A random slice with a real token, and a random real query and key of it."""
    lead = real.shape[:-1]
    slices = [idx for idx in np.ndindex(*lead) if real[idx].any()]
    where = slices[int(rng.integers(len(slices)))]
    tokens = np.flatnonzero(real[where])
    return Target(tuple(int(i) for i in where), int(rng.choice(tokens)), int(rng.choice(tokens)), dtype_name)


def slice_errors(expected: torch.Tensor, got: torch.Tensor, real: np.ndarray) -> np.ndarray:
    """(prod(batch),) relative Frobenius error |got - expected|_F / |expected|_F per slice over
    the real query rows (padded queries' outputs are documented as ignorable): equivalence's
    slice_errors with the other rows zeroed in both (whatever they hold, NaN included)."""
    keep = real[..., None]
    return flat_slice_errors(np.where(keep, numpy_values(expected), 0.0), np.where(keep, numpy_values(got), 0.0))


# ------------------------------------------------------------------------------ judging


def judge_case(case: GuardCase, call: Callable[[], torch.Tensor], baseline: torch.Tensor | None,
               real: np.ndarray, tol: float) -> dict:
    """Run one case: {"ok", "outcome", and "max_slice_error" where an output was compared}."""
    try:
        out = call()
    except fast.DenominatorError as exc:
        ok = case.expect in ("raise", "refuse", "raise-or-exact")
        return {"ok": ok, "outcome": f"DenominatorError: {str(exc)[:120]}"}
    except ValueError as exc:
        return {"ok": case.expect == "refuse", "outcome": f"ValueError: {str(exc)[:120]}"}
    except Exception as exc:  # any other exception is the wrong signal (callers catch by type)
        return {"ok": False, "outcome": f"{type(exc).__name__} (not DenominatorError): {str(exc)[:120]}"}
    if case.expect in ("raise", "refuse"):
        finite = bool(torch.isfinite(out).all())
        return {"ok": False, "outcome": f"returned an output ({'finite' if finite else 'with NaN/inf'}) instead of raising"}
    if not bool(torch.isfinite(out).all()):
        return {"ok": False, "outcome": f"returned NaN/inf at {int((~torch.isfinite(out)).sum())} entries"}
    if baseline is None:
        return {"ok": False, "outcome": "returned, but the unedited call did not, so nothing to compare with"}
    err = slice_errors(baseline, out, real)
    worst = float(err.max())
    ok = worst <= tol
    return {"ok": ok, "outcome": "returned" + ("" if ok else f"; slice error {worst:.3g} > {tol:g}"),
            "max_slice_error": worst}


def run_cases(mech: Mechanism, problem: Problem, device, dtype_name: str, dtype, rng: np.random.Generator,
              cases: tuple[GuardCase, ...] = CASES) -> list[dict]:
    """Every case on one problem and dtype: a list of rows (case, expect, ok, outcome, ...)."""
    phi_q, phi_k, v, op = features(mech, problem, device, dtype)
    real = real_tokens(problem)
    target = pick_target(real, dtype_name, rng)

    def attend(q, k):
        with torch.no_grad():
            return fast.masked_linear_attention(q, k, v, op)

    try:
        baseline, failure = attend(phi_q, phi_k), None
    except Exception as exc:  # the "unedited" case reports it
        baseline, failure = None, exc

    def unedited():  # the baseline itself: the same call need not run twice
        if failure is not None:
            raise failure
        return baseline

    rows = []
    for case in cases:
        q, k = case.edit(phi_q, phi_k, target)
        call = unedited if (q is phi_q and k is phi_k) else (lambda q=q, k=k: attend(q, k))
        row = judge_case(case, call, baseline, real, SCALE_TOL[dtype_name])
        rows.append({"case": case.name, "expect": case.expect, "dtype": dtype_name, "n": problem.n,
                     "slice": list(target.slice), "query": target.query, "key": target.key, **row})
    return rows


def _run(mech: Mechanism, ctx: Context) -> Outcome:
    variants = [mech.default_variant] if ctx.quick else [v for v in mech.all_variants if v.protocol == "plain"]
    rows = []
    for variant in variants:
        sizes = QUICK_SIZES if ctx.quick else FULL_SIZES if variant == mech.default_variant else FULL_VARIANT_SIZES
        for n in sorted({mech.admissible(n) for n in sizes}):
            ctx.note(f"guard/{mech.id} {variant.name} N={n}")
            problem = mech.problem(n, ctx.seed, variant, batch=EQUIVALENCE_BATCH)
            for name, dtype in DTYPES:
                rng = rng_for(ctx.seed, SALT, n, 0 if name == "float64" else 1)
                for row in run_cases(mech, problem, ctx.device, name, dtype, rng):
                    rows.append({"variant": variant.name, **row})
    failed = [r for r in rows if not r["ok"]]
    errors = [r["max_slice_error"] for r in rows if "max_slice_error" in r]
    reasons = [f"{r['variant']} N={r['n']} {r['dtype']}: {r['case']!r} ({MUST[r['expect']]}): {r['outcome']}"
               for r in failed]
    return judged(not failed, float(len(failed)), reasons, cases=rows, case_count=len(rows),
                  max_silent_slice_error=max(errors) if errors else None, tolerance=SCALE_TOL,
                  scale_exponents=SCALE_EXP, overflow_exponents=OVERFLOW_EXP, batch=list(EQUIVALENCE_BATCH),
                  variants=[v.name for v in variants], device=ctx.device,
                  statistic="number of cases whose outcome was not the expected one")


def check_for(mech: Mechanism) -> Check:
    """guard/<id> of one linear record (registered or not)."""
    if not mech.linear:
        raise ValueError(f"guard/{mech.id}: the guard check drives a linear mechanism's operator (linear=True)")
    return Check(f"guard/{mech.id}", f"denominator guard fires and stays silent: {mech.title}",
                 "fast.masked_linear_attention (DenominatorError)", "guard",
                 run=lambda ctx: _run(mech, ctx), threshold=0.0, compare="<=", unit=UNIT)


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms() if m.linear]
