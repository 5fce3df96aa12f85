"""Time and peak memory of every registered mechanism x implementation x N.

One class per mechanism of the registry (common.mechanisms()), created below with type() and
named after the mechanism id ("toeplitz-1d" -> toeplitz_1d), so asv lists e.g.

    attention.causal.time_attention        params: implementation x N
    attention.causal.peakmem_attention

implementation is "reference" (NumPy float64), "fast" (torch float32, the claimed complexity) or
"dense" (the O(N^2) torch twin); N runs over every other power of two of the registry's
fast_sizes and dense_sizes (common.size_grid). Combinations beyond a limit are skipped (n/a):
reference and dense above max(dense_sizes) or the dense memory budget, fast above
max(fast_sizes), dense where there is no dense twin (common.skip_reason).

What is timed: setup (untimed) pins torch to one thread, draws the seeded problem (seed 0) and
builds the runner (tensor conversion, mask operators, dense masks for the twin); the timed body
is one call of the runner, i.e. exactly what measure/timing.py times in its sweeps.
peakmem_attention reports the peak RSS of the whole benchmark process after one call, so it
includes the interpreter, torch and the problem (a baseline of ~0.3 GiB here); read it as growth
with N (linear for fast, quadratic for reference and dense), not as the bytes of one call.

Why these settings (common.TIME_SETTINGS): a reference call at N = 8192 takes ~1.5 s, so at
most 3 samples of it; millisecond calls get 10 samples; two rounds (processes) per combination.
asv's numbers are for history across commits; exponents are fitted from measure/timing.py.
"""
from __future__ import annotations

from verify.registry import Mechanism

from . import common


class _AttentionBenchmark:
    """Template of the generated classes (the leading underscore hides it from asv)."""

    mechanism: Mechanism  # set on each generated class
    param_names = ["implementation", "N"]
    repeat = common.TIME_SETTINGS["repeat"]
    rounds = common.TIME_SETTINGS["rounds"]
    warmup_time = common.TIME_SETTINGS["warmup_time"]
    timeout = common.TIME_SETTINGS["timeout"]

    def setup(self, implementation, n):
        self.runner = common.prepare(self.mechanism, implementation, n).runner

    def time_attention(self, implementation, n):
        self.runner()

    def peakmem_attention(self, implementation, n):
        self.runner()


def _benchmark_class(mech: Mechanism) -> type:
    return type(
        common.class_name(mech.id),
        (_AttentionBenchmark,),
        {
            "__module__": __name__,
            "__doc__": f"{mech.id}: {mech.title} ({mech.source}); fast path claims O({mech.complexity}).",
            "mechanism": mech,
            "params": [list(common.IMPLEMENTATIONS), common.size_grid(mech)],
        },
    )


def _register_all() -> None:
    common.install_classes(globals(), [_benchmark_class(mech) for mech in common.mechanisms()])


_register_all()
