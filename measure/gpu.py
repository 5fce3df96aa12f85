"""python -m measure.gpu (``make gpu-check``): the one-command GPU run, in one results JSON.

    python -m measure.gpu [--out reports/out/gpu.json] [--device cuda] [--budget 480]
        [--skip-tests] [--skip-checks] [--skip-sweeps] [--skip-peers] [--no-progress]

Five stages, each with its share of one wall-clock budget (default 480 s, ``make gpu-check``'s
8 minutes on one H100), in this order:

1. tests: ``pytest -k cuda tests`` (every CUDA test; they skip on a machine without one), per
   test outcome from pytest's JUnit XML;
2. checks: ``python -m verify --device <device> --quick --json ...``, which rewrites its JSON
   after every check, so a stage stopped at its time limit keeps the checks that finished;
3. sweeps: time and peak memory vs N of every registered mechanism's fast path (default variant,
   float32, N = 2^10 upwards on the registry's grid): one warm-up call, then the median of
   ``ROUNDS`` synchronised measurements (measure.timing.measure) and the
   ``torch.cuda.max_memory_allocated`` peak of one more call above what was allocated before it
   (measure.memory.peak_memory; docs/methods.md: never nvidia-smi), in this process. A mechanism
   gets no further N once it has used its share of the stage's time;
4. causal: the causal comparisons of issue 25 (``causal_stage``), in this process: causal
   linear attention on given features (B = 1, H = 8, d = m = 64, N in CAUSAL_SIZES, float32 and
   bfloat16, forward and forward + backward) by maskbench's driver, by CausalMask.attend alone (the
   Triton scan on CUDA) and by flash-linear-attention's ``chunk_linear_attn`` where installed;
   causal FAVOR+ against the same features given; CausalMask.attend with per-key constants (the
   stabilised scan) against without, in float32; and causal FAVOR+ against SDPA's flash kernel in
   bfloat16 over CROSSOVER_SIZES, with the N from which FAVOR+ is faster and its interval
   (``crossover``). Few N and ``CAUSAL_ROUNDS`` rounds: a share of the budget, points in order of
   importance, no new point once it is used;
5. peers: the peer suite (benchmarks/, ``--device <device> --quick``): maskbench beside torch
   SDPA, performer-pytorch and flash-linear-attention where installed, each shown to compute the
   same function before it is timed; benchmarks/summary.py turns it into the peers summary.

The stages that run a child process get a time limit (their share of the budget, and never more
than what is left of it); one that runs over is stopped and recorded with ``timed_out``, and the
next stage still runs. The JSON (schema ``SCHEMA``) is rewritten after every stage, so a run
stopped anywhere keeps what finished. It records the device, driver, and the torch, CUDA, cuDNN
and Triton versions; ``python -m reports`` renders it as the page's "GPU" section
(reports/sections/gpu.py).

Exit status: 0 when the JSON was written and nothing failed, 1 when a test, a check or a peer's
equivalence failed or a stage ran out of time, 2 when the device is not a CUDA device that is
available here (the run says so and measures nothing) or on bad arguments.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SCHEMA = "maskbench-gpu/1"
DEFAULT_OUT = Path("reports") / "out" / "gpu.json"
#: make gpu-check's whole budget (seconds): the issue's 8 minutes on one H100.
DEFAULT_BUDGET_S = 480.0
#: Each stage's share of the budget (they add up to 1); a stage may use what earlier ones left. On an
#: H100 (16 cores, docs/runs/gpu-h100-2026-11-27.json) the CUDA tests took 42 s (pytest-xdist), the
#: four check shards 55-66 s and the timed check families about 95 s, the 23 sweeps 37 s; fla-core's
#: first-use autotuning (60-80 s per kernel and dtype) is moved out of the causal and peer stages
#: (start_warm).
SHARES = {"tests": 0.15, "checks": 0.35, "sweeps": 0.1, "causal": 0.2, "peers": 0.2}
STAGES = tuple(SHARES)
#: Timed measurements per point of a sweep (median); each lasts at least timing.MIN_MEASURE_S.
ROUNDS = 3
#: The sweeps start here: below it a GPU call is launch-bound, a flat line that says nothing.
MIN_SWEEP_N = 2**10
#: The peer suite's operations on the GPU (benchmarks/ops.py): FAVOR+ beside performer-pytorch, causal
#: linear attention beside flash-linear-attention's Triton kernels, softmax beside SDPA's flash
#: (bfloat16) and memory-efficient (float32) kernels. A peer that is not installed skips.
PEER_OPS = ("favor", "softmax-flash", "softmax-efficient", "linear-causal")
#: Python packages whose versions the environment records (None where not installed).
PACKAGES = ("torch", "triton", "numpy", "scipy", "fla-core", "performer-pytorch", "pytest-benchmark")

ROOT = Path(__file__).resolve().parents[1]


def status(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ environment


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi's query (a version string only: memory is
    never read from nvidia-smi, docs/methods.md); None where nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit() -> str | None:
    """HEAD's short hash, with "+ changes" when the tree differs from it (a copied working tree)."""
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    return f"{head} + changes" if _git("status", "--porcelain", "--untracked-files=no") else head


