"""equivalence/<mechanism>: fast equals reference on identical draws, float64 and float32."""
from __future__ import annotations

import time

import torch

from verify.registry import Mechanism, mechanisms, relative_error
from verify.result import Check, CheckResult, Context

#: Relative Frobenius error bounds (issue 2): float64 near round-off, float32 a few ulps * growth.
TOL = {"float64": 1e-10, "float32": 1e-4}
#: Sizes: one below the causal chunk, a non-multiple of it, and a larger one.
QUICK_SIZES = (1, 37, 300)
FULL_SIZES = (1, 2, 37, 64, 300, 1000)


def _run(mech: Mechanism, ctx: Context) -> CheckResult:
    start = time.perf_counter()
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    errors = {}
    for n in sorted({mech.admissible(n) for n in sizes}):
        problem = mech.make_problem(n, ctx.seed)
        expected = mech.reference(problem)
        for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
            got = mech.fast(problem, ctx.device, dtype)
            if got.dtype != dtype:
                raise TypeError(f"{mech.id}: fast returned {got.dtype} for {dtype} inputs")
            errors[f"{name}/N={n}"] = relative_error(expected, got)
    worst = {name: max(v for k, v in errors.items() if k.startswith(name)) for name in TOL}
    ok = all(worst[name] <= TOL[name] for name in TOL)
    return CheckResult(
        id=f"equivalence/{mech.id}",
        title=f"fast == reference: {mech.title}",
        source=mech.source,
        kind="equivalence",
        status="pass" if ok else "fail",
        statistic=worst["float64"],
        threshold=TOL["float64"],
        seconds=time.perf_counter() - start,
        details={"float64_max_rel_error": worst["float64"], "float32_max_rel_error": worst["float32"],
                 "float32_threshold": TOL["float32"], "errors": errors, "device": ctx.device,
                 "metric": "relative Frobenius error"},
    )


def checks() -> list[Check]:
    return [
        Check(f"equivalence/{m.id}", f"fast == reference: {m.title}", m.source, "equivalence",
              run=lambda ctx, m=m: _run(m, ctx))
        for m in mechanisms()
    ]
