"""python -m reports: render a results JSON (and asv results) into DIR/index.html and its PNGs.

The work is split in two. ``python -m measure --out FILE`` measures (timing sweeps, peak
memory in child processes, the FAVOR+ experiment, the mask gallery, the checks) and writes one
results JSON (results/schema.py). ``python -m reports`` only draws: it reads that file and the asv
results folder (re-read on every render) and, for the peers section, the peer suite's summary
(``make bench-ops`` writes benchmarks/out/peers-summary.json; ``--peers-json`` names another) and,
for the GPU section, the GPU run (``make gpu-check`` writes reports/out/gpu.json; ``--gpu-json``
names another), and writes the page; it never times or runs anything.
``make report`` does both. Exit status 0 when the page was written, even if checks failed (the
page shows them; ``python -m verify`` is the gate); 2 on bad arguments or an unreadable file.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path("reports") / "out"
DEFAULT_ASV_RESULTS = Path(".asv") / "results"
#: The peer suite's summary (``make bench-ops`` writes it; reports.sections.peers reads it).
DEFAULT_PEERS_JSON = Path("benchmarks") / "out" / "peers-summary.json"
#: Options of the old all-in-one report that now belong to the measuring step.
MEASURING_FLAGS = ("--quick", "--device", "--skip-verify", "--verify-full", "--verify-json", "--skip-memory",
                   "--skip-trees", "--rounds")


def _status(msg: str) -> None:
    print(f"[reports] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m reports", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Render a maskbench results JSON (and asv results) into DIR/index.html plus PNG figures.",
        epilog=("How the job is split: `python -m measure --out FILE` measures (sweeps, memory,\n"
                "FAVOR+, gallery, checks) and writes FILE; `python -m reports --from-json FILE` only renders\n"
                "it. `make report` runs both (measuring options go to it: make report ARGS=--quick).\n"
                "Measuring options (" + ", ".join(MEASURING_FLAGS) + ") belong to python -m measure."))
    ap.add_argument("--from-json", metavar="FILE",
                    help="results JSON to render (default DIR/results.json); renders without measuring")
    ap.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR",
                    help=f"output folder for index.html and the PNGs (default {DEFAULT_OUT})")
    ap.add_argument("--asv-results", default=str(DEFAULT_ASV_RESULTS), metavar="DIR",
                    help=f"asv results folder for the history section, re-read on every render "
                         f"(default {DEFAULT_ASV_RESULTS})")
    ap.add_argument("--peers-json", default=str(DEFAULT_PEERS_JSON), metavar="PATH",
                    help=f"peer-suite summary for the peers section (default {DEFAULT_PEERS_JSON}, relative to "
                         f"the working directory; written by `make bench-ops`); a missing file makes the section "
                         f"say so")
    ap.add_argument("--gpu-json", default=None, metavar="PATH",
                    help="the GPU run for the GPU section (default DIR/gpu.json; written by `make gpu-check`, "
                         "python -m measure.gpu); a missing file makes the section say so")
    ap.add_argument("--no-progress", action="store_true", help="print only the final line, not each figure")
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        flag = unknown[0].split("=", 1)[0]
        if flag in MEASURING_FLAGS:
            ap.error(f"{flag} is a measuring option and measuring moved out of the report: run "
                     f"`python -m measure {' '.join(unknown)} --out {Path(args.out) / 'results.json'}` "
                     f"and then `python -m reports`, or `make report ARGS=\"{' '.join(unknown)}\"` for both")
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.from_json is None:
        args.from_json = str(Path(args.out) / "results.json")
    if args.gpu_json is None:
        args.gpu_json = str(Path(args.out) / "gpu.json")
    return args


def _source_name(path: Path, out: Path) -> str:
    """How the page names its results file: relative to the page when it lies under DIR."""
    try:
        return os.path.relpath(path.resolve(), out.resolve()) if path.resolve().is_relative_to(out.resolve()) \
            else str(path)
    except (OSError, ValueError):
        return str(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    from reports.render import write_report
    from reports.sections.gpu import load_gpu
    from reports.sections.peers import load_peers
    from results.schema import Results

    path, out = Path(args.from_json), Path(args.out)
    if not path.is_file():
        print(f"python -m reports: error: no results file {path}: measure first with "
              f"`python -m measure --out {path}` (or `make report`, which measures and renders)",
              file=sys.stderr)
        return 2
    try:
        results = Results.read(path)
    except (ValueError, KeyError, TypeError) as exc:  # JSON syntax, schema version, missing fields
        print(f"python -m reports: error: cannot read {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    note = (lambda msg: None) if args.no_progress else _status
    peers = load_peers(args.peers_json)
    if peers.error:
        _status(f"peers summary {args.peers_json} not readable ({peers.error}); the page says so")
    gpu = load_gpu(args.gpu_json)
    if gpu.error:
        _status(f"GPU run {args.gpu_json} not readable ({gpu.error}); the page says so")
    index = write_report(results, out, args.asv_results, source=_source_name(path, out), note=note, peers=peers,
                         gpu=gpu)
    failed = [r for r in results.checks or [] if r.status == "fail"]
    if failed:
        _status(f"{len(failed)} check(s) failed: {', '.join(r.id for r in failed)} (reasons on the page)")
    _status(f"rendered {path} in {time.perf_counter() - start:.1f} s; open {index.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