def cuda_environment(device: str) -> dict:
    """What qualifies the numbers: the GPU (name, compute capability, memory), the driver, and the
    torch, CUDA runtime, cuDNN, Triton and peer versions, with the host and the commit."""
    import torch

    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    return {
        "device": device, "gpu": props.name, "capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": int(props.total_memory), "multiprocessors": int(props.multi_processor_count),
        "driver": _driver_version(), "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "versions": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
        "git_commit": _git_commit(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def require_cuda(device: str) -> str | None:
    """None when ``device`` is a CUDA device that can hold a tensor here, else why not."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"torch cannot be imported ({exc})"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        return f"{device!r} is not a torch device ({exc})"
    if dev.type != "cuda":
        return f"{device!r} is not a CUDA device: the GPU run measures a GPU (use cuda or cuda:N)"
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine (torch sees no GPU), so there is nothing to measure"
    try:
        torch.zeros(1, device=dev)
    except Exception as exc:  # noqa: BLE001 - an absent index, a driver mismatch, ...
        return f"{device!r} cannot hold a tensor here ({type(exc).__name__}: {exc})"
    return None


# ------------------------------------------------------------------------------ child stages


@dataclass
class Child:
    """One child process of a stage: its command, exit status, wall seconds, whether it ran out of
    time, and the tail of its output."""

    command: list[str]
    returncode: int | None
    seconds: float
    timed_out: bool
    tail: str

    def to_dict(self) -> dict:
        return {"command": " ".join(self.command), "returncode": self.returncode, "seconds": round(self.seconds, 2),
                "timed_out": self.timed_out, "tail": self.tail}


def run_child(cmd: list[str], timeout: float, echo: bool = True, env: dict[str, str] | None = None,
              label: str = "") -> Child:
    """Run ``cmd`` in the repository root for at most ``timeout`` seconds, its output echoed line by
    line on stderr as it comes (``echo``; each line after ``[label]`` when one is given, for children
    that run side by side) and its last 40 lines kept. ``env``: variables set on top of ours."""
    start = time.perf_counter()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    prefix = f"[{label}] " if label else ""

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip("\n"))
            del lines[:-40]
            if echo:
                print(f"  {prefix}{line.rstrip()}", file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        proc.wait()
    reader.join(timeout=10)
    return Child(cmd, proc.returncode, time.perf_counter() - start, timed_out, "\n".join(lines))


def parse_junit(path: Path) -> list[dict]:
    """pytest's JUnit XML -> [{"id", "outcome" (passed | failed | error | skipped), "seconds",
    "message"}] ([] when the file is missing or unreadable: a stopped run writes none)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or "").strip().splitlines()[0][:300] if node.get("message") else ""
                break
        module = (case.get("classname") or "").replace(".", "/")
        cases.append({"id": f"{module}.py::{case.get('name')}" if module else str(case.get("name")),
                      "outcome": outcome, "seconds": float(case.get("time") or 0.0), "message": message})
    return cases


def _xdist() -> list[str]:
    """pytest-xdist's ``-n auto`` where it is installed (the CUDA tests share one GPU well; on 16
    cores they took 32 s instead of over 43 s serially on an H200), else nothing."""
    import importlib.util

    return ["-n", "auto"] if importlib.util.find_spec("xdist") is not None else []


def tests_stage(work: Path, timeout: float, echo: bool = True) -> dict:
    """Every CUDA test (``pytest -k cuda tests``, in parallel where pytest-xdist is installed), with
    per-test outcomes."""
    xml = work / "gpu-tests.xml"
    xml.unlink(missing_ok=True)
    child = run_child([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", "tests",
                       f"--junitxml={xml}"] + _xdist(), timeout, echo)
    cases = parse_junit(xml)
    return {**child.to_dict(), "cases": cases,
            "tally": {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "error", "skipped")}}


#: The check families that time calls on the device: they run after the others, alone on the GPU.
TIMED_FAMILIES = ("complexity/", "scale/")
#: The other checks run in this many verify processes side by side on CUDA (``--shard I/K``), one
#: per CORES_PER_SHARD CPU cores: most of a check's time is its float64 NumPy reference, on the CPU.
MAX_CHECK_SHARDS = 4
CORES_PER_SHARD = 4
#: The untimed checks' share of the checks stage when timed ones follow (they take what is left).
UNTIMED_SHARE = 0.6


