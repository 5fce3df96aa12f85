"""Split a selection of checks into K disjoint shards of about equal duration (``--shard I/K``).

A shard is named ``I/K`` with I counted from 1 (SLURM's ``--array=1-K`` hands out exactly these
numbers). The selection (after ``--only`` and ``--quick``) is cut by greedy longest-processing-time
scheduling on recorded durations: checks in decreasing duration (ties in selection order) each go
to the shard with the least total so far (ties to the lowest shard). Graham's bound: the longest
shard is at most 4/3 - 1/(3K) of the optimum. Durations come from a file (``--durations PATH``;
by default the committed ``verify/durations.json``): an object ``{id: seconds}``, or a previous
``python -m verify --json`` list, whose ``seconds`` are read. A check the file does not name gets
the median of the file's durations (1 s if it names none). The split depends only on the selected
ids, their order and the durations, so K machines given the same arguments agree on it, and the
K shards together hold every selected check exactly once.
"""
from __future__ import annotations

import heapq
import json
import math
import re
import statistics
from pathlib import Path

#: the durations ``--shard`` balances on unless ``--durations`` names another file: one quick
#: run's seconds per check (``python -m verify.merge ... --durations-out`` rewrites it)
DEFAULT_DURATIONS = Path(__file__).with_name("durations.json")

#: the duration given to every check when the durations file names none
_FALLBACK_SECONDS = 1.0


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/K"`` -> (I, K): the I-th of K shards, 1 <= I <= K (1-based, as SLURM array ids).

    Raises ValueError naming what was expected for anything else.

        >>> from verify.shard import parse_shard
        >>> parse_shard("2/4")
        (2, 4)
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"--shard expects I/K with integers 1 <= I <= K (the I-th of K shards, counted from 1), "
                         f"got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard expects I/K with 1 <= I <= K (the I-th of K shards, counted from 1), got {text!r}")
    return index, count


def load_durations(path: str | Path) -> dict[str, float]:
    """Recorded seconds per check id from ``path``: a JSON object ``{id: seconds}`` or a list of
    check results (``python -m verify --json``; each entry's ``id`` and ``seconds``).

    Raises ValueError naming the file if it is neither, or if a duration is not a finite number
    >= 0; FileNotFoundError if it does not exist.

        >>> import json, tempfile, pathlib
        >>> from verify.shard import load_durations
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "run.json"
        >>> _ = p.write_text(json.dumps([{"id": "a/x", "seconds": 2.5}]))
        >>> load_durations(p)
        {'a/x': 2.5}
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, list) and all(isinstance(r, dict) and "id" in r for r in data):
        data = {r["id"]: r.get("seconds") for r in data}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object {{id: seconds}} or a python -m verify --json list, "
                         f"got {type(data).__name__}")
    out: dict[str, float] = {}
    for cid, sec in data.items():
        if isinstance(sec, bool) or not isinstance(sec, (int, float)) or not math.isfinite(sec) or sec < 0:
            raise ValueError(f"{path}: the duration of {cid!r} must be a finite number of seconds >= 0, got {sec!r}")
        out[str(cid)] = float(sec)
    return out


def partition(ids: list[str], count: int, durations: dict[str, float] | None = None) -> list[list[str]]:
    """Cut ``ids`` into ``count`` disjoint lists of about equal total duration (greedy
    longest-processing-time; see the module docstring). Each list keeps the order of ``ids``;
    a list is empty where there are fewer ids than shards. O(n log n + n log count).

    Raises ValueError if count is not an int >= 1 or ids repeat an id.

        >>> from verify.shard import partition
        >>> partition(["a/1", "a/2", "a/3", "a/4"], 2, {"a/1": 5.0, "a/2": 3.0, "a/3": 2.0, "a/4": 1.0})
        [['a/1', 'a/4'], ['a/2', 'a/3']]
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count (the number of shards) must be an int >= 1, got {count!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"ids must be distinct, got {len(ids) - len(set(ids))} repeated")
    durations = durations or {}
    fill = statistics.median(durations.values()) if durations else _FALLBACK_SECONDS
    cost = {cid: durations.get(cid, fill) for cid in ids}
    position = {cid: i for i, cid in enumerate(ids)}
    loads = [(0.0, shard) for shard in range(count)]  # a heap of (total seconds, shard)
    owner: dict[str, int] = {}
    for cid in sorted(ids, key=lambda c: (-cost[c], position[c])):
        total, shard = heapq.heappop(loads)
        owner[cid] = shard
        heapq.heappush(loads, (total + cost[cid], shard))
    return [[cid for cid in ids if owner[cid] == shard] for shard in range(count)]


def shard_ids(ids: list[str], index: int, count: int, durations: dict[str, float] | None = None) -> list[str]:
    """The ids of shard ``index`` (1-based) of ``count``: ``partition(ids, count, durations)[index - 1]``.

    Raises ValueError unless 1 <= index <= count.

        >>> from verify.shard import shard_ids
        >>> shard_ids(["a/1", "a/2", "a/3"], 1, 2, {"a/1": 1.0, "a/2": 1.0, "a/3": 1.0})
        ['a/1', 'a/3']
    """
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= count:
        raise ValueError(f"index must be an int with 1 <= index <= count = {count} (shards count from 1), got {index!r}")
    return partition(ids, count, durations)[index - 1]
