"""python -m verify: run maskbench's checks, print a table, optionally write JSON.

Each check prints one line as it finishes (verify.runner.progress_line), with the progress bar or
without it (--no-progress), and --json PATH is rewritten after every check, so a run that is
stopped at any point keeps the lines and the JSON of the checks that finished.

Exit status: 0 if every check passed or was skipped, 1 if any check failed, 3 if none failed but
some were inconclusive (e.g. "inconclusive: machine busy" from complexity/<id>: not a pass, so a
gate does not open on it; rerun on a quieter machine), 2 on bad arguments. Arguments are all
checked before any check runs: the seed (an int >= 0), the device (it must hold a tensor here;
"meta" is refused), --only values (non-empty, each matching some check; an unknown one is answered
with the ids that contain it or are close to it) and the --json path (its folder is created and the
file must be writable; nothing is left behind if the run then fails).

--shard I/K runs the I-th (counted from 1) of K disjoint parts of the selection, balanced on the
recorded durations of --durations PATH (default verify/durations.json; verify.shard says how);
``python -m verify.merge`` joins the K JSON files and checks that together they are the selection
(docs/cluster.md: a SLURM array job and a shell loop).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm.auto import tqdm

from results.check import CheckResult
from verify.runner import (check_device, format_table, progress_line, run_checks, seed_sweep, write_json,
                           write_sweep_json)
from verify.shard import DEFAULT_DURATIONS, load_durations, parse_shard


def _int_at_least(low: int, what: str):
    """An argparse type: an int >= low (the error names what was expected and what came)."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {low} ({what}), got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low} ({what}), got {value}")
        return value

    return parse


def _non_empty(what: str):
    """An argparse type: a non-empty string."""
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string")
        return text

    return parse


def _check_json_path(ap: argparse.ArgumentParser, raw: str) -> None:
    """Refuse (exit 2) a --json path that cannot be written, before the run: create its folder (as
    the writers do) and open the file for appending (which changes nothing in an existing file);
    a file that did not exist is removed again, so a run that fails leaves none behind."""
    path = Path(raw)
    if path.is_dir():
        ap.error(f"argument --json: expected a file path, got the directory {raw!r}")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        ap.error(f"argument --json: cannot write {raw!r} ({exc.strerror or exc})")
    if not existed:
        path.unlink()


def _reporter(json_path: str | None, progress: bool):
    """run_checks' on_result for the CLI: print each finished check's line (through tqdm while the
    bar is shown, so the bar stays below the lines) and rewrite the JSON with every check so far."""
    done: list[CheckResult] = []

    def report(res: CheckResult, i: int, total: int) -> None:
        done.append(res)
        line = progress_line(res, i, total)
        if progress:
            tqdm.write(line)
        else:
            print(line, flush=True)
        if json_path:
            write_json(done, json_path)

    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="deterministic CI subset (about 3.5 minutes of check time on 2 cores)")
    ap.add_argument("--only", action="append", metavar="ID", type=_non_empty("a check id prefix such as equivalence/"),
                    help="run checks whose id starts with ID, e.g. --only equivalence/causal; a mechanism id "
                         "(or any check's name after its family) runs every check about it (--only nodeformer: "
                         "equivalence/nodeformer, ..., scale/nodeformer-train); repeatable")
    ap.add_argument("--exclude", action="append", metavar="ID", type=_non_empty("a check id prefix such as scale/"),
                    help="leave out the checks whose id starts with ID (after --only), e.g. --exclude scale/; "
                         "repeatable")
    ap.add_argument("--device", default="cpu", help="torch device for fast/ (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--seed", type=_int_at_least(0, "seeds seed numpy and torch generators"), default=0,
                    help="base seed of every check, an int >= 0 (default 0)")
    ap.add_argument("--json", metavar="PATH", type=_non_empty("a file path"),
                    help="also write the results as JSON to PATH (its folder is created)")
    ap.add_argument("--list", action="store_true", help="list the selected check ids and exit")
    ap.add_argument("--seeds", type=_int_at_least(1, "the number of seeds"), metavar="K",
                    help="seed sweep: run the selection for seeds 0..K-1 and print each check's failure rate")
    ap.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ap.add_argument("--shard", metavar="I/K", help="run only the I-th (1 <= I <= K) of K disjoint parts of the "
                    "selection, balanced on recorded durations; join the parts with python -m verify.merge")
    ap.add_argument("--durations", metavar="PATH", type=_non_empty("a file path"),
                    help="recorded durations for --shard: {id: seconds} or a previous --json "
                         f"(default {DEFAULT_DURATIONS.parent.name}/{DEFAULT_DURATIONS.name}; unknown checks get the median)")
    args = ap.parse_args(argv)

    try:
        check_device(args.device)
    except ValueError as exc:
        ap.error(f"argument --device: {exc}")
    shard = durations = None
    if args.exclude and args.seeds is not None:
        ap.error("argument --exclude: not with --seeds (pass the checks to sweep with --only)")
    if args.shard is not None:
        if args.seeds is not None:
            ap.error("argument --shard: not with --seeds (a seed sweep is not split into shards)")
        try:
            shard = parse_shard(args.shard)
        except ValueError as exc:
            ap.error(f"argument --shard: {exc}")
        try:
            durations = load_durations(args.durations or DEFAULT_DURATIONS)
        except (OSError, ValueError) as exc:
            ap.error(f"argument --durations: cannot read recorded durations ({exc})")
    elif args.durations is not None:
        ap.error("argument --durations: only used with --shard I/K")
    if args.json is not None and not args.list:
        _check_json_path(ap, args.json)
    try:
        if args.list:
            from verify.checks import all_checks
            from verify.runner import select, select_shard

            chosen = select(all_checks(), args.only, args.quick, args.exclude)
            for c in (chosen if shard is None else select_shard(chosen, shard, durations)):
                print(c.id)
            return 0
        if args.seeds is not None:
            counts = seed_sweep(args.seeds, quick=args.quick, only=args.only, device=args.device,
                                progress=not args.no_progress)
            width = max(len(k) for k in counts)
            for cid, c in counts.items():
                print(f"{cid.ljust(width)}  {c['failures']}/{c['runs']} failed  seeds {c['failed_seeds']}")
            if args.json:
                write_sweep_json(counts, args.json)
            return 1 if any(c["failures"] for c in counts.values()) else 0
        results = run_checks(quick=args.quick, only=args.only, device=args.device, seed=args.seed,
                             progress=not args.no_progress, on_result=_reporter(args.json, not args.no_progress),
                             shard=shard, durations=durations, exclude=args.exclude)
    except ValueError as exc:
        ap.error(str(exc))
    print()
    print(format_table(results))  # ends with the reasons of every failing check
    for r in results:  # a check that raised: its traceback, for whoever fixes it
        if r.status == "fail" and "error" in r.details:
            print(f"\n{r.id} raised:\n{r.details.get('traceback') or r.details['error']}", file=sys.stderr)
    if args.json:
        write_json(results, args.json)
    if any(r.status == "fail" for r in results):
        return 1
    return 3 if any(r.status == "inconclusive" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
