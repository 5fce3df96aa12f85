"""Select, run and report checks: the engine behind ``python -m verify`` and the report."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

from tqdm.auto import tqdm

from verify.checks import all_checks
from verify.result import Check, CheckResult, Context


def select(checks: list[Check], only: list[str] | None = None, quick: bool = False) -> list[Check]:
    """Keep quick checks in quick mode, and those whose id starts with any of ``only``.

    Raises ValueError if ``only`` matches nothing (a typo should not pass as "all green").
    """
    chosen = [c for c in checks if (c.quick or not quick)]
    if only:
        chosen = [c for c in chosen if any(c.id.startswith(p) for p in only)]
        if not chosen:
            known = ", ".join(c.id for c in checks)
            raise ValueError(f"--only {only} matches no check; known ids: {known}")
    return chosen


def run_checks(
    quick: bool = True,
    only: list[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> list[CheckResult]:
    """Run the selected checks with a progress bar and return their results.

    A check that raises is reported as a failure with its traceback in ``details``; it never
    stops the others.
    """
    chosen = select(all_checks(), only, quick)
    results: list[CheckResult] = []
    bar = tqdm(chosen, desc="verify", unit="check", disable=not progress, leave=False)
    for check in bar:
        bar.set_postfix_str(check.id)
        ctx = Context(quick=quick, device=device, seed=seed, note=bar.set_postfix_str)
        start = time.perf_counter()
        try:
            res = check.run(ctx)
        except Exception as exc:  # report, do not hide
            res = CheckResult(check.id, check.title, check.source, check.kind, "fail", None, None,
                              details={"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        res.seconds = time.perf_counter() - start
        results.append(res)
    return results


def seed_sweep(
    seeds: int, quick: bool = True, only: list[str] | None = None, device: str = "cpu", progress: bool = True
) -> dict[str, dict]:
    """Run the selected checks for seeds 0..seeds-1 and count failures per check id.

    This measures the real false-failure rate of each check (docs/methods.md: "a separate seed
    sweep measures the real false-failure rate; record it"). Returns
    {id: {"runs": seeds, "failures": k, "failed_seeds": [...], "rate": k / seeds}}.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    counts: dict[str, dict] = {}
    for seed in tqdm(range(seeds), desc="seeds", disable=not progress):
        for r in run_checks(quick=quick, only=only, device=device, seed=seed, progress=False):
            c = counts.setdefault(r.id, {"runs": 0, "failures": 0, "failed_seeds": []})
            c["runs"] += 1
            if r.status == "fail":
                c["failures"] += 1
                c["failed_seeds"].append(seed)
    for c in counts.values():
        c["rate"] = c["failures"] / c["runs"]
    return counts


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def format_table(results: list[CheckResult]) -> str:
    """A fixed-width table: id, source, status, statistic vs threshold, seconds."""
    head = ("id", "source", "status", "statistic", "threshold", "seconds")
    rows = [head] + [(r.id, r.source, r.status.upper() if r.status == "fail" else r.status,
                      _fmt(r.statistic), _fmt(r.threshold), f"{r.seconds:.1f}") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n_pass = sum(r.status == "pass" for r in results)
    n_fail = sum(r.status == "fail" for r in results)
    n_skip = sum(r.status == "skip" for r in results)
    lines.append(f"\n{n_pass} passed, {n_fail} failed, {n_skip} skipped")
    return "\n".join(lines)


def write_json(results: list[CheckResult], path: str | Path) -> None:
    """Write the results as a JSON list in the docs/design.md schema."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps([r.to_dict() for r in results], indent=2))