def check_shards(device: str, cpus: int | None) -> int:
    """How many verify processes run the untimed checks side by side: one per CORES_PER_SHARD cores,
    at most MAX_CHECK_SHARDS, on CUDA; one elsewhere (a CPU run would time-share its own cores).

    >>> from measure.gpu import check_shards
    >>> check_shards("cuda", 16), check_shards("cuda", 2), check_shards("cpu", 16)
    (4, 1, 1)
    """
    if not str(device).startswith("cuda"):
        return 1
    return max(1, min(MAX_CHECK_SHARDS, (cpus or 1) // CORES_PER_SHARD))


def check_groups(only: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The ids of the quick selection (``only`` as verify's --only), split into (untimed, timed):
    timed are those of TIMED_FAMILIES. ValueError as verify.runner.select for an ``only`` that
    selects nothing."""
    from verify.checks import all_checks
    from verify.runner import select

    ids = [c.id for c in select(all_checks(), list(only) or None, True)]
    timed = [i for i in ids if i.startswith(TIMED_FAMILIES)]
    return [i for i in ids if i not in timed], timed


def _families(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(i.partition("/")[0] + "/" for i in ids))


def _read_results(path: Path) -> list[dict]:
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return got if isinstance(got, list) else []


def checks_stage(work: Path, device: str, timeout: float, echo: bool = True, only: tuple[str, ...] = ()) -> dict:
    """``python -m verify --device DEVICE --quick`` (``--only`` each of ``only``) in two parts: the
    untimed checks first, in ``check_shards`` processes side by side (``--shard I/K``, each with
    its share of the CPU cores), then the timed families (TIMED_FAMILIES: their calls are timed on
    the device) in one process alone. Each process rewrites its JSON after every check, so a
    stopped stage keeps what finished; ``results``: the check dicts of the results schema, in the
    selection's order; ``children``: each process's command, status, seconds and output tail."""
    path = work / "gpu-verify.json"
    path.unlink(missing_ok=True)
    untimed, timed = check_groups(only)
    base = [sys.executable, "-m", "verify", "--device", device, "--quick", "--no-progress"]
    base += [a for prefix in only for a in ("--only", prefix)]
    start = time.perf_counter()
    runs: list[tuple[Child, Path]] = []
    if untimed:
        shards = min(check_shards(device, os.cpu_count()), len(untimed))
        limit = timeout * UNTIMED_SHARE if timed else timeout
        skip_timed = [a for fam in _families(timed) for a in ("--exclude", fam)]
        threads = str(max(1, (os.cpu_count() or 1) // shards))
        env = None if shards == 1 else {k: threads for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                             "OPENBLAS_NUM_THREADS")}
        parts = [work / f"gpu-verify-{i}of{shards}.json" for i in range(1, shards + 1)]

        def shard(i: int) -> Child:
            parts[i - 1].unlink(missing_ok=True)
            split = ["--shard", f"{i}/{shards}"] if shards > 1 else []
            return run_child(base + skip_timed + split + ["--json", str(parts[i - 1])], limit, echo, env,
                             f"checks {i}/{shards}" if shards > 1 else "")

        with ThreadPoolExecutor(max_workers=shards) as pool:
            runs += zip(pool.map(shard, range(1, shards + 1)), parts)
    if timed:
        part = work / "gpu-verify-timed.json"
        part.unlink(missing_ok=True)
        cmd = base + [a for fam in _families(untimed) for a in ("--exclude", fam)] + ["--json", str(part)]
        runs.append((run_child(cmd, max(1.0, timeout - (time.perf_counter() - start)), echo,
                               label="checks timed" if untimed else ""), part))
    by_id = {r.get("id"): r for _, p in runs for r in _read_results(p)}
    order = untimed + timed
    results = [by_id[i] for i in order if i in by_id]
    from verify.runner import write_text

    write_text(path, json.dumps(results, indent=1))
    codes = [c.returncode for c, _ in runs]
    # the worst status: a crash or usage error (any other) before a failed check (1) before "inconclusive" (3)
    worst = [c for c in codes if c not in (0, 1, 3)] or [c for c in codes if c == 1] or [c for c in codes if c == 3]
    code = worst[0] if worst else 0
    return {"command": " && ".join(" ".join(c.command) for c, _ in runs), "returncode": code,
            "seconds": round(time.perf_counter() - start, 2), "timed_out": any(c.timed_out for c, _ in runs),
            "tail": "\n".join(c.tail for c, _ in runs)[-8000:], "results": results,
            "children": [c.to_dict() for c, _ in runs]}


def merge_benchmark_reports(reports: list[dict]) -> dict | None:
    """pytest-benchmark JSON reports of one suite run in parts -> one report: the first one's
    machine and maskbench blocks, every part's benchmarks, and the union of the skipped peers."""
    if not reports:
        return None
    merged = {**reports[0], "benchmarks": [b for r in reports for b in r.get("benchmarks") or []]}
    block = dict(merged.get("maskbench") or {})
    block["skipped"] = list(dict.fromkeys(s for r in reports for s in (r.get("maskbench") or {}).get("skipped") or []))
    merged["maskbench"] = block
    return merged


#: pytest's summary line of a skipped test (-ra): the suite's message says why a peer could not run.
_SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.+)$")


def peers_stage(work: Path, device: str, timeout: float, echo: bool = True, bench_args: tuple[str, ...] = ()) -> dict:
    """The peer suite on ``device`` (quick grid), one child per operation of PEER_OPS, each with its
    share of what is left (pytest-benchmark writes its JSON only at the end, so a part stopped at
    its limit loses only its own numbers; a Triton peer's first compile and autotune is paid in its
    own part), then the summary of the merged parts (benchmarks/summary.py). ``parts``: each
    operation's exit status, time and whether it was stopped. bench_args: more options for the suite
    (e.g. ``--bench-N``)."""
    start = time.perf_counter()
    reports, parts, tails, skipped = [], [], [], []
    for i, op in enumerate(PEER_OPS):
        raw = work / f"gpu-peers-{op}.json"
        raw.unlink(missing_ok=True)
        left = timeout - (time.perf_counter() - start)
        if left < 5:
            parts.append({"op": op, "skipped": "no time left"})
            continue
        child = run_child([sys.executable, "-m", "pytest", "benchmarks", "-v", "-p", "no:cacheprovider",
                           "--benchmark-enable", "--benchmark-group-by=group", "--benchmark-sort=name",
                           "--benchmark-min-rounds=5", "--benchmark-max-time=0.05", f"--benchmark-json={raw}",
                           "--device", device, "--quick", "--ops", op, *bench_args], left / (len(PEER_OPS) - i), echo)
        parts.append({"op": op, "returncode": child.returncode, "seconds": round(child.seconds, 2),
                      "timed_out": child.timed_out})
        tails.append(f"[{op}]\n{child.tail}")
        skipped += [m.group(1) for line in child.tail.splitlines() if (m := _SKIP_LINE.match(line))]
        try:
            reports.append(json.loads(raw.read_text()))
        except (OSError, ValueError):  # stopped, or nothing ran (every case skipped): no JSON
            pass
        finally:
            raw.unlink(missing_ok=True)
    codes = [p.get("returncode") for p in parts if p.get("returncode") is not None]
    out = {"command": f"pytest benchmarks --device {device} --quick --ops <each of {','.join(PEER_OPS)}>",
           "returncode": max(codes, key=lambda c: c not in (0, 5)) if codes else None,
           "seconds": round(time.perf_counter() - start, 2), "timed_out": any(p.get("timed_out") for p in parts),
           "tail": "\n".join(tails)[-4000:], "parts": parts, "summary": None}
    merged = merge_benchmark_reports(reports)
    if merged is not None:  # a part whose every case skipped wrote no JSON: keep its reasons
        block = merged["maskbench"]
        block["skipped"] = list(dict.fromkeys(block["skipped"] + skipped))
    if merged is None:
        out["summary_error"] = "no part of the peer suite finished (each was stopped, or failed before timing)"
        return out
    raw, summary_path = work / "gpu-peers.json", work / "gpu-peers-summary.json"
    write(merged, raw)
    summary_path.unlink(missing_ok=True)
    summ = run_child([sys.executable, str(ROOT / "benchmarks" / "summary.py"), str(raw), "--out", str(summary_path)],
                     120, echo=False)
    try:
        out["summary"] = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        out["summary_error"] = summ.tail[-1000:]
    return out


# ------------------------------------------------------------------------------ the sweeps stage


def sweep_curve(mech, device: str, sizes: tuple[int, ...], budget_s: float, rounds: int = ROUNDS,
                seed: int = 0, dtype=None) -> dict:
    """Time and peak memory of ``mech``'s fast path (default variant) at each N of ``sizes`` on
    ``device``, in increasing N until ``budget_s`` seconds (set-up included) have been used.

    A point: set-up (untimed), one warm-up call, the median of ``rounds`` synchronised
    measure.timing.measure's, then measure.memory.peak_memory around one more call (on CUDA the
    torch.cuda.max_memory_allocated peak above what was allocated before it; on the CPU, where
    this runs in the tests, the resident-set peak). An exception at one N is recorded in
    ``error`` and stops larger N. Returns {"mechanism", "title", "complexity", "variant",
    "dtype", "sizes", "seconds", "peak_bytes", "memory_method", "fit", "error"} ("fit": the
    exponent of time vs N under the one fit rule, measure.timing.fit_times, or None)."""
    import torch

    from measure.memory import peak_memory
    from measure.timing import fit_times, measure

    dtype = torch.float32 if dtype is None else dtype
    v = mech.default_variant
    done_n: list[int] = []
    seconds: list[float] = []
    peaks: list[int] = []
    method = None
    error = None
    start = time.perf_counter()
    with torch.inference_mode():
        for n in sizes:
            if done_n and time.perf_counter() - start >= budget_s:
                break
            try:
                problem = mech.problem(n, seed, v)
                run = mech.fast_setup(problem, device, dtype)
                del problem
                run()  # warm-up: kernels load, plans are made, the allocator grows
                times = sorted(measure(run, device) for _ in range(rounds))
                with peak_memory(device) as pk:
                    out = run()
                    del out
            except Exception as exc:  # noqa: BLE001 - recorded, larger N not tried
                error = f"N = {n:,}: {type(exc).__name__}: {exc}"
                break
            finally:
                run = None
                if str(device).startswith("cuda"):
                    torch.cuda.empty_cache()
            done_n.append(int(n))
            seconds.append(float(times[len(times) // 2]))
            peaks.append(int(pk.extra))
            method = pk.method
    fit = fit_times(done_n, seconds)[1] if len(done_n) >= 3 else None
    return {"mechanism": mech.id, "title": mech.title, "complexity": mech.complexity, "variant": v.name,
            "dtype": str(dtype).replace("torch.", ""), "sizes": done_n, "seconds": seconds, "peak_bytes": peaks,
            "memory_method": method, "fit": None if fit is None else fit.to_dict(), "error": error}


def sweep_sizes(mech) -> tuple[int, ...]:
    """The GPU grid of a mechanism: its full fast grid from MIN_SWEEP_N up (admissible sizes)."""
    sizes = sorted({mech.admissible(n) for n in mech.sizes("fast", False) if n >= MIN_SWEEP_N})
    return tuple(sizes) or tuple(sorted(mech.sizes("fast", False)))[-1:]


def sweeps_stage(device: str, budget_s: float, mechanisms=None,
                 progress: Callable[[str], None] = lambda msg: None) -> dict:
    """sweep_curve for every registered mechanism (or ``mechanisms``), the stage's time split
    evenly among those still to run (a fast one leaves its time to the next)."""
    from verify.mechanisms import mechanisms as registered

    mechs = list(registered() if mechanisms is None else mechanisms)
    start = time.perf_counter()
    curves = []
    for i, mech in enumerate(mechs):
        left = budget_s - (time.perf_counter() - start)
        share = max(0.0, left) / (len(mechs) - i)
        curve = sweep_curve(mech, device, sweep_sizes(mech), share)
        curves.append(curve)
        last = (f"N = {curve['sizes'][-1]:,}: {curve['seconds'][-1] * 1e3:.3g} ms, "
                f"{curve['peak_bytes'][-1] / 2**20:.1f} MiB") if curve["sizes"] else "no point"
        progress(f"sweep {mech.id}: {len(curve['sizes'])} N, {last}" + (f" ({curve['error']})" if curve["error"] else ""))
    return {"seconds": round(time.perf_counter() - start, 2), "rounds": ROUNDS, "curves": curves}


# ------------------------------------------------------------------------------ the causal stage

#: (B, H, d, m) of the causal comparisons: issue 25's targets (one H100, B = 1, H = 8, d = m = 64).
CAUSAL_SHAPE = (1, 8, 64, 64)
#: N of the features-given and FAVOR+ comparisons (issue 25: 2^14 .. 2^20): both ends and the middle.
CAUSAL_SIZES = (2**14, 2**17, 2**20)
#: N of causal FAVOR+ against SDPA's flash kernel in bfloat16, the grid the crossover is read on.
CROSSOVER_SIZES = (2**11, 2**12, 2**13, 2**14, 2**15, 2**16)
#: Timed rounds per point (each a measure.timing.measure of at least MIN_MEASURE_S).
CAUSAL_ROUNDS = 3
#: What the causal stage times: maskbench's driver on given features (masked_linear_attention),
#: CausalMask.attend alone (the Triton scan on CUDA), the same with per-key constants (the
#: decayed scan: "attend-stable"), fla-core's chunk_linear_attn, causal FAVOR+ (favor_attention),
#: the same with per-key running maxima on the decayed kernel (CausalMask.narrow_constants False:
#: "favor-decayed", the route before narrow slices took one constant and the plain kernel) and SDPA's flash kernel (exact softmax, is_causal=True).
CAUSAL_IMPLS = ("maskbench", "attend", "attend-stable", "fla", "favor", "favor-decayed", "sdpa-flash")
#: This project's implementations: an exception in one of them fails the run (``failures``).
MASKBENCH_IMPLS = ("maskbench", "attend", "attend-stable", "favor", "favor-decayed")
PASSES = ("forward", "forward+backward")
#: Triton's float32 dot for the causal stage's peers: three TF32 products, float32 accuracy on
#: tensor cores, as maskbench's kernel computes (causal_stage).
F32_DEFAULT = "tf32x3"


def causal_plan(sizes: tuple[int, ...] = CAUSAL_SIZES,
                crossover_sizes: tuple[int, ...] = CROSSOVER_SIZES) -> list[tuple[str, int, str, str]]:
    """The causal stage's points (impl, N, dtype, pass) in the order they run, the most wanted first:
    per N of ``sizes`` but the largest, the features-given trio (maskbench, attend, fla) in float32
    and bfloat16 and FAVOR+ in float32, both passes; then FAVOR+ and SDPA flash in bfloat16 over
    ``crossover_sizes``; then the largest N (its points cost the most, so a short budget spends
    itself on the comparisons at every other N first)."""
    def block(n: int) -> list[tuple[str, int, str, str]]:
        out = []
        for dtype in ("float32", "bfloat16"):
            for pass_ in PASSES:
                out += [(impl, n, dtype, pass_) for impl in ("maskbench", "attend", "fla")]
        return out + [(impl, n, "float32", pass_) for impl in ("favor", "favor-decayed", "attend-stable")
                      for pass_ in PASSES]

    ordered = sorted(sizes)
    plan = [p for n in ordered[:-1] for p in block(n)]
    for n in crossover_sizes:
        plan += [(impl, n, "bfloat16", pass_) for pass_ in PASSES for impl in ("favor", "sdpa-flash")]
    return plan + (block(ordered[-1]) if ordered else [])


def causal_unavailable(impl: str, device: str, dtype: str) -> str | None:
    """Why a peer of the causal stage cannot run here (benchmarks/ops.py's message), or None."""
    if impl not in ("fla", "sdpa-flash"):
        return None
    import torch

    from benchmarks import ops

    library = ops.FLA if impl == "fla" else ops.SDPA_FLASH
    return ops.library_unavailable(library, device, causal=True, dtype=getattr(torch, dtype), d=CAUSAL_SHAPE[2])


def causal_runner(impl: str, n: int, dtype: str, pass_: str, device: str, seed: int = 0,
                  shape: tuple[int, int, int, int] = CAUSAL_SHAPE) -> Callable[[], object]:
    """The zero-argument call the causal stage times: ``impl`` (CAUSAL_IMPLS) at N = n on seeded
    inputs of ``shape`` (B, H, d, m) in ``dtype`` on ``device`` (made here, untimed), forward under no_grad or
    forward and backward (gradients of every input, cleared before each call). Features given:
    positive, ELU+1 of Gaussian draws, the same for maskbench and fla-core (whose layout
    (B, N, H, m) is made here)."""
    import torch
    import torch.nn.functional as F

    import fast

    b, h, d, m = shape
    dt = getattr(torch, dtype)
    backward = pass_ == "forward+backward"
    # drawn on the device: three (1, 8, 2^20, 64) Gaussians take seconds on the host
    g = torch.Generator(device=device).manual_seed(seed)
    leaves: list = []

    def leaf(width: int, positive: bool = False):
        x = torch.randn(b, h, n, width, generator=g, device=device)
        x = F.elu(x) + 1 if positive else x
        t = x.to(device=device, dtype=dt).requires_grad_(backward)
        leaves.append(t)
        return t

    if impl in ("maskbench", "attend", "attend-stable", "fla"):
        phi_q, phi_k, v = leaf(m, True), leaf(m, True), leaf(d)
        mask = fast.CausalMask(n)
        if impl == "maskbench":
            def call():
                return fast.masked_linear_attention(phi_q, phi_k, v, mask)
        elif impl == "attend":
            def call():
                return mask.attend(phi_q, phi_k, v)
        elif impl == "attend-stable":
            # per-key constants as FAVOR+'s: a running maximum (of Gaussian rows, spread 3)
            c = torch.cummax(3 * torch.randn(b, h, n, generator=g, device=device), dim=-1).values.unsqueeze(-1)

            def call():
                return mask.attend(phi_q, phi_k, v, key_log_scale=c)
        else:
            from benchmarks.ops import fla_linear_causal

            leaves[:] = [t.detach().transpose(1, 2).contiguous().requires_grad_(backward) for t in leaves]

            def call():
                return fla_linear_causal(*leaves)
    elif impl in ("favor", "favor-decayed"):
        q, k, v = leaf(d), leaf(d), leaf(d)
        w = fast.gaussian_projection(m, d, orthogonal=True, generator=torch.Generator().manual_seed(seed)).to(device)
        mask = fast.CausalMask(n)
        mask.narrow_constants = impl == "favor"

        def call():
            return fast.favor_attention(q, k, v, w, mask=mask)
    elif impl == "sdpa-flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = leaf(d), leaf(d), leaf(d)

        def call():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        raise ValueError(f"impl must be one of {CAUSAL_IMPLS}, got {impl!r}")
    if not backward:
        def forward():
            with torch.no_grad():
                return call()
        return forward

    def forward_backward():
        for t in leaves:
            t.grad = None
        out = call()
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return forward_backward


#: fla-core's shapes (B, H, d, m, N) to autotune before the causal and peer stages need them: the
#: causal stage's and the peer suite's linear-causal (its quick grid on CUDA: H = 4, d = 64).
WARM_SHAPES = ((*CAUSAL_SHAPE, CAUSAL_SIZES[0]), (1, 4, 64, 64, 2**10))


#: The dtypes warm_fla autotunes, one child process each (start_warm), side by side. On one H100
#: (2026-11-28) that saved less than the half it was meant to: the children's compiles and timings
#: compete, and the float32 forward took 112 s beside the bfloat16 child (64 s alone on an H200 the
#: day before); the bfloat16 child's four calls took 229 s.
WARM_DTYPES = ("float32", "bfloat16")


def warm_fla(device: str, dtypes: tuple[str, ...] = WARM_DTYPES) -> None:
    """Run fla-core's causal linear attention once per WARM_SHAPES, dtype of ``dtypes`` and pass,
    so that Triton compiles and autotunes its kernels (60-80 s per kernel and dtype on an H100) and
    caches the choices on disk (fla-core asks Triton to), where the causal and peer stages'
    processes find them. Float32 dots as the causal stage takes them (TRITON_F32_DEFAULT,
    F32_DEFAULT), so the cache keys match. Prints one line per call."""
    os.environ.setdefault("TRITON_F32_DEFAULT", F32_DEFAULT)
    for b, h, d, m, n in WARM_SHAPES:
        for dtype in dtypes:
            for pass_ in PASSES:
                began = time.perf_counter()
                causal_runner("fla", n, dtype, pass_, device, shape=(b, h, d, m))()
                print(f"warm: fla B={b} H={h} d={d} m={m} N={n} {dtype} {pass_}: "
                      f"{time.perf_counter() - began:.1f} s", flush=True)


@dataclass
class Warm:
    """The warm children of a run (start_warm): their processes, log files and when they started."""

    procs: list[subprocess.Popen]
    logs: list[Path]
    began: float

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)


def start_warm(device: str, work: Path, codes: list[str] | None = None) -> Warm | None:
    """warm_fla in one child process per dtype of WARM_DTYPES, side by side (output to
    work/gpu-warm-<dtype>.log; ``codes``: other Python to run instead, one child each, for the
    tests), or None where there is nothing to warm: no CUDA device, or fla-core not installed."""
    import importlib.util

    if not str(device).startswith("cuda") or importlib.util.find_spec("fla") is None:
        return None
    if codes is None:
        codes = [f"from measure.gpu import warm_fla; warm_fla({device!r}, ({dtype!r},))" for dtype in WARM_DTYPES]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT", F32_DEFAULT)}
    procs, logs = [], []
    for i, code in enumerate(codes):
        log = work / f"gpu-warm-{WARM_DTYPES[i] if i < len(WARM_DTYPES) else i}.log"
        with open(log, "w") as out:  # the child holds its own descriptor
            procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=out,
                                          stderr=subprocess.STDOUT, env=env))
        logs.append(log)
    return Warm(procs, logs, time.perf_counter())


def finish_warm(warm: Warm, timeout: float, kill: bool = False) -> dict:
    """Wait at most ``timeout`` seconds in all for the warm children (kill them after, if ``kill``);
    their record for the JSON: returncode (None while one runs on, else the worst: the first
    non-zero), seconds since they started, the logs' tails."""
    deadline = time.perf_counter() + max(0.0, timeout)
    for proc in warm.procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            if kill:
                proc.kill()
                proc.wait()
    codes = [p.returncode for p in warm.procs]
    tails = []
    for log in warm.logs:
        try:
            tails += log.read_text().splitlines()[-6:]
        except OSError:
            pass
    code = None if None in codes else next((c for c in codes if c), 0)
    return {"returncode": code, "seconds": round(time.perf_counter() - warm.began, 2), "tail": "\n".join(tails)}


def time_point(runner: Callable[[], object], device: str, rounds: int = CAUSAL_ROUNDS) -> list[float]:
    """One warm-up call (compiles, autotunes, plans), then ``rounds`` synchronised
    measure.timing.measure's: their seconds per call, sorted."""
    from measure.timing import measure

    runner()
    return sorted(measure(runner, device) for _ in range(rounds))


def causal_stage(device: str, budget_s: float, progress: Callable[[str], None] = lambda msg: None,
                 plan: list[tuple[str, int, str, str]] | None = None, rounds: int = CAUSAL_ROUNDS) -> dict:
    """Time the points of ``plan`` (default causal_plan()) in order while ``budget_s`` seconds last
    (a point starts only with time left; the rest are listed in ``not_run``). A peer that cannot
    run here is skipped with its reason (``skipped``); an exception at one point is recorded in its
    ``error`` and the next point runs. Returns {"seconds", "rounds", "shape", "points", "skipped",
    "not_run", "summary", "triton_f32_default"} (``causal_summary``).

    float32 means float32 accuracy on both sides: Triton's dot of float32 tensors defaults to one
    TF32 product (10-bit mantissas), which fla-core would take while maskbench's kernel takes three
    ("tf32x3", fast.kernels.causal_scan), so TRITON_F32_DEFAULT is set to "tf32x3" (unless it is set
    already) before any fla-core kernel compiles, and recorded."""
    import torch

    os.environ.setdefault("TRITON_F32_DEFAULT", F32_DEFAULT)
    plan = causal_plan() if plan is None else plan
    start = time.perf_counter()
    points, skipped, not_run = [], {}, []
    for impl, n, dtype, pass_ in plan:
        key = f"{impl} {dtype}"
        if key not in skipped:
            why = causal_unavailable(impl, device, dtype)
            if why is not None:
                skipped[key] = why
                progress(f"causal: {key} skipped ({why})")
        if key in skipped:
            continue
        if time.perf_counter() - start >= budget_s:
            not_run.append({"impl": impl, "n": n, "dtype": dtype, "pass": pass_})
            continue
        point = {"impl": impl, "n": int(n), "dtype": dtype, "pass": pass_}
        began = time.perf_counter()
        try:
            point["seconds"] = time_point(causal_runner(impl, n, dtype, pass_, device), device, rounds)
        except Exception as exc:  # noqa: BLE001 - recorded; the next point runs
            point["error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()
        # the point's whole cost, set-up and warm-up included: where a first call compiles and
        # autotunes (fla-core's kernels: 60-80 s per kernel and dtype on an H100), it shows here
        point["wall_s"] = round(time.perf_counter() - began, 2)
        points.append(point)
        got = f"{point['seconds'][len(point['seconds']) // 2] * 1e3:.3g} ms" if "seconds" in point else point["error"]
        progress(f"causal: {impl} N = {n:,} {dtype} {pass_}: {got}")
    return {"seconds": round(time.perf_counter() - start, 2), "rounds": rounds,
            "shape": dict(zip("BHdm", CAUSAL_SHAPE)), "points": points, "skipped": skipped, "not_run": not_run,
            "summary": causal_summary(points), "triton_f32_default": os.environ.get("TRITON_F32_DEFAULT")}


def _median(xs: list[float]) -> float:
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def crossing(sizes: list[int], ratios: list[float]) -> float | str | None:
    """The N at which ratios (time of A / time of B, one per N of ``sizes``, increasing N) fall
    below 1 for good, interpolated linearly in (log2 N, log ratio) between the two N around the last
    crossing: a float; "below" when A is faster at every N; None when A is not faster at the
    largest N (no crossover on this grid)."""
    if not sizes or ratios[-1] >= 1:
        return None
    k = max((i for i in range(len(ratios)) if ratios[i] >= 1), default=-1)
    if k < 0:
        return "below"
    x0, x1 = math.log2(sizes[k]), math.log2(sizes[k + 1])
    y0, y1 = math.log(ratios[k]), math.log(ratios[k + 1])
    return 2 ** (x0 + (x1 - x0) * y0 / (y0 - y1))


def causal_summary(points: list[dict]) -> dict:
    """The causal stage's comparisons from its points (medians of their rounds):

    - ``vs_fla``: per (N, dtype, pass), fla / maskbench and fla / attend (>= 1: maskbench at least as
      fast as fla-core's chunk_linear_attn; issue 25's target for the features-given path);
    - ``favor_vs_given``: per (N, pass), favor / maskbench in float32 (issue 25's target: <= 1.3);
    - ``stable_vs_plain``: per (N, pass), CausalMask.attend with per-key constants over without, in
      float32: what FAVOR+'s stabiliser costs the scan (1.5x in the backward kernel at 2^20 on an
      H100, 2026-11-28);
    - ``decayed_vs_favor``: per (N, pass), causal FAVOR+ with per-key running maxima (the decayed
      kernel) over its default (a narrow slice's one constant, the plain kernel), in float32: > 1
      where the default is faster;
    - ``crossover``: per pass, the N from which causal FAVOR+ beats SDPA's flash kernel in bfloat16
      (``crossing`` of the median ratios) and its interval: the crossings of the rounds' most and
      least favourable ratios (fastest FAVOR+ over slowest SDPA, and the reverse), None where that
      ratio does not cross on the grid, "below" where FAVOR+ wins at every N.
    """
    t = {(p["impl"], p["n"], p["dtype"], p["pass"]): p["seconds"] for p in points if p.get("seconds")}
    med = {key: _median(s) for key, s in t.items()}
    vs_fla = []
    for (impl, n, dtype, pass_), s in sorted(med.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][1])):
        if impl != "fla":
            continue
        row = {"n": n, "dtype": dtype, "pass": pass_, "fla_s": s}
        for mine in ("maskbench", "attend"):
            if (mine, n, dtype, pass_) in med:
                row[f"{mine}_s"] = med[(mine, n, dtype, pass_)]
                row[f"fla_over_{mine}"] = s / med[(mine, n, dtype, pass_)]
        vs_fla.append(row)
    favor_vs_given = [{"n": n, "pass": pass_, "favor_s": s, "given_s": med[("maskbench", n, dtype, pass_)],
                       "favor_over_given": s / med[("maskbench", n, dtype, pass_)]}
                      for (impl, n, dtype, pass_), s in sorted(med.items(), key=lambda kv: (kv[0][3], kv[0][1]))
                      if impl == "favor" and dtype == "float32" and ("maskbench", n, dtype, pass_) in med]
    crossover = {}
    for pass_ in PASSES:
        ns = sorted(n for (impl, n, dtype, p) in t if impl == "favor" and dtype == "bfloat16" and p == pass_
                    and ("sdpa-flash", n, dtype, p) in t)
        if not ns:
            continue
        fav = [t[("favor", n, "bfloat16", pass_)] for n in ns]
        sdp = [t[("sdpa-flash", n, "bfloat16", pass_)] for n in ns]
        ratios = [_median(f) / _median(s) for f, s in zip(fav, sdp)]
        crossover[pass_] = {"sizes": ns, "favor_over_sdpa": ratios, "n": crossing(ns, ratios),
                            "interval": [crossing(ns, [f[0] / s[-1] for f, s in zip(fav, sdp)]),
                                         crossing(ns, [f[-1] / s[0] for f, s in zip(fav, sdp)])]}
    stable_vs_plain = [{"n": n, "pass": pass_, "stable_s": s, "plain_s": med[("attend", n, dtype, pass_)],
                        "stable_over_plain": s / med[("attend", n, dtype, pass_)]}
                       for (impl, n, dtype, pass_), s in sorted(med.items(), key=lambda kv: (kv[0][3], kv[0][1]))
                       if impl == "attend-stable" and dtype == "float32" and ("attend", n, dtype, pass_) in med]
    decayed_vs_favor = [{"n": n, "pass": pass_, "decayed_s": s, "favor_s": med[("favor", n, dtype, pass_)],
                         "decayed_over_favor": s / med[("favor", n, dtype, pass_)]}
                        for (impl, n, dtype, pass_), s in sorted(med.items(), key=lambda kv: (kv[0][3], kv[0][1]))
                        if impl == "favor-decayed" and dtype == "float32" and ("favor", n, dtype, pass_) in med]
    return {"vs_fla": vs_fla, "favor_vs_given": favor_vs_given, "crossover": crossover,
            "stable_vs_plain": stable_vs_plain, "decayed_vs_favor": decayed_vs_favor}


# ------------------------------------------------------------------------------ the run


def failures(run: dict) -> list[str]:
    """What makes the run fail (exit 1), in words: failed tests, failed checks, a peer suite that
    failed (a peer computing another function fails before it is timed), a stage out of time."""
    out = []
    tests = run.get("tests") or {}
    bad = [c["id"] for c in tests.get("cases", []) if c["outcome"] in ("failed", "error")]
    if bad:
        out.append(f"{len(bad)} CUDA test(s) failed: {', '.join(bad[:10])}")
    checks = run.get("checks") or {}
    bad = [r["id"] for r in checks.get("results", []) if r.get("status") == "fail"]
    if bad:
        out.append(f"{len(bad)} check(s) failed: {', '.join(bad[:10])}")
    bad = [f"{p['impl']} N = {p['n']} {p['dtype']} {p['pass']}" for p in (run.get("causal") or {}).get("points", [])
           if p.get("error") and p["impl"] in MASKBENCH_IMPLS]
    if bad:
        out.append(f"{len(bad)} causal comparison point(s) of maskbench raised: {', '.join(bad[:10])}")
    peers = run.get("peers") or {}
    if peers.get("returncode") not in (None, 0, 5) and not peers.get("timed_out"):
        out.append(f"the peer suite exited with status {peers['returncode']}")
    for stage in ("tests", "checks", "peers"):
        if (run.get(stage) or {}).get("timed_out"):
            out.append(f"the {stage} stage ran out of its time and was stopped")
    if (tests.get("returncode") not in (None, 0, 5)) and not tests.get("cases") and not tests.get("timed_out"):
        out.append(f"pytest exited with status {tests['returncode']} and reported no test")
    if checks.get("returncode") not in (None, 0, 1, 3) and not checks.get("timed_out"):
        # 1 is a failed check and 3 an inconclusive one (both in the results); anything else ended
        # a verify process early (bad arguments, a crash): its checks are missing, not passed
        out.append(f"a verify process exited with status {checks['returncode']} (see the checks stage's output)")
    return out


def write(run: dict, path: Path) -> None:
    """The run as JSON at ``path`` (atomically: verify.runner's writer)."""
    from verify.runner import write_text

    write_text(path, json.dumps(run, indent=1, default=str))


def collect(device: str, out: Path, budget_s: float = DEFAULT_BUDGET_S, skip: tuple[str, ...] = (),
            echo: bool = True, only: tuple[str, ...] = ()) -> dict:
    """Run the stages not in ``skip`` within ``budget_s`` seconds, rewriting ``out`` after each;
    ``only``: check id prefixes for the checks stage (all quick checks when empty)."""
    work = out.parent
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    run: dict = {"schema": SCHEMA, "budget_s": budget_s, "environment": cuda_environment(device),
                 "stage_seconds": {}, "skipped_stages": [s for s in STAGES if s in skip], "checks_only": list(only)}
    write(run, out)
    # fla-core autotunes on first use for minutes: from the start, beside the tests and checks
    warm = None if ("causal" in skip and "peers" in skip) else start_warm(device, work)
    shares_left = sum(SHARES[s] for s in STAGES if s not in skip)
    for stage in STAGES:
        if stage in skip:
            continue
        left = budget_s - (time.perf_counter() - start)
        limit = min(left, left * SHARES[stage] / shares_left)
        if warm is not None and stage in ("causal", "peers") and warm.running():
            # the timed stages wait for it (at most half their share), so that no autotuning
            # runs beside their timings; whatever is left of the share is theirs
            t0 = time.perf_counter()
            run["warm"] = finish_warm(warm, 0.5 * limit)
            limit -= time.perf_counter() - t0
            status(f"warm: {'still running' if warm.running() else 'done'} after "
                   f"{run['warm']['seconds']:.0f} s")
        shares_left -= SHARES[stage]
        if limit < 5:
            run[stage] = {"skipped": f"no time left in the {budget_s:g} s budget"}
            status(f"{stage}: skipped, no time left")
            continue
        status(f"{stage}: up to {limit:.0f} s")
        t0 = time.perf_counter()
        if stage == "tests":
            run[stage] = tests_stage(work, limit, echo)
        elif stage == "checks":
            run[stage] = checks_stage(work, device, limit, echo, only)
        elif stage == "sweeps":
            run[stage] = sweeps_stage(device, limit, progress=status)
        elif stage == "causal":
            run[stage] = causal_stage(device, limit, progress=status)
        else:
            run[stage] = peers_stage(work, device, limit, echo)
        run["stage_seconds"][stage] = round(time.perf_counter() - t0, 2)
        status(f"{stage}: {run['stage_seconds'][stage]:.1f} s")
        write(run, out)
    if warm is not None:
        run["warm"] = finish_warm(warm, 0.0, kill=True)
    run["seconds"] = round(time.perf_counter() - start, 2)
    run["failures"] = failures(run)
    write(run, out)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), metavar="FILE",
                    help=f"results JSON (default {DEFAULT_OUT}); its folder also holds the stages' raw files")
    ap.add_argument("--device", default="cuda", help="the CUDA device to measure (default cuda)")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                    help=f"wall-clock seconds for all stages together (default {DEFAULT_BUDGET_S:g})")
    for stage in STAGES:
        ap.add_argument(f"--skip-{stage}", action="store_true", help=f"leave out the {stage} stage")
    ap.add_argument("--only", action="append", default=[], metavar="ID",
                    help="run only the checks whose id starts with ID (repeatable; default every quick check)")
    ap.add_argument("--quiet", action="store_true", help="do not echo the child processes' output")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.budget) and args.budget > 0):
        ap.error(f"--budget must be a positive number of seconds, got {args.budget}")
    why = require_cuda(args.device)
    if why is not None:
        print(f"python -m measure.gpu: {why}. The GPU run needs a machine with an NVIDIA GPU and a CUDA "
              f"build of torch (README, \"Getting the right torch\"); nothing was measured.", file=sys.stderr)
        return 2
    skip = tuple(s for s in STAGES if getattr(args, f"skip_{s}"))
    out = Path(args.out)
    run = collect(args.device, out, args.budget, skip, echo=not args.quiet, only=tuple(args.only))
    for line in run["failures"]:
        status(f"FAIL: {line}")
    status(f"total {run['seconds']:.1f} s of a {args.budget:g} s budget; wrote {out.resolve()} "
           f"(render it with `python -m reports`)")
    return 1 if run["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
