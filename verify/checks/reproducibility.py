"""reproducibility/<mechanism> and reproducibility/samplers: random draws come from the generator
they are given, and from nothing else (issue 9, kind 6; docs/design.md: library code never touches
global RNG state).

reproducibility/<id>, for every record with a ``draw`` (Mechanism.draw: the FAVOR+ projection, an
RPE projection, ... drawn by fast/'s samplers from a torch.Generator): on the default variant's
problem (N = 37, batch = EQUIVALENCE_BATCH) in float64 on ctx.device,

1. same seed: SAME_SEED_RUNS generators on ctx.device seeded with s give bitwise equal drawn
   problems (every array of the problem) and bitwise equal fast outputs (torch.equal), each run
   compared with the first;
2. other seed: a generator seeded with s + 1 gives another fast OUTPUT (not torch.equal; the
   relative Frobenius difference is reported). A draw that ignores its generator shows here, and
   so does a fast path that ignores the draw (one that caches W by shape, say): a drawn problem
   that changes is not enough. The problem's arrays that changed are reported apart
   (other_seed_problem_differs);
3. global state: the global RNG states are untouched by all of it (draws, set-up and calls):
   torch.get_rng_state(), torch.cuda.get_rng_state_all() when CUDA is initialised (a CUDA
   ctx.device initialises it first), np.random.get_state() and random.getstate().

reproducibility/samplers: the same three conditions for each row of ``SAMPLERS`` (fast/'s samplers
with a torch.Generator on ctx.device, reference/'s with a np.random.Generator), condition 2 on the
sampler's whole result. A later sampler (issue 12's random walks) adds a row.

Bitwise equality is the right bar: the same generator state and the same operations give the
same bits on one device; a sampler that reads the global RNG, or a fresh OS-seeded generator,
gives other bits at once. So does a fast path that accumulates with atomics on CUDA
(index_add_, scatter_add, index_put_(accumulate=True), and the backward of gathers: fast/ sums
through fast.segments instead, issue 21), but only now and then: the threads' order changes the
bits only when two adds to one address meet in another order. Hence SAME_SEED_RUNS runs rather
than two, every one compared with the first, on ctx.device (``--device cuda`` runs the CUDA
kernels). The statistic is the number of the conditions that failed (0 passes).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable

import numpy as np
import torch

import fast
import reference.features as ref_features
from results.check import Check, Context, Outcome, judged
from verify.favor import numpy_values
from verify.mechanisms import mechanisms
from verify.registry import EQUIVALENCE_BATCH, Mechanism, relative_error

N = 37
#: The statistic is a count of failed conditions.
UNIT = "count"
#: Same-seed runs compared with the first (condition 1): a race that changes the bits in a fraction p
#: of the runs is missed with probability (1 - p)^(SAME_SEED_RUNS - 1), not 1 - p.
SAME_SEED_RUNS = 4
#: Generator seeds come from SeedSequence([seed, SALT, ...]) (base_seed), the entropy rng_for uses:
#: no other draw in verify/ uses salt 91 first.
SALT = 91


def base_seed(seed: int, *salt: int) -> int:
    """A 63-bit generator seed derived from the run's seed (independent per salt)."""
    return int(np.random.SeedSequence([int(seed), SALT, *salt]).generate_state(1, dtype=np.uint64)[0] >> 1)


# ------------------------------------------------------------------------- global RNG states


@dataclass
class GlobalState:
    """Snapshot of every global RNG a library call could advance."""

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    numpy: tuple
    python: tuple

    @classmethod
    def take(cls) -> "GlobalState":
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def moved(self, after: "GlobalState") -> list[str]:
        """Names of the states that differ between this snapshot and ``after``."""
        out = []
        if not torch.equal(self.torch_cpu, after.torch_cpu):
            out.append("torch (CPU) global RNG")
        if self.torch_cuda is not None and after.torch_cuda is not None:
            if len(self.torch_cuda) != len(after.torch_cuda) or not all(
                    torch.equal(a, b) for a, b in zip(self.torch_cuda, after.torch_cuda)):
                out.append("torch CUDA global RNG")
        if not _numpy_states_equal(self.numpy, after.numpy):
            out.append("numpy global RNG (np.random)")
        if self.python != after.python:
            out.append("python random module")
        return out


def _numpy_states_equal(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
                                    for x, y in zip(a, b))


