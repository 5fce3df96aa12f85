"""A synthetic results.schema.Results and a fake asv results folder, built from formulas.

Two mechanisms by default: "causal" (one variant, a dense twin) and "tree-x" (two swept variants
"path" and "binary", a cost factor "diam", a metric "depth" with "depth bound", one variant that
is not swept); checks with a failing one with reasons and one with a malicious detail; numerics
checks (``numerics_check``: causal passing with allowed refusals, tree-x failing with silent
errors, a disallowed refusal and a missing bfloat16 path); a load warning; a gallery with a
matrix and a failed panel; perf checks (``perf_checks``: the roofline section). ``extra`` adds
plain mechanisms (for panels with more than ten lines). ``peers_summary`` builds a peer-suite
summary (schema maskbench-peers/1, the peers section). Nothing here measures: every number comes
from a formula.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from results.check import CheckResult
from results.schema import (Comparison, FavorError, FavorErrorCurve, Fit, Gallery, MaskPanel, MechanismInfo,
                           MemoryCurve, MemoryPoint, Results, SweepResult, VariantInfo)

MALICIOUS = "<script>alert('x')</script> & <b>bold</b>"
FAIL_REASON = "upper CI of time/diam slope 1.62 >= 1.35"
LOAD_WARNING = "timing stage 'sweeps' ran with load average 3.4 on 2 CPUs (less than 1 core idle)"
SIZES = [2**p for p in range(8, 15)]
DENSE_SIZES = [2**p for p in range(7, 13)]


def fit_of(sizes, values) -> Fit:
    """Least-squares slope of log values on log sizes with a fixed +-0.04 'interval'."""
    slope, intercept = np.polyfit(np.log(sizes), np.log(values), 1)
    return Fit(float(slope), float(slope) - 0.04, float(slope) + 0.04, float(intercept), 0.95, float(slope))


def sweep(mech: str, variant: str, impl: str, sizes, f, cost=None, metrics=None, error_n=None) -> SweepResult:
    wobble = np.random.default_rng(len(mech) + len(variant) + len(impl))
    secs = [float(f(n) * np.exp(wobble.normal(0, 0.02))) for n in sizes]
    fitted = [t >= 1e-3 or i >= len(sizes) - 4 for i, t in enumerate(secs)]
    keep = [i for i, k in enumerate(fitted) if k]
    s = SweepResult(mech, variant, impl, "cpu", "float32", 1, 3, list(sizes), secs, [secs] * 3, fitted,
                    fit_of([sizes[i] for i in keep], [secs[i] for i in keep]))
    if cost is not None:
        s.cost_factors = [float(cost(n)) for n in sizes]
        s.cost_fit = fit_of([sizes[i] for i in keep], [secs[i] / s.cost_factors[i] for i in keep])
    if metrics is not None:
        s.metrics = {k: [float(g(n)) for n in sizes] for k, g in metrics.items()}
    if error_n is not None:
        s.error, s.error_n = "MemoryError: cannot allocate <4 GiB>", error_n
    return s


def check(cid, kind, status, statistic, threshold, compare="", unit="", what=None, **details) -> CheckResult:
    """A CheckResult; ``what``: details["statistic"], the words that say what the statistic is."""
    if what is not None:
        details = {"statistic": what, **details}
    return CheckResult(cid, f"title of {cid}", "paper Sec. 1", kind, status, statistic, threshold, 0.5, details,
                       compare=compare, unit=unit)


#: The statistic every equivalence/<id> check describes in the same words (the page says it once per family).
EQUIVALENCE_WHAT = ("largest relative l2 error, over the rows of every variant and seed, of the fast path against the "
                    "float64 reference on identical inputs; random mechanisms compare the two on the same draws")

NUMERICS_STDS = (0.5, 1.0, 2.0, 4.0, 8.0)
NUMERICS_DIMS = (16, 64, 128)
NUMERICS_ROWS = 512
NUMERICS_REASON = "float32: 3 of 7680 rows silently off by more than 0.001 relative (worst 0.0123)"


def numerics_check(mech: str, special: dict | None = None, status: str = "pass", reasons=()) -> CheckResult:
    """numerics/<mech> with cells (float32, bfloat16) x NUMERICS_STDS x NUMERICS_DIMS at N = 256,
    NUMERICS_ROWS rows each, all clean (worst row error std / 8 times 1e-6 in float32, 3e-3 in bfloat16) except
    ``special``: {(dtype, std, d): {count: value}}. Statistic: silent + disallowed + errors."""
    cells = []
    for dtype, worst in (("float32", 1e-6), ("bfloat16", 3e-3)):
        for d in NUMERICS_DIMS:
            for std in NUMERICS_STDS:
                c = {"dtype": dtype, "std": std, "d": d, "n": 256, "rows": NUMERICS_ROWS, "silent": 0, "refusals": 0,
                     "disallowed": 0, "errors": 0, "unjudged": 0, "reference_refusals": 0,
                     "reference_disallowed": 0, "worst_row_error": worst * std / 8, "min_log2_ratio_refused": None,
                     "batch_dependent_refusals": 0}
                c.update((special or {}).get((dtype, std, d), {}))
                cells.append(c)
    statistic = float(sum(c["silent"] + c["disallowed"] + c["reference_disallowed"] + c["errors"] for c in cells))
    return check(f"numerics/{mech}", "numerics", status, statistic, 0.0, "<=", "count", cells=cells,
                 tolerance={"float32": 1e-3, "bfloat16": 1e-2}, reasons=list(reasons))


def numerics_checks() -> list[CheckResult]:
    """numerics/causal (passes: refusals at std 8 where a row's ratio is below 2^-126, so allowed)
    and numerics/tree-x (fails: 3 silent float32 rows at std 8, d 128; a disallowed float32
    refusal at std 4, d 64; bfloat16 at d 16 raised a TypeError)."""
    allowed = {"refusals": NUMERICS_ROWS, "min_log2_ratio_refused": "-inf"}
    causal = numerics_check("causal", {("float32", 8.0, 128): allowed, ("bfloat16", 8.0, 128): allowed})
    bad = {("float32", 8.0, 128): {"silent": 3, "worst_row_error": 0.0123},
           ("float32", 4.0, 64): {"refusals": NUMERICS_ROWS, "disallowed": NUMERICS_ROWS,
                                  "min_log2_ratio_refused": -40.5}}
    bad.update({("bfloat16", s, 16): {"errors": NUMERICS_ROWS} for s in NUMERICS_STDS})
    tree = numerics_check("tree-x", bad, "fail", [NUMERICS_REASON])
    return [causal, tree]


PERF_CEILING = 1.25
PERF_FAIL_REASON = "fraction 1.8 > validity ceiling 1.25: the FLOP count or the <baseline> is wrong"
PERF_SKIP_REASON = "no scatter baseline for this mask"


def perf_check(mech: str, baseline: str, fraction: float | None, target: float | None = None, status: str = "pass",
               reasons=(), n: int = 2**16, **extra) -> CheckResult:
    """perf/<mech> as Schema B (verify/checks/perf.py): fraction of the roofline in details and as
    the statistic, compared "<=" with the validity ceiling PERF_CEILING. Matmul baselines get
    GFLOP/s against a 50 GFLOP/s peak; fft / scatter baselines a baseline time instead."""
    seconds = 0.02
    matmul = baseline == "matmul" and fraction is not None
    details = {"baseline": baseline, "fraction": fraction, "target": target,
               "meets_target": None if target is None or fraction is None else fraction >= target,
               "N": n, "d": 64, "m": 64, "dtype": "float32", "threads": 1, "clock": "cpu", "seconds": seconds,
               "baseline_seconds": None if matmul or fraction is None else seconds * fraction,
               "gflops": 50.0 * fraction if matmul else None,
               "gflops_executed": 50.0 * fraction * 1.1 if matmul else None,
               "peak_gflops": 50.0 if matmul else None,
               "flops_useful": 50e9 * fraction * seconds if matmul else None,
               "flops_executed": 55e9 * fraction * seconds if matmul else None,
               "what": f"{mech} fast path at N = {n} against the {baseline} roofline", "reasons": list(reasons)}
    details.update(extra)
    return check(f"perf/{mech}", "perf", status, fraction, PERF_CEILING, "<=", "ratio", **details)


def perf_checks() -> list[CheckResult]:
    """Six perf/<id> checks: linear (matmul, 0.62, target 0.70 missed), causal (matmul, 0.55 at
    N = 2^14, target 0.50 stated at N = 2^16, met), toeplitz-1d (fft, 0.8, target 1/1.5 met),
    tree-x (scatter, 0.12, no target), broken (matmul, 1.8 above the ceiling: fails) and skipped
    (no fraction)."""
    return [perf_check("linear", "matmul", 0.62, 0.70, target_n=2**16),
            perf_check("causal", "matmul", 0.55, 0.50, n=2**14, target_n=2**16,
                       target_note="quick run timed N = 16,384; the target is stated at N = 65,536 (the full run)"),
            perf_check("toeplitz-1d", "fft", 0.8, 1 / 1.5, n=2**14),
            perf_check("tree-x", "scatter", 0.12),
            perf_check("broken", "matmul", 1.8, 0.70, "fail", [PERF_FAIL_REASON]),
            perf_check("skipped", "scatter", None, None, "skip", reason=PERF_SKIP_REASON)]


PEER_SIZES = (2**10, 2**12, 2**14, 2**16)
PEER_OF_OP = {"favor": "performer-pytorch", "favor-causal": "performer-pytorch", "elu": "pytorch-fast-transformers",
              "elu-causal": "pytorch-fast-transformers", "softmax": "torch-sdpa"}
#: ratio at N = 2^10, d = m = 64, per (op, pass); it grows by 4% per factor 4 in N, d = m = 16 has 0.8 of it.
PEER_BASE = {("favor", "forward"): 0.55, ("favor", "forward+backward"): 1.3,
             ("favor-causal", "forward"): 0.76, ("favor-causal", "forward+backward"): 0.95,
             ("elu", "forward"): 0.67, ("elu", "forward+backward"): 1.4,
             ("elu-causal", "forward"): 0.9, ("elu-causal", "forward+backward"): 1.1,
             ("softmax", "forward"): 1.0, ("softmax", "forward+backward"): 1.05}
PEER_SKIP = "pytorch-fast-transformers not installed: pip install pytorch-fast-transformers (docs/benchmarks.md)"
PEER_ENV = {"torch": "2.13.0+cpu", "threads": 2, "device": "cpu", "dtype": "float32",
            "machine": "Synthetic CPU @ 2.0GHz", "datetime": "2026-01-01T12:00:00", "commit": "abc1234"}


def peer_ratio(op: str, phase: str, n: int, d: int) -> float:
    return PEER_BASE[op, phase] * (1.04 ** math.log(n / 2**10, 4)) * (1.0 if d == 64 else 0.8)


def peers_summary(skip_fast_transformers: bool = False) -> dict:
    """A peers summary (schema maskbench-peers/1): every op x pass x d = m in {16, 64} x PEER_SIZES
    against its peer (PEER_OF_OP), B = 1, H = 4, maskbench at 1 ms x N / 2^10, ratio peer_ratio
    with a +-6% interval (none for softmax forward+backward at d = 16, N = 2^10). With
    ``skip_fast_transformers`` the elu rows are missing and "skipped" says why."""
    rows = []
    for (op, phase) in PEER_BASE:
        peer = PEER_OF_OP[op]
        if skip_fast_transformers and peer == "pytorch-fast-transformers":
            continue
        for d in (16, 64):
            for n in PEER_SIZES:
                ratio = peer_ratio(op, phase, n, d)
                mb = 1e-3 * n / 2**10
                no_interval = (op, phase, d, n) == ("softmax", "forward+backward", 16, 2**10)
                rows.append({"op": op, "pass": phase, "peer": peer, "B": 1, "H": 4, "N": n, "d": d, "m": d,
                             "maskbench_s": mb, "peer_s": mb * ratio, "ratio": ratio,
                             "ratio_low": None if no_interval else ratio * 0.94,
                             "ratio_high": None if no_interval else ratio * 1.06,
                             "rounds": [25, 25], "max_rel_diff": 3e-7 * (d / 16)})
    return {"schema": "maskbench-peers/1", "environment": dict(PEER_ENV),
            "peers": {"performer-pytorch": "1.1.4",
                      "pytorch-fast-transformers": None if skip_fast_transformers else "0.4.0"},
            "skipped": [PEER_SKIP] if skip_fast_transformers else [], "rows": rows}


def write_peers(path: Path, summary: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(peers_summary() if summary is None else summary, indent=1))
    return path


def make_results(extra: int = 0, perf: bool = True) -> Results:
    env = {"mode": "quick", "date": "2026-01-01 12:00:00 UTC", "git_commit": "abc1234", "threads": 2, "cpus": 2,
           "load": {"sweeps": {"start": [3.4, 2.0, 1.0], "end": [3.1, 2.1, 1.0]}}, "load_warning": LOAD_WARNING}
    depth = {"depth": lambda n: math.floor(math.log(n, 1.5)) - 3, "depth bound": lambda n: math.log(n) / math.log(1.5)}
    mechs = [
        MechanismInfo("causal", "Causal linear attention", "katharopoulos20 Sec. 3.2", "N"),
        MechanismInfo("tree-x", "Tree mask f(dist)", "choromanski22 Lemma 6.2", "N diam",
                      variants=[VariantInfo("path", "path, diam N - 1"), VariantInfo("binary", "complete binary"),
                                VariantInfo("star", "star (equivalence only)", sweep=False)],
                      cost_factor_name="diam"),
    ]
    sweeps = [
        sweep("causal", "default", "fast", SIZES, lambda n: 2e-6 * n),
        sweep("causal", "default", "dense", DENSE_SIZES, lambda n: 2e-9 * n * n),
        sweep("tree-x", "path", "fast", SIZES[:5], lambda n: 3e-9 * n * n, cost=lambda n: n - 1, metrics=depth),
        sweep("tree-x", "binary", "fast", SIZES, lambda n: 4e-7 * n * math.log2(n),
              cost=lambda n: 2 * math.log2(n) - 2, metrics=depth, error_n=2**15),
        sweep("tree-x", "path", "dense", DENSE_SIZES, lambda n: 2e-9 * n * n),
    ]
    comparisons = [
        Comparison("causal", "default", DENSE_SIZES, [2e-9 * n * n / (2e-6 * n) for n in DENSE_SIZES], None,
                   1000.0, 800.0, 1300.0, 1024, False),
        Comparison("tree-x", "path", DENSE_SIZES, [0.6] * len(DENSE_SIZES), None, 2.0e5, 9.0e4, None, None, True),
    ]
    memory = [
        MemoryCurve("causal", "default", "fast", "cpu", [MemoryPoint(n, n * 800.0, 3e8) for n in SIZES], 3e8,
                    "VmHWM reset"),
        MemoryCurve("causal", "default", "dense", "cpu",
                    [MemoryPoint(n, n * n * 12.0, 3e8, n > 256) for n in DENSE_SIZES], 3e8, "VmHWM reset"),
    ]
    grid = [2, 4, 8, 16, 32]
    pred = [0.3 / math.sqrt(m) for m in grid]
    favor = FavorError([0.2] * 4, [0.1] * 4, math.exp(0.08), 100, grid, pred,
                       [FavorErrorCurve(k, grid, [p * f for p in pred], [p * f * 0.9 for p in pred],
                                        [p * f * 1.1 for p in pred], -0.5, -0.55, -0.45)
                        for k, f in (("iid", 1.0), ("orthogonal", 0.8))])
    n = 16
    tril = np.tril(np.ones((n, n))).tolist()
    gallery = Gallery(n, 0, [MaskPanel("causal", n, 0.0, 1.0, (n + 1) / (2 * n), None, tril),
                             MaskPanel("tree-x", n, error="RuntimeError: mask <too> big & broken")], [])
    checks = [
        check("equivalence/causal", "equivalence", "pass", 1e-7, 1e-5, "<=", "relative", what=EQUIVALENCE_WHAT),
        check("complexity/causal", "complexity", "pass", 1.04, 1.35, "<=", "exponent",
              fast={"sizes": sweeps[0].sizes, "seconds": sweeps[0].seconds, "fit": sweeps[0].fit.to_dict()}),
        check("scale/causal", "scale", "pass", 3.5 * 2**30, 8 * 2**30, "<=", "bytes"),
        check("scale/causal-train", "scale", "pass", 2.5, 120.0, "<=", "seconds"),
        check("complexity/tree-x", "complexity", "fail", 1.62, 1.35, "<=", "exponent",
              fast={"sizes": [1, 2, 3], "seconds": [1.0, 2.0, 3.0],
                    "fit": fit_of([1, 2, 3], [1.0, 2.0, 3.0]).to_dict()},
              reasons=[FAIL_REASON]),
        check("equivalence/tree-x", "equivalence", "pass", 2e-7, 1e-5, ">=", "relative", what=EQUIVALENCE_WHAT),
        check("performer/lower-bound", "bound", "pass", 0.7, 0.5, ">=", "ratio"),
        check("performer/broken", "statistical", "fail", None, 0.01, "<=", "",
              error=MALICIOUS, traceback="Traceback <module>", reasons=[MALICIOUS]),
        check("tree/skipped", "bound", "skip", None, None, reason="no GPU"),
        *numerics_checks(),
        *(perf_checks() if perf else []),
    ]
    for i in range(extra):
        mid = f"extra-{i:02d}"
        mechs.append(MechanismInfo(mid, f"Extra mechanism {i}", "synthetic", "N log N"))
        sweeps.append(sweep(mid, "default", "fast", SIZES, lambda n, i=i: (1 + i) * 1e-7 * n * math.log2(n)))
        sweeps.append(sweep(mid, "default", "dense", DENSE_SIZES, lambda n: 2e-9 * n * n))
        # each extra mechanism brings the checks of a real one: equivalence (the family's shared description),
        # complexity, and a numerics check whose every cell is 0 (the page folds such panels into one line)
        checks.insert(0, check(f"equivalence/{mid}", "equivalence", "pass", 1e-7, 1e-5, "<=", "relative",
                               what=EQUIVALENCE_WHAT, n=4096, max_abs_error=3e-8, fit_seconds=1362.4))
        checks.insert(1, check(f"complexity/{mid}", "complexity", "pass", 1.1, 1.35, "<=", "exponent"))
        checks.append(numerics_check(mid))
        comparisons.append(Comparison(mid, "default", DENSE_SIZES,
                                      [2e-9 * n / ((1 + i) * 1e-7 * math.log2(n)) for n in DENSE_SIZES], None,
                                      float(2 ** (9 + i % 5)), float(2 ** (8.5 + i % 5)), float(2 ** (9.5 + i % 5)),
                                      None, i % 2 == 1))
    return Results(env, mechs, sweeps, comparisons, memory, favor, gallery, checks,
                   "synthetic checks (tests/reports/synthetic.py)", {"sweeps": 12.0, "memory": 3.5})


COMMITS = (("aaaa1111aaaa", 1_700_000_000_000), ("bbbb2222bbbb", 1_700_100_000_000),
           ("cccc3333cccc", 1_700_200_000_000))


def make_asv(root: Path, commits=COMMITS) -> Path:
    """asv (result format 2) files for ``commits`` on one machine: track_exponent and
    time_attention of "causal" and "tree-x" (class tree_x), N = 4096 missing on the first commit,
    and an accuracy track_ benchmark. Returns ``root``."""
    machine = Path(root) / "box"
    machine.mkdir(parents=True, exist_ok=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    cols = ["result", "params", "version", "started_at", "duration"]
    for i, (commit, date) in enumerate(commits):
        results = {}
        for cls, base in (("causal", 1.0), ("tree_x", 1.3)):
            results[f"complexity.{cls}.track_exponent"] = [base + 0.01 * i, [], "v", 0, 1.0]
            big = None if i == 0 else 4e-3 * (1 + 0.1 * i)
            results[f"attention.{cls}.time_attention"] = [
                [1e-3 * (1 + 0.1 * i), big, 5e-3, 8e-2],
                [["'fast'", "'dense'"], ["1024", "4096"]], "v", 0, 1.0]
        results["accuracy.causal.track_relative_error"] = [[1e-7, 2e-7, 1e-7 * (i + 1), 3e-7],
                                                           [["'fast'", "'dense'"], ["64", "256"]], "v", 0, 1.0]
        data = {"commit_hash": commit, "date": date, "env_name": "e", "params": {}, "python": "3.11",
                "requirements": {}, "env_vars": {}, "result_columns": cols, "version": 2, "durations": {},
                "results": results}
        (machine / f"{commit[:8]}-existing.json").write_text(json.dumps(data))
    return Path(root)


GPU_FAILED_TEST = "tests/fast/test_graphs.py::test_device_graph[cuda]"
GPU_FAILED_CHECK = "reproducibility/packing"


def gpu_run(finished: bool = True, peers: bool = True) -> dict:
    """A GPU run (schema maskbench-gpu/1, reports.sections.gpu): two CUDA tests (one failed), three checks
    (one failed with a reason, one with a malicious detail), two sweeps (time 0.1 ms + N / 2^27 s,
    memory 64 bytes x N) and, with ``peers``, the peers summary of ``peers_summary``. Without
    ``finished`` the run stopped after the checks stage (no "seconds", no sweeps, no peers)."""
    env = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "gpu_memory_bytes": 80 * 2**30,
           "multiprocessors": 132, "driver": "580.159.03", "cuda_runtime": "13.0", "cudnn": 91300,
           "tf32_matmul": False, "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0", "fla-core": None},
           "python": "3.12.3", "host": "gpu-host", "cpus": 16, "git_commit": "abc1234", "date": "2026-11-27"}
    cases = [{"id": "tests/fast/masks/test_diffusion.py::test_device_matches_cpu[cuda-laplacian]",
              "outcome": "passed", "seconds": 0.4, "message": ""},
             {"id": GPU_FAILED_TEST, "outcome": "failed", "seconds": 0.1, "message": "assert 10 == 12"}]
    checks = [check("equivalence/causal", "equivalence", "pass", 0.06, 1.0, "<=").to_dict(),
              check(GPU_FAILED_CHECK, "equivalence", "fail", 1.0, 0.0, "<=",
                    reasons=["same seed, different bits"]).to_dict(),
              check("numerics/causal", "bound", "pass", 0.2, 1.0, "<=", note=MALICIOUS).to_dict()]
    run = {"schema": "maskbench-gpu/1", "budget_s": 480.0, "environment": env,
           "stage_seconds": {"tests": 41.0, "checks": 150.0}, "skipped_stages": [],
           "tests": {"command": "pytest -k cuda tests", "returncode": 1, "seconds": 41.0, "timed_out": False,
                     "tail": "", "cases": cases, "tally": {"passed": 1, "failed": 1, "error": 0, "skipped": 0}},
           "checks": {"command": "python -m verify --device cuda --quick", "returncode": 1, "seconds": 150.0,
                      "timed_out": False, "tail": "", "results": checks}}
    if not finished:
        return run
    sizes = [2**p for p in range(10, 18)]
    curves = []
    for mech, cls in (("causal", "N"), ("toeplitz-1d", "N log N")):
        secs = [1e-4 + n / 2**27 for n in sizes]
        curves.append({"mechanism": mech, "title": mech, "complexity": cls, "variant": "default",
                       "dtype": "float32", "sizes": sizes, "seconds": secs, "peak_bytes": [64 * n for n in sizes],
                       "memory_method": "cuda.max_memory_allocated",
                       "fit": fit_of(sizes[-4:], secs[-4:]).to_dict(), "error": None})
    curves[1]["error"] = "N = 262,144: OutOfMemoryError: planted"
    run["stage_seconds"].update(sweeps=60.0, peers=80.0)
    run["sweeps"] = {"seconds": 60.0, "rounds": 3, "curves": curves}
    run["peers"] = ({"command": "pytest benchmarks --device cuda --quick", "returncode": 0, "seconds": 80.0,
                     "timed_out": False, "tail": "", "summary": peers_summary()} if peers else
                    {"command": "pytest benchmarks", "returncode": 1, "seconds": 3.0, "timed_out": False, "tail": "",
                     "summary": None, "summary_error": "the peer suite wrote no JSON"})
    run["seconds"] = 331.0
    run["failures"] = [f"1 CUDA test(s) failed: {GPU_FAILED_TEST}", f"1 check(s) failed: {GPU_FAILED_CHECK}"]
    return run
