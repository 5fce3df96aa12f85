"""Interleaved blocks: maskbench against each operation's peer, in alternating blocks of calls
(``make bench-blocks``; docs/benchmarks.md, "Interleaved blocks").

The peer suite (``make bench-ops``, pytest-benchmark) times maskbench's rounds, then the peer's:
whatever changes between the two (other load, the allocator's free lists, the CPU's clock) shows
in the ratio, and its bootstrap interval, drawn from the rounds of that one run, does not cover
it. On our 2-core machine the causal FAVOR+ forward ratio at m = d = 16 moved between 0.76 and
1.36 from one such run to the next. Here the two libraries alternate in blocks: a block is
``warm`` untimed calls then ``calls`` timed calls of one library, back to back as in a training
loop; blocks come in pairs, one of each library, the order swapped from pair to pair (AB, BA,
AB, ...). Each pair gives one ratio, the median of the peer's block over the median of
maskbench's, so drift slower than a pair cancels. The ratio reported is the median over the
pairs; its interval a 95% percentile bootstrap of that median, resampling the pairs (NumPy's
generator, seed 0). Above 1: maskbench is faster.

Each comparison first checks, untimed, that the peer computes maskbench's function on the same
inputs (benchmarks/ops.py ``compare``); a peer that does not, or is not installed, is reported
as skipped with the reason. NumPy and torch only; the peers are those of benchmarks/ops.py.

Blocks do not hold the allocator still. At these sizes (tensors of about 1 MiB) glibc gives the
top of its heap back to the system whenever the free space there passes its trim threshold, and
the next call faults those pages in again: 0 to 875 minor faults a call for one library, 22 to
1344 for the other, depending on what ran before. ``--steady-allocator`` sets glibc's trim
threshold to 2^30 and its mmap threshold to 32 MiB (``steady_allocator``) before any tensor is
made, for both libraries alike: the ratio of their computations, recorded as such in the JSON.

    python -m benchmarks.blocks --ops favor-causal,elu-causal --bench-N 4096,8192 --bench-d 16
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks import ops

__all__ = ["bootstrap_median", "compare_blocks", "main", "markdown", "steady_allocator", "time_blocks"]

#: Defaults of the command line: the small-heads grid of issue 25 on a 2-core CPU.
DEFAULT_OPS = ("favor", "favor-causal", "elu", "elu-causal")
DEFAULT_N = (2 ** 12, 2 ** 13, 2 ** 14)
BLOCKS, CALLS, WARM = 12, 20, 5


def bootstrap_median(values: list[float] | np.ndarray, n_boot: int = 2000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of ``values`` (1-d, finite): the median and the percentile bootstrap
    interval of the median at ``level`` (values resampled with replacement ``n_boot`` times by
    np.random.default_rng(seed)). ValueError for an empty or non-finite array, n_boot < 1 or a
    level outside (0, 1).

    >>> from benchmarks.blocks import bootstrap_median
    >>> m, low, high = bootstrap_median([1.0, 1.1, 0.9, 1.05, 0.95])
    >>> m, low <= m <= high
    (1.0, True)
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"values must be a non-empty 1-d array of finite numbers, got shape {x.shape}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(np.median(x)), float(low), float(high)


def time_blocks(first: Callable[[], object], second: Callable[[], object], blocks: int = BLOCKS,
                calls: int = CALLS, warm: int = WARM,
                timer: Callable[[], float] = time.perf_counter) -> tuple[list[list[float]], list[list[float]]]:
    """(first's blocks, second's blocks): ``blocks`` pairs of blocks, each block ``warm`` untimed then
    ``calls`` timed calls (seconds, by ``timer``) of one function; pair p runs first then second for
    even p, second then first for odd p. ValueError unless blocks, calls >= 1 and warm >= 0.

    >>> from benchmarks.blocks import time_blocks
    >>> a, b = time_blocks(lambda: None, lambda: None, blocks=2, calls=3, warm=0)
    >>> len(a), len(a[0]), len(b)
    (2, 3, 2)
    """
    for name, value, least in (("blocks", blocks, 1), ("calls", calls, 1), ("warm", warm, 0)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    out: tuple[list[list[float]], list[list[float]]] = ([], [])
    for pair in range(blocks):
        for which in ((0, 1) if pair % 2 == 0 else (1, 0)):
            fn = (first, second)[which]
            for _ in range(warm):
                fn()
            times = []
            for _ in range(calls):
                start = timer()
                fn()
                times.append(timer() - start)
            out[which].append(times)
    return out


def compare_blocks(op: str, pass_: str, size: ops.Size, blocks: int = BLOCKS, calls: int = CALLS, warm: int = WARM,
                   seed: int = 0, device: str = "cpu") -> dict:
    """One cell: ``op`` (benchmarks/ops.py OPS) in ``pass_`` ("forward" or "forward+backward") at
    ``size``, float32 on ``device``, maskbench against ops.PEER_OF[op] in ``time_blocks``. Returns a
    row: op, pass, peer, B, H, N, d, m, device, ratio (peer / maskbench, the median over pairs of
    block medians), ratio_low, ratio_high (its 95% bootstrap interval), maskbench_s and peer_s (the
    medians of their block medians), pairs, calls, max_rel_diff; or, where the peer cannot run here
    or computes another function, the same keys up to m with ``skipped`` (the reason) instead."""
    row = {"op": op, "pass": pass_, "peer": ops.PEER_OF[op], "B": size.B, "H": size.H, "N": size.N, "d": size.d,
           "m": size.m, "device": device}
    why = ops.op_unavailable(op, device, torch.float32, size.d)
    if why is not None:
        return {**row, "skipped": why}
    problem = ops.make_problem(size, device=device, seed=seed)
    check = ops.compare(op, pass_, problem)
    if not check.same:
        return {**row, "skipped": "not the same function, so not timed: " + check.message()}
    mine, theirs = (ops.timed_call(ops.prepare(op, library, problem, requires_grad=pass_ == "forward+backward"), pass_)
                    for library in (ops.MASKBENCH, ops.PEER_OF[op]))
    a, b = time_blocks(mine, theirs, blocks, calls, warm)
    ratios = [statistics.median(t) / statistics.median(s) for s, t in zip(a, b)]
    ratio, low, high = bootstrap_median(ratios, seed=seed)
    return {**row, "ratio": ratio, "ratio_low": low, "ratio_high": high,
            "maskbench_s": statistics.median(statistics.median(s) for s in a),
            "peer_s": statistics.median(statistics.median(t) for t in b),
            "pairs": blocks, "calls": calls, "max_rel_diff": check.max_rel_diff}


#: glibc's mallopt parameters (malloc.h) and the values ``steady_allocator`` sets: the trim
#: threshold far above any heap these benchmarks grow, the mmap threshold at the largest value
#: glibc accepts on 64-bit systems (larger ones are refused), which also stops its adjusting.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_TRIM, STEADY_MMAP = 2 ** 30, 32 * 2 ** 20


def steady_allocator() -> str:
    """Set glibc's malloc trim threshold to STEADY_TRIM and mmap threshold to STEADY_MMAP for this
    process (mallopt), so that freed tensors stay in the heap and later calls reuse their pages
    instead of faulting fresh ones in. Returns the setting in words (for the JSON). RuntimeError
    where the C library has no mallopt (not glibc) or refuses a value. Process-wide and for the
    rest of the process: a measurement setting, never called by the library.

    >>> from benchmarks.blocks import steady_allocator
    >>> steady_allocator()  # doctest: +SKIP
    'glibc mallopt: M_TRIM_THRESHOLD 1073741824, M_MMAP_THRESHOLD 33554432'
    """
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        raise RuntimeError(f"--steady-allocator needs glibc's mallopt; the C library here ({name}) has none")
    for param, value in ((M_TRIM_THRESHOLD, STEADY_TRIM), (M_MMAP_THRESHOLD, STEADY_MMAP)):
        if mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise RuntimeError(f"mallopt({param}, {value}) was refused by {name}")
    return f"glibc mallopt: M_TRIM_THRESHOLD {STEADY_TRIM}, M_MMAP_THRESHOLD {STEADY_MMAP}"


def markdown(rows: list[dict]) -> str:
    """A table per pass and width: a row per operation, a column per N, "ratio [low, high]" (or
    "skipped"); the skip reasons below.

    >>> from benchmarks.blocks import markdown
    >>> print(markdown([{"op": "elu", "pass": "forward", "peer": "p", "N": 4096, "d": 16, "m": 16,
    ...                  "ratio": 1.2, "ratio_low": 1.1, "ratio_high": 1.3}]))
    | forward, d = m = 16 | 2^12 |
    |---|---|
    | elu: p / maskbench | 1.20 [1.10, 1.30] |
    """
    out, reasons = [], []
    for pass_ in ops.PASSES:
        for d, m in sorted({(r["d"], r["m"]) for r in rows if r["pass"] == pass_}):
            cells = [r for r in rows if r["pass"] == pass_ and (r["d"], r["m"]) == (d, m)]
            ns = sorted({r["N"] for r in cells})
            width = f"d = m = {d}" if d == m else f"d = {d}, m = {m}"
            labels = [f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n) for n in ns]
            lines = [f"| {pass_}, {width} | " + " | ".join(labels) + " |", "|---" * (len(ns) + 1) + "|"]
            for op in dict.fromkeys(r["op"] for r in cells):
                by_n = {r["N"]: r for r in cells if r["op"] == op}
                peer = next(iter(by_n.values()))["peer"]
                row = []
                for n in ns:
                    r = by_n.get(n)
                    if r is None:
                        row.append("")
                    elif "skipped" in r:
                        row.append("skipped")
                        reasons.append(r["skipped"])
                    else:
                        row.append(f"{r['ratio']:.2f} [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}]")
                lines.append(f"| {op}: {peer} / maskbench | " + " | ".join(row) + " |")
            out.append("\n".join(lines))
    text = "\n\n".join(out)
    if reasons:
        text += "\n\nskipped: " + "; ".join(dict.fromkeys(reasons))
    return text


def _list(kind: type, text: str, name: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"{name} must be a comma-separated list, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """The command line (module doc; ``--help``). Prints the tables, writes the rows as JSON
    (schema maskbench-blocks/1) to ``--out``; progress on stderr. Exit 0, or 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.blocks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help="comma-separated operations of benchmarks/ops.py")
    parser.add_argument("--bench-N", default=",".join(map(str, DEFAULT_N)), help="comma-separated N")
    parser.add_argument("--bench-d", default="16", help="comma-separated widths d (m = d)")
    parser.add_argument("--bench-B", type=int, default=1)
    parser.add_argument("--bench-H", type=int, default=4)
    parser.add_argument("--passes", default=",".join(ops.PASSES), help="forward, forward+backward or both")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="pairs of blocks (default %(default)s)")
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per block (default %(default)s)")
    parser.add_argument("--warm", type=int, default=WARM, help="untimed calls before each block (default %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steady-allocator", action="store_true",
                        help="hold glibc's heap (trim threshold 2^30, mmap threshold 32 MiB) for both libraries")
    parser.add_argument("--out", default="benchmarks/out/blocks.json")
    args = parser.parse_args(argv)
    try:
        op_list = _list(str, args.ops, "--ops")
        sizes_n = _list(int, args.bench_N, "--bench-N")
        widths = _list(int, args.bench_d, "--bench-d")
        passes = _list(str, args.passes, "--passes")
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    bad = [o for o in op_list if o not in ops.OPS] + [p for p in passes if p not in ops.PASSES]
    if bad or min(sizes_n + widths) < 1 or min(args.blocks, args.calls, args.threads) < 1 or args.warm < 0:
        parser.error(f"unknown or out of range: {', '.join(bad) or 'a size, --blocks, --calls, --warm or --threads'} "
                     f"(ops: {', '.join(ops.OPS)}; passes: {', '.join(ops.PASSES)})")
    allocator = "default"
    if args.steady_allocator:
        try:
            allocator = steady_allocator()
        except RuntimeError as err:
            parser.error(str(err))
    torch.set_num_threads(args.threads)
    rows = []
    cells = [(op, p, n, d) for p in passes for d in widths for op in op_list for n in sizes_n]
    for i, (op, pass_, n, d) in enumerate(cells, 1):
        size = ops.Size(B=args.bench_B, H=args.bench_H, N=n, d=d, m=d)
        row = compare_blocks(op, pass_, size, args.blocks, args.calls, args.warm, args.seed)
        rows.append(row)
        got = row.get("skipped") or f"{row['ratio']:.2f} [{row['ratio_low']:.2f}, {row['ratio_high']:.2f}]"
        print(f"[{i}/{len(cells)}] {op} {pass_} N = {n} d = {d}: {got}", file=sys.stderr, flush=True)
    environment = {"torch": torch.__version__, "threads": args.threads, "device": "cpu",
                   "peers": {lib: ops.peer_version(lib) for lib in dict.fromkeys(r["peer"] for r in rows)},
                   "blocks": args.blocks, "calls": args.calls, "warm": args.warm, "seed": args.seed,
                   "allocator": allocator}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"schema": "maskbench-blocks/1", "environment": environment, "rows": rows}, indent=1))
    print(f"ratio = peer / maskbench, median over {args.blocks} pairs of alternating blocks of {args.calls} calls "
          f"[95% bootstrap interval]; cpu, {args.threads} threads, torch {torch.__version__}; allocator: "
          f"{allocator}\n")
    print(markdown(rows))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
