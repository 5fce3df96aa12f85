"""python -m verify.merge A.json B.json ... --json ALL.json: join the shards of one verify run.

Each input is what ``python -m verify --shard I/K --json PATH`` wrote (a list of check results,
the schema of ``--json``). Pass the same selection flags the shards ran with (``--quick``,
``--only``, ``--exclude``): merge selects the checks again and expects exactly those ids, each once. The merged
list follows the selection's order, so its ids equal a single run's; it is written to ``--json``
(even when something is wrong, so nothing that ran is lost) and printed as verify's table.

Exit status: 1 if a check failed, an expected id is missing, an id came in more than one input
(the first one is kept, and the files are named), or an input holds an id the selection does not;
otherwise 3 if a check was inconclusive, else 0; 2 on bad arguments or an unreadable input.
``--durations-out PATH`` also writes the merged {id: seconds}, the durations file --shard reads.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from results.check import CheckResult


@dataclass
class Merged:
    """merge_results' answer: the merged results in selection order, and what was wrong."""

    results: list[dict]
    missing: list[str] = field(default_factory=list)
    #: id -> the inputs (their labels) it came in, for ids that came in more than one
    duplicated: dict[str, list[str]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """The problems in words ([] when the inputs are exactly the selection)."""
        out = []
        if self.missing:
            out.append(f"{len(self.missing)} selected check(s) in no input: {', '.join(self.missing)}")
        for cid, where in self.duplicated.items():
            out.append(f"{cid} came in {len(where)} inputs: {', '.join(where)} (the first is kept)")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} check(s) not in the selection (other --quick/--only than the "
                       f"shards'?): {', '.join(self.unexpected)}")
        return out


def merge_results(parts: dict[str, list[dict]], expected: list[str]) -> Merged:
    """Join check-result lists (label -> list of result dicts) into one, ordered as ``expected``
    (the selection's ids), and record the missing, duplicated and unexpected ids. O(total).

    Raises ValueError naming the input whose entry is not a result dict with an ``id``.

        >>> from verify.merge import merge_results
        >>> m = merge_results({"a": [{"id": "f/2"}], "b": [{"id": "f/1"}, {"id": "f/2"}]}, ["f/1", "f/2", "f/3"])
        >>> [r["id"] for r in m.results], m.missing, m.duplicated
        (['f/1', 'f/2'], ['f/3'], {'f/2': ['a', 'b']})
    """
    first: dict[str, dict] = {}
    seen: dict[str, list[str]] = {}
    for label, results in parts.items():
        if not isinstance(results, list):
            raise ValueError(f"{label}: expected a JSON list of check results (python -m verify --json), "
                             f"got {type(results).__name__}")
        for r in results:
            if not isinstance(r, dict) or not isinstance(r.get("id"), str):
                raise ValueError(f"{label}: expected check results with an 'id', got {str(r)[:80]!r}")
            seen.setdefault(r["id"], []).append(label)
            first.setdefault(r["id"], r)
    order = {cid: i for i, cid in enumerate(expected)}
    unexpected = [cid for cid in first if cid not in order]
    merged = sorted((r for cid, r in first.items() if cid in order), key=lambda r: order[r["id"]])
    return Merged(results=merged + [first[cid] for cid in unexpected],
                  missing=[cid for cid in expected if cid not in first],
                  duplicated={cid: where for cid, where in seen.items() if len(where) > 1},
                  unexpected=unexpected)


def _result(d: dict) -> CheckResult:
    """A CheckResult from its JSON dict (to_dict writes a non-finite statistic as a string)."""
    def num(x):
        return float(x) if isinstance(x, str) else x

    return CheckResult(**{**d, "statistic": num(d.get("statistic")), "threshold": num(d.get("threshold"))})


def main(argv: list[str] | None = None) -> int:
    from verify.checks import all_checks
    from verify.runner import format_table, select, write_json, write_text

    ap = argparse.ArgumentParser(prog="python -m verify.merge", description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", metavar="SHARD.json", help="the shards' --json files")
    ap.add_argument("--json", metavar="PATH", required=True, help="write the merged results here")
    ap.add_argument("--quick", action="store_true", help="the shards ran with --quick")
    ap.add_argument("--only", action="append", metavar="ID", help="the shards' --only values (repeatable)")
    ap.add_argument("--exclude", action="append", metavar="ID", help="the shards' --exclude values (repeatable)")
    ap.add_argument("--durations-out", metavar="PATH", help="also write {id: seconds} (a --durations file)")
    args = ap.parse_args(argv)
    parts: dict[str, list[dict]] = {}
    for raw in args.inputs:
        if raw in parts:
            ap.error(f"the input {raw!r} is named twice")
        try:
            parts[raw] = json.loads(Path(raw).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            ap.error(f"cannot read the shard {raw!r} ({exc})")
    try:
        expected = [c.id for c in select(all_checks(), args.only, args.quick, args.exclude)]
        merged = merge_results(parts, expected)
        results = [_result(r) for r in merged.results]
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    write_json(results, args.json)
    if args.durations_out:
        write_text(args.durations_out, json.dumps({r.id: round(r.seconds, 3) for r in results}, indent=1,
                                                  sort_keys=True) + "\n")
    print(format_table(results))
    problems = merged.problems
    for p in problems:
        print(f"merge: {p}", file=sys.stderr)
    if problems or any(r.status == "fail" for r in results):
        return 1
    return 3 if any(r.status == "inconclusive" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