def prepare_device(device) -> None:
    """Initialise CUDA before the first snapshot when the check runs there (initialising it later
    would create its generators mid-check and look like a moved state)."""
    if torch.device(device).type == "cuda":
        torch.cuda.init()


# ------------------------------------------------------------------------- comparing draws


def arrays_of(obj: Any) -> list[tuple[str, Any]]:
    """(name, array) for every ndarray / tensor in a Problem-like dataclass (extras included)."""
    out = []

    def visit(name, value):
        if isinstance(value, (np.ndarray, torch.Tensor)):
            out.append((name, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(f"{name}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{name}[{i}]", v)

    for f in fields(obj) if is_dataclass(obj) else ():
        visit(f.name, getattr(obj, f.name))
    return out


def bitwise_equal(a: Any, b: Any) -> bool:
    """Same shape, dtype and bits (NaN equal to NaN in the same place); tensors or ndarrays."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(
            torch.equal(a, b) or torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    return False


def differing_arrays(p1: Any, p2: Any) -> list[str]:
    """Names of the arrays of two problems that are not bitwise equal (or exist in one only)."""
    a, b = dict(arrays_of(p1)), dict(arrays_of(p2))
    return sorted(name for name in a.keys() | b.keys() if name not in a or name not in b or not bitwise_equal(a[name], b[name]))


# ------------------------------------------------------------------------- one random thing


#: Why condition 2 failed, for a result compared whole (a sampler's).
SAME_RESULT = "seed s + 1 gave the same result as seed s (the generator is not used)"


def judge(draw: Callable[[int], Any], seed: int, compare_all: Callable[[Any, Any], list[str]],
          before: GlobalState, compare_other: Callable[[Any, Any], list[str]] | None = None,
          same_other: str = SAME_RESULT, runs: int | None = None) -> tuple[list[str], dict, tuple]:
    """Conditions 1-3 of the module doc for ``draw(seed) -> result``: (reasons, details, the
    three results (seed, seed again (the last same-seed run), seed + 1)).

    compare_all(r1, r2) -> names of the parts of two results that differ bitwise (condition 1:
    none may, in any of the ``runs`` (default SAME_SEED_RUNS) same-seed runs against the first).
    compare_other(r1, r2) -> those of the parts condition 2 needs to differ, at least one (default
    compare_all: any part); same_other: the reason when none does.
    """
    reasons: list[str] = []
    runs = SAME_SEED_RUNS if runs is None else runs
    if runs < 2:
        raise ValueError(f"runs must be >= 2 (same-seed runs compared with the first), got {runs}")
    first = draw(seed)
    same: list[str] = []
    for _ in range(runs - 1):
        again = draw(seed)
        same += [name for name in compare_all(first, again) if name not in same]
    other = draw(seed + 1)
    if same:
        reasons.append(f"same seed, different bits: {', '.join(same)}")
    changed = (compare_other or compare_all)(first, other)
    if not changed:
        reasons.append(same_other)
    moved = before.moved(GlobalState.take())
    if moved:
        reasons.append(f"global RNG state moved: {', '.join(moved)}")
    details = {"same_seed_differs": same, "other_seed_differs": changed, "global_states_moved": moved,
               "same_seed_runs": runs}
    return reasons, details, (first, again, other)


# ------------------------------------------------------------------------- mechanisms


def _mechanism_draw(mech: Mechanism, problem, device) -> Callable[[int], dict]:
    def draw(seed: int) -> dict:
        gen = torch.Generator(device=device).manual_seed(seed)
        drawn = mech.draw(problem, gen)
        out = mech.fast(drawn, device, torch.float64)
        return {"problem": drawn, "output": out}
    return draw


def _compare_outputs(r1: dict, r2: dict) -> list[str]:
    return [] if bitwise_equal(r1["output"], r2["output"]) else ["fast output"]


def _compare_runs(r1: dict, r2: dict) -> list[str]:
    return [f"problem.{n}" for n in differing_arrays(r1["problem"], r2["problem"])] + _compare_outputs(r1, r2)


#: Why condition 2 failed for a mechanism: the fast output did not move (whatever the draw did).
SAME_OUTPUT = ("seed s + 1 gave the same fast output as seed s (the generator is not used, or the fast path "
               "ignores the drawn problem: see other_seed_problem_differs)")


def _run_mechanism(mech: Mechanism, ctx: Context) -> Outcome:
    prepare_device(ctx.device)
    n = mech.admissible(N)
    problem = mech.problem(n, ctx.seed, batch=EQUIVALENCE_BATCH)
    seed = base_seed(ctx.seed, 1)
    before = GlobalState.take()
    draw = _mechanism_draw(mech, problem, ctx.device)
    reasons, details, (first, _, other) = judge(draw, seed, _compare_runs, before, _compare_outputs, SAME_OUTPUT)
    return judged(not reasons, float(len(reasons)), reasons, **details, n=n, batch=list(EQUIVALENCE_BATCH),
                  generator_seed=seed, device=ctx.device, dtype="float64",
                  other_seed_problem_differs=[f"problem.{a}" for a in differing_arrays(first["problem"],
                                                                                       other["problem"])],
                  other_seed_relative_difference=relative_error(numpy_values(first["output"]), other["output"]),
                  statistic="number of failed conditions (same seed bitwise equal, other seed changes the fast output, "
                            "global RNG states untouched)")


def check_for(mech: Mechanism) -> Check:
    """reproducibility/<id> of one record with a draw (registered or not)."""
    if mech.draw is None:
        raise ValueError(f"reproducibility/{mech.id}: the record has no draw (it is deterministic)")
    return Check(f"reproducibility/{mech.id}", f"random draws from the given generator only: {mech.title}",
                 "docs/design.md (explicit generators, no global RNG)", "reproducibility",
                 run=lambda ctx: _run_mechanism(mech, ctx), threshold=0.0, compare="<=", unit=UNIT)


# ------------------------------------------------------------------------- samplers


@dataclass(frozen=True)
class Sampler:
    """One row of the sampler table: name, and draw(seed, device) -> an array or tensor (or a
    tuple of them) drawn from a generator seeded with ``seed`` (torch on ``device``, or NumPy)."""

    name: str
    draw: Callable[[int, Any], Any]


def _torch_gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# The callables look fast.gaussian_projection / ref_features.gaussian_projection up when they run,
# so a patched module attribute (a planted bug in a test) is what gets checked.
SAMPLERS: tuple[Sampler, ...] = (
    Sampler("fast.gaussian_projection iid",
            lambda seed, device: fast.gaussian_projection(48, 16, generator=_torch_gen(seed, device), device=device,
                                                          dtype=torch.float64)),
    Sampler("fast.gaussian_projection orthogonal",
            lambda seed, device: fast.gaussian_projection(48, 16, orthogonal=True, generator=_torch_gen(seed, device),
                                                          device=device, dtype=torch.float64)),
    Sampler("reference.features.gaussian_projection iid",
            lambda seed, device: ref_features.gaussian_projection(48, 16, np.random.default_rng(seed))),
    Sampler("reference.features.gaussian_projection orthogonal",
            lambda seed, device: ref_features.gaussian_projection(48, 16, np.random.default_rng(seed), orthogonal=True)),
)


def _compare_samples(a: Any, b: Any) -> list[str]:
    a_parts = a if isinstance(a, tuple) else (a,)
    b_parts = b if isinstance(b, tuple) else (b,)
    if len(a_parts) != len(b_parts):
        return ["number of outputs"]
    return [f"output {i}" for i, (x, y) in enumerate(zip(a_parts, b_parts)) if not bitwise_equal(x, y)]


def _run_samplers(ctx: Context, samplers: tuple[Sampler, ...] | None = None) -> Outcome:
    prepare_device(ctx.device)
    rows, reasons = [], []
    for i, sampler in enumerate(SAMPLERS if samplers is None else samplers):
        before = GlobalState.take()
        seed = base_seed(ctx.seed, 2, i)
        bad, details, _ = judge(lambda s: sampler.draw(s, ctx.device), seed, _compare_samples, before)
        rows.append({"sampler": sampler.name, "seed": seed, "ok": not bad, **details})
        reasons += [f"{sampler.name}: {r}" for r in bad]
    return judged(not reasons, float(len(reasons)), reasons, samplers=rows, device=ctx.device,
                  statistic="number of failed conditions over the samplers")


def samplers_check(samplers: tuple[Sampler, ...] | None = None) -> Check:
    """reproducibility/samplers over ``samplers`` (None: SAMPLERS, looked up when it runs)."""
    return Check("reproducibility/samplers", "samplers draw from the given generator only",
                 "docs/design.md (explicit generators, no global RNG)", "reproducibility",
                 run=lambda ctx: _run_samplers(ctx, samplers), threshold=0.0, compare="<=", unit=UNIT)


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms() if m.draw is not None] + [samplers_check()]
