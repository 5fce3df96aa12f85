"""equivalence/<mechanism>: fast equals reference on identical draws, float64 and float32, on
every variant of the mechanism (the statistic is the worst variant's)."""
from __future__ import annotations

import torch

from verify.mechanisms import mechanisms
from verify.registry import Mechanism, relative_error
from verify.result import Check, Context, Outcome, judged

#: Relative Frobenius error bounds (issue 2): float64 near round-off, float32 a few ulps * growth.
TOL = {"float64": 1e-10, "float32": 1e-4}
#: Sizes: one below the causal chunk, a non-multiple of it, and a larger one.
QUICK_SIZES = (1, 37, 300)
FULL_SIZES = (1, 2, 37, 64, 300, 1000)
DTYPES = (("float64", torch.float64), ("float32", torch.float32))


def _variant_errors(mech: Mechanism, variant, sizes, ctx: Context) -> dict[str, float]:
    """{"<dtype>/N=<n>": relative Frobenius error} of one variant."""
    errors = {}
    for n in sorted({mech.admissible(n) for n in sizes}):
        problem = mech.problem(n, ctx.seed, variant)
        expected = mech.reference(problem)
        for name, dtype in DTYPES:
            got = mech.fast(problem, ctx.device, dtype)
            if got.dtype != dtype:
                raise TypeError(f"{mech.id}: fast returned {got.dtype} for {dtype} inputs")
            errors[f"{name}/N={n}"] = relative_error(expected, got)
    return errors


def _run(mech: Mechanism, ctx: Context) -> Outcome:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    per_variant, reasons = {}, []
    for variant in mech.all_variants:
        ctx.note(f"equivalence/{mech.id} {variant.name}")
        errors = _variant_errors(mech, variant, sizes, ctx)
        worst = {name: max(v for k, v in errors.items() if k.startswith(name + "/")) for name in TOL}
        per_variant[variant.name] = {**{f"{name}_max_rel_error": worst[name] for name in TOL}, "errors": errors}
        reasons += [f"variant {variant.name!r}: {name} relative error {worst[name]:.3g} > {TOL[name]:g}"
                    for name in TOL if not worst[name] <= TOL[name]]
    worst = {name: max(v[f"{name}_max_rel_error"] for v in per_variant.values()) for name in TOL}
    worst_variant = max(per_variant, key=lambda v: per_variant[v]["float64_max_rel_error"])
    default = per_variant[mech.default_variant.name]
    return judged(not reasons, worst["float64"], reasons,
                  float64_max_rel_error=worst["float64"], float32_max_rel_error=worst["float32"],
                  float32_threshold=TOL["float32"], worst_variant=worst_variant, errors=default["errors"],
                  variants=per_variant, device=ctx.device, metric="relative Frobenius error",
                  statistic="max over variants and N of the float64 relative error (float32 must stay "
                            f"<= {TOL['float32']:g} too)")


def check_for(mech: Mechanism) -> Check:
    """equivalence/<id> of one record (registered or not)."""
    return Check(f"equivalence/{mech.id}", f"fast == reference: {mech.title}", mech.source, "equivalence",
                 run=lambda ctx: _run(mech, ctx), threshold=TOL["float64"], compare="<=", unit="relative")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()]
