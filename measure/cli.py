"""The command line of ``python -m measure`` (stages and output: see measure)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from measure.pipeline import DEFAULT_OUT, Options, collect, select_mechanisms, status, summary_lines


def parse_args(argv: list[str] | None = None) -> tuple[Options, Path]:
    ap = argparse.ArgumentParser(prog="python -m measure",
                                 description="Measure sweeps, memory, the FAVOR+ error, the mask gallery and the "
                                             "checks into one results JSON (python -m reports renders it).")
    ap.add_argument("--quick", action="store_true", help="quick grids, fewer rounds and draws, quick checks")
    ap.add_argument("--out", default=str(DEFAULT_OUT), metavar="FILE",
                    help=f"results JSON to write (default {DEFAULT_OUT}, relative to the current directory)")
    ap.add_argument("--device", default="cpu", help="torch device for fast/ and the dense twins (cpu, cuda, ...)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved timing rounds per sweep (default 3 quick, 5 full: the complexity checks' "
                         "counts, so they reuse the sweeps)")
    ap.add_argument("--only", action="extend", nargs="+", default=[], metavar="MECH_ID",
                    help="measure only these mechanisms (repeatable; the checks about them only)")
    ap.add_argument("--skip-variants", action="store_true", help="time only each mechanism's default variant")
    ap.add_argument("--skip-memory", action="store_true", help="do not measure peak memory vs N")
    ap.add_argument("--skip-verify", action="store_true", help="do not run python -m verify's checks")
    ap.add_argument("--verify-full", action="store_true", help="run the full checks instead of --quick")
    ap.add_argument("--verify-json", metavar="PATH",
                    help="take the checks from a python -m verify --json PATH file instead of running them")
    ap.add_argument("--skip-training", action="store_true",
                    help="do not run the training demo (NodeFormer, SGFormer, DIFFormer, MLP; measure.training); "
                         "--only skips it too")
    ap.add_argument("--skip-peers", action="store_true",
                    help="do not run the quick peer suite (benchmarks/, torch SDPA and any installed peer library; "
                         "measure.suites); --only skips it too")
    ap.add_argument("--skip-history", action="store_true",
                    help="do not run asv's exponent benchmarks for this commit into .asv/results (measure.suites); "
                         "--only skips it too")
    ap.add_argument("--skip-distributed", action="store_true",
                    help="do not measure sharded attention on 1, 2, 4 gloo ranks (measure.distributed); "
                         "--only skips it too")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars (status lines remain)")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            ap.error(f"--device {args.device}: CUDA is not available on this machine")
    if args.verify_json and not Path(args.verify_json).is_file():
        ap.error(f"--verify-json {args.verify_json}: no such file")
    if args.only:
        try:
            select_mechanisms(args.only)
        except KeyError as exc:
            ap.error(f"--only: {exc.args[0]}")
    opts = Options(quick=args.quick, device=args.device, rounds=args.rounds, only=list(dict.fromkeys(args.only)),
                   skip_variants=args.skip_variants, skip_memory=args.skip_memory, skip_verify=args.skip_verify,
                   verify_full=args.verify_full, verify_json=args.verify_json, progress=not args.no_progress,
                   skip_training=args.skip_training, skip_peers=args.skip_peers,
                   skip_history=args.skip_history, skip_distributed=args.skip_distributed, argv=list(sys.argv[1:] if argv is None else argv))
    return opts, Path(args.out)


def main(argv: list[str] | None = None) -> int:
    opts, out = parse_args(argv)
    start = time.perf_counter()
    res = collect(opts)
    path = res.write(out)
    for line in summary_lines(res):
        status(line)
    status(f"total {time.perf_counter() - start:.1f} s; wrote {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
