"""Checks and their results, in the JSON schema of docs/design.md.

A check declares its metadata once, in its ``Check`` record: id, title, source, kind, and how its
statistic is judged (threshold, compare, unit). ``Check.run(ctx)`` returns only what it measured,
an ``Outcome`` (status, statistic, details, and a threshold only where the run decides it); the
runner builds the ``CheckResult`` from the two (``Check.evaluate``), so a run cannot contradict
its declaration.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

#: "guard": a library guard fires where it must and stays silent where it must not (guard/<id>);
#: "reproducibility": same generator seed, same output; the global RNG untouched;
#: "numerics": float32 / bfloat16 rows against the float64 run of the same estimator (numerics/<id>);
#: "perf": the fast path's speed as a fraction of a roofline measured in the same run (perf/<id>:
#: the fp32 matmul rate, or a bare FFT / scatter of the same size); fails only on an invalid
#: measurement, the issue's speed targets are reported in its details.
KINDS = ("equivalence", "statistical", "bound", "complexity", "scale", "erratum", "guard", "reproducibility",
         "numerics", "perf")
#: "inconclusive": the check ran but could not decide (complexity/<id> on a busy machine, or an
#: interval too wide around a passing estimate); details["reason"] says why. Neither a pass nor a
#: failure: ``python -m verify`` exits 3 when nothing failed but something was inconclusive.
STATUSES = ("pass", "fail", "skip", "inconclusive")
#: How a statistic is compared with its threshold for a pass ("<=": statistic <= threshold);
#: "" where the check is not one comparison (or has no threshold).
COMPARES = ("<=", ">=", "<", ">", "")
#: Units of statistic and threshold: "bytes" and "seconds" are printed as MiB/GiB and s/ms;
#: "relative" (a relative error), "ratio" (of two like quantities, e.g. estimate error / radius),
#: "slope" and "exponent" (log-log slopes), "absolute" (same unit as the data), "count" (a number
#: of failed cases or conditions: guard/<id>, reproducibility/<id>), "" (none said).
UNITS = ("", "bytes", "seconds", "relative", "ratio", "slope", "exponent", "absolute", "count")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def passes(statistic: float | None, compare: str, threshold: float | None) -> bool | None:
    """Whether ``statistic compare threshold`` holds (None where there is nothing to compare)."""
    if statistic is None or threshold is None or not compare:
        return None
    return {"<=": statistic <= threshold, ">=": statistic >= threshold, "<": statistic < threshold,
            ">": statistic > threshold}[compare]


@dataclass
class CheckResult:
    """id, title, source, kind, status, statistic, threshold, seconds, details (docs/design.md),
    plus compare (how statistic is compared with threshold for a pass, COMPARES) and unit (UNITS).

    details["reasons"]: the reasons of a failure (list of strings; empty when it passed) in every
    check that can fail for more than one reason; details["error"]: the exception of a check
    that raised.
    """

    id: str
    title: str
    source: str
    kind: str
    status: str
    statistic: float | None
    threshold: float | None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    compare: str = ""
    unit: str = ""

    def __post_init__(self):
        _one_of("kind", self.kind, KINDS)
        _one_of("status", self.status, STATUSES)
        _one_of("compare", self.compare, COMPARES)
        _one_of("unit", self.unit, UNITS)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("statistic", "threshold"):
            if isinstance(d[key], float) and not math.isfinite(d[key]):
                d[key] = str(d[key])  # JSON has no inf/nan
        return d

    @property
    def reasons(self) -> list[str]:
        """Why it failed, in words: details["reasons"], else the error, else the comparison that
        did not hold; [] for a check that did not fail."""
        if self.status != "fail":
            return []
        given = [str(r) for r in self.details.get("reasons") or []]
        if given:
            return given
        if "error" in self.details:
            return [str(self.details["error"])]
        if passes(self.statistic, self.compare, self.threshold) is False:
            return [f"statistic {self.statistic:.3g} is not {self.compare} threshold {self.threshold:.3g}"]
        return ["failed (the check gave no reason)"]


@dataclass
class Outcome:
    """What one run of a check measured: status, statistic, details (see CheckResult), and a
    threshold only where the run decides it (the Check declares none then)."""

    status: str
    statistic: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None

    def __post_init__(self):
        _one_of("status", self.status, STATUSES)


def judged(ok: bool, statistic: float | None, reasons: list[str] | None = None, /, **details) -> Outcome:
    """An Outcome with status "pass" if ok else "fail", details["reasons"] = reasons (copied).

    Positional-only, so details may hold keys such as "statistic" (a description of it).
    """
    return Outcome("pass" if ok else "fail", statistic, {**details, "reasons": list(reasons or [])})


@dataclass(frozen=True)
class Check:
    """A runnable check and its declaration, the one place for its metadata.

    run(ctx) -> Outcome. ``quick`` checks run in --quick (CI). threshold / compare / unit: how
    the statistic is judged (statistic ``compare`` threshold passes), shown in the table and the
    report; a threshold that depends on the run is returned in the Outcome instead (declare None).
    """

    id: str
    title: str
    source: str
    kind: str
    run: Callable[["Context"], Outcome]
    quick: bool = True
    threshold: float | None = None
    compare: str = ""
    unit: str = ""

    def __post_init__(self):
        _one_of("kind", self.kind, KINDS)
        _one_of("compare", self.compare, COMPARES)
        _one_of("unit", self.unit, UNITS)
        if not self.id or "/" not in self.id:
            raise ValueError(f"check id must look like 'family/name', got {self.id!r}")

    def result(self, outcome: Outcome, seconds: float = 0.0) -> CheckResult:
        """The CheckResult of ``outcome``: metadata from this declaration, measurements from the run.

        TypeError if run() returned something else than an Outcome; ValueError if it returned a
        threshold that contradicts the declared one.
        """
        if not isinstance(outcome, Outcome):
            raise TypeError(f"check {self.id}: run() must return an Outcome (what was measured), "
                            f"got {type(outcome).__name__}")
        threshold = self.threshold
        if outcome.threshold is not None:
            if self.threshold is not None and outcome.threshold != self.threshold:
                raise ValueError(f"check {self.id}: run() returned threshold {outcome.threshold!r}, but the check "
                                 f"declares {self.threshold!r} (a run-dependent threshold is declared None)")
            threshold = outcome.threshold
        return CheckResult(self.id, self.title, self.source, self.kind, outcome.status, outcome.statistic, threshold,
                           seconds=seconds, details=dict(outcome.details), compare=self.compare, unit=self.unit)

    def evaluate(self, ctx: "Context") -> CheckResult:
        """Run the check and build its CheckResult (exceptions propagate: the runner reports them)."""
        start = time.perf_counter()
        outcome = self.run(ctx)
        return self.result(outcome, time.perf_counter() - start)

    def error_result(self, exc: BaseException, traceback_text: str = "", seconds: float = 0.0) -> CheckResult:
        """A failed CheckResult for a run that raised ``exc``."""
        return CheckResult(self.id, self.title, self.source, self.kind, "fail", None, self.threshold, seconds=seconds,
                           details={"error": f"{type(exc).__name__}: {exc}", "traceback": traceback_text,
                                    "reasons": [f"{type(exc).__name__}: {exc}"]},
                           compare=self.compare, unit=self.unit)


@dataclass
class Context:
    """What a check may read: mode, device, base seed, and a progress callback."""

    quick: bool = True
    device: str = "cpu"
    seed: int = 0
    note: Callable[[str], None] = lambda msg: None
    #: Sweeps already measured in this process (measure fills it), keyed by
    #: (mechanism, variant, impl, sizes, rounds, device, seed): a complexity check on the same
    #: grid reuses them instead of timing again, so a report shows one exponent per sweep.
    sweeps: dict = field(default_factory=dict)
