"""The result of one check, in the JSON schema of docs/design.md."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

KINDS = ("equivalence", "statistical", "bound", "complexity", "scale", "erratum")
STATUSES = ("pass", "fail", "skip")


@dataclass
class CheckResult:
    """id, title, source, kind, status, statistic, threshold, seconds, details (docs/design.md)."""

    id: str
    title: str
    source: str
    kind: str
    status: str
    statistic: float | None
    threshold: float | None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("statistic", "threshold"):
            if isinstance(d[key], float) and not math.isfinite(d[key]):
                d[key] = str(d[key])  # JSON has no inf/nan
        return d


@dataclass(frozen=True)
class Check:
    """A runnable check: ``run(ctx) -> CheckResult``. ``quick`` checks run in --quick (CI)."""

    id: str
    title: str
    source: str
    kind: str
    run: Callable[["Context"], CheckResult]
    quick: bool = True


@dataclass
class Context:
    """What a check may read: mode, device, base seed, and a progress callback."""

    quick: bool = True
    device: str = "cpu"
    seed: int = 0
    note: Callable[[str], None] = lambda msg: None
    #: Sweeps already measured in this process (verify.measure fills it), keyed by
    #: (mechanism, variant, impl, sizes, rounds, device, seed): a complexity check on the same
    #: grid reuses them instead of timing again, so a report shows one exponent per sweep.
    sweeps: dict = field(default_factory=dict)
