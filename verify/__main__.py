"""python -m verify: run maskbench's checks, print a table, optionally write JSON.

Exit status: 0 if nothing failed, 1 if any check failed, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verify.runner import format_table, run_checks, seed_sweep, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="deterministic CI subset (under 3 minutes on 2 cores)")
    ap.add_argument("--only", action="append", metavar="ID",
                    help="run checks whose id starts with ID (repeatable), e.g. --only equivalence/causal")
    ap.add_argument("--device", default="cpu", help="torch device for fast/ (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--seed", type=int, default=0, help="base seed of every check (default 0)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--list", action="store_true", help="list the selected check ids and exit")
    ap.add_argument("--seeds", type=int, metavar="K",
                    help="seed sweep: run the selection for seeds 0..K-1 and print each check's failure rate")
    ap.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = ap.parse_args(argv)

    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            ap.error(f"--device {args.device}: CUDA is not available on this machine")
    try:
        if args.list:
            from verify.checks import all_checks
            from verify.runner import select

            for c in select(all_checks(), args.only, args.quick):
                print(c.id)
            return 0
        if args.seeds is not None:
            counts = seed_sweep(args.seeds, quick=args.quick, only=args.only, device=args.device,
                                progress=not args.no_progress)
            width = max(len(k) for k in counts)
            for cid, c in counts.items():
                print(f"{cid.ljust(width)}  {c['failures']}/{c['runs']} failed  seeds {c['failed_seeds']}")
            if args.json:
                Path(args.json).write_text(json.dumps(counts, indent=2))
            return 1 if any(c["failures"] for c in counts.values()) else 0
        results = run_checks(quick=args.quick, only=args.only, device=args.device, seed=args.seed,
                             progress=not args.no_progress)
    except ValueError as exc:
        ap.error(str(exc))
    print(format_table(results))  # ends with the reasons of every failing check
    for r in results:  # a check that raised: its traceback, for whoever fixes it
        if r.status == "fail" and "error" in r.details:
            print(f"\n{r.id} raised:\n{r.details.get('traceback') or r.details['error']}", file=sys.stderr)
    if args.json:
        write_json(results, args.json)
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
