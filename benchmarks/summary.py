"""pytest-benchmark's JSON of the peer suite -> the peers summary (schema "maskbench-peers/1").

    python benchmarks/summary.py benchmarks/out/peers.json --out benchmarks/out/peers-summary.json

NumPy and the standard library only (no torch): it runs anywhere the JSON is.

Input: the file written by ``pytest benchmarks --benchmark-json PATH`` (``make bench-ops``). That
file holds every round's time (``stats["data"]``: seconds per call, one entry per round),
which the interval needs; a file saved with ``--benchmark-save`` has them only with
``--benchmark-save-data``. Each benchmark's ``extra_info`` names its op, pass, impl (maskbench or
the peer), peer, B, H, N, d, m, dtype (float32 where absent: files from before dtypes), device,
max_rel_diff and, on CUDA, peak_memory_bytes and peak_memory_extra_bytes; the "maskbench" block
(benchmarks/conftest.py) gives threads, device, torch and peer versions and the skip messages.

Output rows, one per (op, pass, peer, B, H, N, d, m, dtype) with both benchmarks present:

    device                where they ran (cpu, cuda)
    maskbench_s, peer_s   the median over rounds of each (seconds per call)
    ratio                 peer_s / maskbench_s (> 1: maskbench is faster)
    ratio_low, ratio_high a 95% percentile bootstrap interval of the ratio of medians: the two
                          samples of round times are resampled independently with replacement
                          (``--boot`` resamples, default 2000, NumPy generator seeded by
                          ``--seed``, default 0, so the interval is reproducible), the ratio of
                          the resampled medians taken each time, and its 2.5% and 97.5%
                          percentiles reported
    rounds                [maskbench rounds, peer rounds]
    max_rel_diff          the equivalence check's largest relative Frobenius difference

and "benchmarks", one per benchmark (each library alone, paired or not: time and memory vs N):
op, pass, impl, peer, B, H, N, d, m, dtype, device, median_s, rounds, peak_memory_bytes,
peak_memory_extra_bytes (None off CUDA), max_rel_diff.

The schema stays "maskbench-peers/1": dtype, device and "benchmarks" were added to it, and a
reader of the earlier form finds every field it knew.

It also prints a markdown table of the ratios (rows: operation, columns: N; one table per pass,
d, m and dtype) with the intervals.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

SCHEMA = "maskbench-peers/1"
MASKBENCH = "maskbench"
PEERS = ("performer-pytorch", "pytorch-fast-transformers", "fla-core")
OP_ORDER = ("favor", "favor-causal", "elu", "elu-causal", "linear-causal", "softmax", "softmax-flash",
            "softmax-efficient", "softmax-math")
PASS_ORDER = ("forward", "forward+backward")
DTYPE_ORDER = ("float32", "bfloat16", "float16")
KEY_FIELDS = ("op", "pass", "peer", "B", "H", "N", "d", "m")
#: a benchmark's extra_info fields copied into its "benchmarks" entry (None where absent)
BENCH_FIELDS = ("op", "pass", "impl", "peer", "B", "H", "N", "d", "m", "dtype", "device")


def bootstrap_ratio_of_medians(mine: np.ndarray, theirs: np.ndarray, n_boot: int = 2000, seed: int = 0,
                               level: float = 0.95, chunk: int = 256) -> tuple[float, float, float]:
    """(median(theirs) / median(mine), low, high): the ratio of medians and its percentile bootstrap
    interval at ``level``. mine, theirs: 1-d arrays of positive round times, resampled
    independently with replacement ``n_boot`` times (generator np.random.default_rng(seed))."""
    mine, theirs = np.asarray(mine, dtype=float), np.asarray(theirs, dtype=float)
    if mine.ndim != 1 or theirs.ndim != 1 or mine.size == 0 or theirs.size == 0:
        raise ValueError(f"mine and theirs must be non-empty 1-d arrays, got shapes {mine.shape}, {theirs.shape}")
    if not (np.all(np.isfinite(mine)) and np.all(np.isfinite(theirs)) and mine.min() > 0 and theirs.min() > 0):
        raise ValueError("round times must be finite and positive")
    if n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    ratios = np.empty(n_boot)
    for start in range(0, n_boot, chunk):  # chunks keep the index arrays small for many rounds
        stop = min(start + chunk, n_boot)
        a = np.median(mine[rng.integers(0, mine.size, size=(stop - start, mine.size))], axis=1)
        b = np.median(theirs[rng.integers(0, theirs.size, size=(stop - start, theirs.size))], axis=1)
        ratios[start:stop] = b / a
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.median(theirs) / np.median(mine)), float(low), float(high)


def _environment(report: dict) -> dict:
    block = report.get("maskbench") or {}
    machine_info = report.get("machine_info") or {}
    commit_info = report.get("commit_info") or {}
    cpu = (machine_info.get("cpu") or {}).get("brand_raw") or machine_info.get("processor") or machine_info.get(
        "machine")
    commit = commit_info.get("id")
    if commit:
        commit = commit[:7] + ("+dirty" if commit_info.get("dirty") else "")
    return {
        "torch": block.get("torch"),
        "threads": block.get("threads"),
        "device": block.get("device", "cpu"),
        "dtype": block.get("dtype", "float32"),
        # glibc's heap held by --steady-allocator, or "default" (older reports say nothing: default)
        "allocator": block.get("allocator", "default"),
        "machine": block.get("device_name") or cpu,
        "datetime": report.get("datetime"),
        "commit": commit,
    }


def summarize(report: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """The peers summary (module doc) of one pytest-benchmark JSON report (a dict)."""
    if not isinstance(report, dict) or not isinstance(report.get("benchmarks"), list):
        raise ValueError("report must be pytest-benchmark's JSON (a dict with a 'benchmarks' list)")
    block = report.get("maskbench") or {}
    pairs: dict[tuple, dict[str, dict]] = {}
    singles = []
    for bench in report["benchmarks"]:
        info = bench.get("extra_info") or {}
        if not all(field in info for field in KEY_FIELDS) or "impl" not in info:
            continue  # not one of the peer suite's benchmarks
        key = tuple(info[field] for field in KEY_FIELDS) + (info.get("dtype") or "float32",)
        pairs.setdefault(key, {})[info["impl"]] = bench
        singles.append(_benchmark_entry(bench, block))
    rows = []
    for key, both in pairs.items():
        fields = dict(zip(KEY_FIELDS + ("dtype",), key))
        if MASKBENCH not in both or fields["peer"] not in both:
            continue
        mine, theirs = both[MASKBENCH], both[fields["peer"]]
        data = []
        for bench in (mine, theirs):
            times = (bench.get("stats") or {}).get("data")
            if not times:
                raise ValueError(f"benchmark {bench.get('name')!r} has no per-round data (stats['data']): write the "
                                 "JSON with --benchmark-json (or --benchmark-save with --benchmark-save-data)")
            data.append(np.asarray(times, dtype=float))
        ratio, low, high = bootstrap_ratio_of_medians(data[0], data[1], n_boot=n_boot, seed=seed)
        diffs = [b["extra_info"].get("max_rel_diff") for b in (mine, theirs)]
        diffs = [x for x in diffs if x is not None]
        rows.append({
            **fields,
            "device": mine["extra_info"].get("device") or block.get("device", "cpu"),
            "maskbench_s": float(np.median(data[0])),
            "peer_s": float(np.median(data[1])),
            "ratio": ratio, "ratio_low": low, "ratio_high": high,
            "rounds": [int(data[0].size), int(data[1].size)],
            "max_rel_diff": float(max(diffs)) if diffs else None,
        })
    rows.sort(key=_row_order)
    singles.sort(key=_benchmark_order)
    peers = block.get("peers") or {}
    return {
        "schema": SCHEMA,
        "environment": _environment(report),
        "peers": {name: peers.get(name) for name in PEERS},
        "skipped": list(block.get("skipped") or []),
        "rows": rows,
        "benchmarks": singles,
    }


def _benchmark_entry(bench: dict, block: dict) -> dict:
    """One benchmark alone: its fields, median time per call and peak GPU memory (module doc)."""
    info = bench.get("extra_info") or {}
    stats = bench.get("stats") or {}
    data = stats.get("data")
    median = float(np.median(np.asarray(data, dtype=float))) if data else stats.get("median")
    entry = {field: info.get(field) for field in BENCH_FIELDS}
    entry["dtype"] = entry["dtype"] or "float32"
    entry["device"] = entry["device"] or block.get("device", "cpu")
    entry.update(median_s=None if median is None else float(median),
                 rounds=int(len(data)) if data else stats.get("rounds"),
                 peak_memory_bytes=info.get("peak_memory_bytes"),
                 peak_memory_extra_bytes=info.get("peak_memory_extra_bytes"),
                 max_rel_diff=info.get("max_rel_diff"))
    return entry


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value), value) if value in order else (len(order), value)


def _row_order(row: dict) -> tuple:
    return (_rank(row["pass"], PASS_ORDER), row["B"], row["H"], row["d"], row["m"], _rank(row["dtype"], DTYPE_ORDER),
            _rank(row["op"], OP_ORDER), row["peer"], row["N"])


def _benchmark_order(entry: dict) -> tuple:
    return (_rank(entry["op"] or "", OP_ORDER), _rank(entry["dtype"], DTYPE_ORDER),
            _rank(entry["pass"] or "", PASS_ORDER), str(entry["impl"]), entry["B"] or 0, entry["H"] or 0,
            entry["d"] or 0, entry["m"] or 0, entry["N"] or 0)


def _n_label(n: int) -> str:
    k = int(round(math.log2(n))) if n > 0 else -1
    return f"2^{k}" if k >= 0 and 2 ** k == n else str(n)


def markdown(summary: dict) -> str:
    """Markdown tables of the ratios (peer time / maskbench time, > 1: maskbench is faster): one per
    pass, (B, H, d, m) and dtype, a row per operation and peer, a column per N; each cell the ratio
    of medians and its 95% bootstrap interval."""
    rows = summary.get("rows") or []
    if not rows:
        return "(no peer rows: nothing was timed against a peer)\n"
    env = summary.get("environment") or {}
    lines = [f"ratio = peer median time / maskbench median time (> 1: maskbench is faster), "
             f"[95% bootstrap interval]; {env.get('device')}, {env.get('threads')} threads, "
             f"torch {env.get('torch')}, commit {env.get('commit')}, "
             f"allocator {env.get('allocator', 'default')}", ""]
    tables: dict[tuple, list[dict]] = {}
    for row in rows:
        tables.setdefault((row["pass"], row["B"], row["H"], row["d"], row["m"], row.get("dtype", "float32")),
                          []).append(row)
    for (pass_, b, h, d, m, dtype), group in tables.items():
        ns = sorted({row["N"] for row in group})
        widths = f"d = m = {d}" if d == m else f"d = {d}, m = {m}"
        lines.append(f"| {pass_}, {widths}, B = {b}, H = {h}, {dtype} | " + " | ".join(_n_label(n) for n in ns)
                     + " |")
        lines.append("|---|" + "---|" * len(ns))
        by_op: dict[tuple, dict[int, dict]] = {}
        for row in group:
            by_op.setdefault((row["op"], row["peer"]), {})[row["N"]] = row
        for (op, peer), cells in by_op.items():
            text = [f"{cells[n]['ratio']:.2f} [{cells[n]['ratio_low']:.2f}, {cells[n]['ratio_high']:.2f}]"
                    if n in cells else "-" for n in ns]
            lines.append(f"| {op}: {peer} / maskbench | " + " | ".join(text) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="pytest-benchmark's --benchmark-json file")
    parser.add_argument("--out", type=Path, default=None, help="where to write the summary JSON")
    parser.add_argument("--boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.json.read_text())
    except FileNotFoundError:
        print(f"summary: {args.json} not found (make bench-ops writes it)", file=sys.stderr)
        return 2
    try:
        summary = summarize(report, n_boot=args.boot, seed=args.seed)
    except ValueError as err:
        print(f"summary: {args.json}: {err}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(markdown(summary))
    for why in summary["skipped"]:
        print(f"skipped: {why}")
    if args.out is not None:
        print(f"wrote {args.out} ({len(summary['rows'])} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
