"""python -m reports: sweeps + peak memory + verification + figures -> DIR/index.html.

Stages (each reports progress on stderr): timing sweeps of every registered mechanism (threads
pinned to 1), the tree operators on each tree family (threads pinned to 1, reports.trees), peak
memory in subprocesses, the FAVOR+ error experiment, the mask gallery, ``verify`` (quick by
default), asv history, then figures, index.html and results.json. Exit status 0 when the page was
written, even if checks failed (the page shows them; ``python -m verify`` is the gate); 2 on bad
arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path("reports") / "out"
DEFAULT_ASV_RESULTS = Path(".asv") / "results"


def _status(msg: str) -> None:
    print(f"[reports] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stage(name: str, seconds: dict[str, float]):
    """Time one stage, print its start and end on stderr, record its wall time."""
    _status(f"{name} ...")
    start = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - start
    _status(f"{name} done in {seconds[name]:.1f} s")


def _load_verify_json(path: str):
    from reports.data import ReportData

    # python -m verify --json writes the same list ReportData keeps under "verify".
    return ReportData.from_dict({"environment": {}, "mechanisms": [],
                                 "verify": json.loads(Path(path).read_text())}).verify


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="quick grids, fewer rounds and draws (under 3 minutes on 2 cores)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR",
                    help=f"output folder (default {DEFAULT_OUT}/, relative to the current directory)")
    ap.add_argument("--device", default="cpu", help="torch device for fast/ and the dense twins (cpu, cuda, ...)")
    ap.add_argument("--skip-verify", action="store_true", help="do not run python -m verify's checks")
    ap.add_argument("--verify-full", action="store_true",
                    help="run the full verify suite instead of --quick (can take much longer)")
    ap.add_argument("--verify-json", metavar="PATH",
                    help="show results from python -m verify --json PATH instead of running the checks")
    ap.add_argument("--skip-memory", action="store_true", help="do not measure peak memory")
    ap.add_argument("--skip-trees", action="store_true",
                    help="do not time the tree masks per tree family (about 20 s quick, 2 minutes full)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved timing rounds per sweep (default 3 quick, 5 full)")
    ap.add_argument("--asv-results", default=str(DEFAULT_ASV_RESULTS), metavar="DIR",
                    help=f"asv results folder to chart (default {DEFAULT_ASV_RESULTS})")
    ap.add_argument("--from-json", metavar="PATH",
                    help="re-render figures and page from a results.json of an earlier run (runs nothing)")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars (status lines remain)")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            ap.error(f"--device {args.device}: CUDA is not available on this machine")
    for flag in ("verify_json", "from_json"):
        path = getattr(args, flag)
        if path and not Path(path).is_file():
            ap.error(f"--{flag.replace('_', '-')} {path}: no such file")
    return args


def collect(args: argparse.Namespace):
    """Run every stage and return the ReportData (no files written yet)."""
    from reports.asv_history import load_history
    from reports.data import MechanismInfo, ReportData, environment
    from reports.favor import favor_error
    from reports.gallery import mask_gallery
    from reports.memory import run_memory
    from reports.sweeps import run_sweeps
    from reports.trees import tree_masks
    from verify.registry import mechanisms

    progress = not args.no_progress
    rounds = args.rounds or (3 if args.quick else 5)
    mechs = mechanisms()
    data = ReportData(environment(args.quick, args.device, rounds), [MechanismInfo.from_mechanism(m) for m in mechs])
    secs = data.stage_seconds
    ids = ", ".join(m.id for m in mechs)
    _status(f"{'quick' if args.quick else 'full'} report of {len(mechs)} mechanisms: {ids}")

    # Timing first, in a process that has done nothing else yet.
    with _stage("timing sweeps (threads pinned to 1)", secs):
        data.timings = run_sweeps(mechs, args.quick, args.device, rounds, progress)
    if not args.skip_trees:
        with _stage("tree masks per family (threads pinned to 1)", secs):
            data.trees = tree_masks(args.quick, rounds, device=args.device, progress=progress)
            for c in data.trees.errors:
                _status(f"  tree masks: {c.operator} on {c.family} failed: {c.error}")
    if not args.skip_memory:
        with _stage("peak memory (subprocesses)", secs):
            data.memory = run_memory(mechs, args.quick, args.device, progress=progress)
    with _stage("FAVOR+ error vs m", secs):
        data.favor = favor_error(draws=1000 if args.quick else 4000, progress=progress)
    with _stage("mask gallery", secs):
        data.gallery = mask_gallery(mechs)
        for p in data.gallery.errors:
            _status(f"  mask gallery: {p.id} failed: {p.error}")
    if args.verify_json:
        data.verify = _load_verify_json(args.verify_json)
        data.verify_note = f"Results loaded from {args.verify_json}."
    elif not args.skip_verify:
        from verify.runner import run_checks

        quick_verify = not args.verify_full
        with _stage(f"verify ({'--quick' if quick_verify else 'full'})", secs):
            try:
                data.verify = run_checks(quick=quick_verify, device=args.device, progress=progress)
                data.verify_note = f"python -m verify{' --quick' if quick_verify else ''}, run by the report."
            except Exception as exc:  # noqa: BLE001 - the page should still show everything else
                data.verify_note = f"verify could not run: {type(exc).__name__}: {exc}"
                _status(data.verify_note)
    data.asv = load_history(args.asv_results)
    return data


def _print_summary(data) -> None:
    for m in data.mechanisms:
        t = data.timings.get(m.id)
        if t is None:
            continue
        fast = f"{t.fast.fit.slope:.2f}" if t.fast.fit else "-"
        dense = f"{t.dense.fit.slope:.2f}" if t.dense and t.dense.fit else "-"
        cross = "-" if t.crossover is None or not math.isfinite(t.crossover) else f"{t.crossover:,.0f}"
        _status(f"  {m.id:<20} fast slope {fast:>5}  dense slope {dense:>5}  crossover {cross}")
    if data.trees is not None:
        for c in data.trees.curves:
            slope = f"{c.fit.slope:.2f}" if c.fit else "-"
            _status(f"  {c.operator:<10} on {c.family:<17} slope {slope:>5}" + (f"  FAILED: {c.error}" if c.error else ""))
    if data.verify is not None:
        fails = [r.id for r in data.verify if r.status == "fail"]
        _status(f"verify: {len(data.verify) - len(fails)} of {len(data.verify)} not failed"
                + (f"; FAILED: {', '.join(fails)}" if fails else ""))


def _gallery_for_rerender(data) -> None:
    """--from-json: results.json keeps only mask summaries, so re-draw the matrices from the registry
    (cheap, deterministic); a JSON written before the gallery existed gets one built now, so noted."""
    from reports.gallery import mask_gallery, restore_matrices

    if data.gallery is None:
        data.gallery = mask_gallery()
        data.gallery.note = "results.json had no mask gallery; built from this checkout when re-rendering."
    else:
        restore_matrices(data.gallery)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    from reports.render import write_report

    if args.from_json:
        from reports.data import ReportData

        # Numbers, environment and stage times all describe the run that wrote the JSON.
        data = ReportData.from_dict(json.loads(Path(args.from_json).read_text()))
        _gallery_for_rerender(data)
    else:
        data = collect(args)

    with _stage("figures and page", data.stage_seconds):
        index = write_report(data, args.out)
    _print_summary(data)
    _status(f"total {time.perf_counter() - start:.1f} s; open {index.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
