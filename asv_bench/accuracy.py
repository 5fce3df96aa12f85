"""Relative error of the torch implementations against the float64 reference, per mechanism x N.

One class per registered mechanism (same names as in attention.py), e.g.

    accuracy.causal.track_relative_error   params: implementation ("fast", "dense") x N

The value is verify.registry.relative_error: |out - ref|_F / |ref|_F, with both sides computed
on the same seeded problem (seed 0; random mechanisms consume the same draws), so it is float32
rounding plus any approximation the fast path makes. Tracking it across commits catches a
change that keeps the tests' tolerances but loses accuracy. N runs over the attention grid up
to max(dense_sizes), where the reference runs; the budget and the missing twins are skipped as
in common.skip_reason. The pass/fail tolerances live in verify/ (equivalence checks), not here.
The value is kept to 4 significant digits (common.significant), like every track_ value.
"""
from __future__ import annotations

from verify.registry import Mechanism, relative_error

from . import common

CANDIDATES = ("fast", "dense")


class _AccuracyBenchmark:
    """Template of the generated classes (the leading underscore hides it from asv)."""

    mechanism: Mechanism  # set on each generated class
    param_names = ["implementation", "N"]
    unit = "relative error"
    timeout = common.TIME_SETTINGS["timeout"]

    def setup(self, implementation, n):
        reason = common.skip_reason(self.mechanism, "reference", n)
        if reason is not None:
            raise NotImplementedError(reason)
        self.prepared = common.prepare(self.mechanism, implementation, n)

    def track_relative_error(self, implementation, n):
        truth = self.mechanism.reference(self.prepared.problem)
        return common.significant(relative_error(truth, self.prepared.runner()))


def _benchmark_class(mech: Mechanism) -> type | None:
    sizes = [n for n in common.size_grid(mech) if n <= max(mech.dense_sizes)]
    if not sizes:
        return None
    return type(
        common.class_name(mech.id),
        (_AccuracyBenchmark,),
        {
            "__module__": __name__,
            "__doc__": f"{mech.id}: relative error of fast and dense vs the float64 reference.",
            "mechanism": mech,
            "params": [list(CANDIDATES), sizes],
        },
    )


def _register_all() -> None:
    classes = [_benchmark_class(mech) for mech in common.mechanisms()]
    common.install_classes(globals(), [cls for cls in classes if cls is not None])


_register_all()
