"""python -m verify --shard I/K and python -m verify.merge (issue 26 item 4): the shards partition
the selection, their durations are balanced, the split is deterministic, and merge finds a
missing, duplicated, unexpected or failed check; two real shards merged equal one run's ids."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import verify.__main__ as cli
from verify import merge
from verify.checks import all_checks
from verify.runner import select
from verify.shard import DEFAULT_DURATIONS, load_durations, parse_shard, partition, shard_ids

#: cheap quick checks (milliseconds each) for the end-to-end runs
CHEAP = ["--quick", "--only", "features/", "--no-progress"]


def _ids(n: int) -> list[str]:
    return [f"fam/c{i}" for i in range(n)]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 40])
def test_partition_is_a_partition_in_selection_order(count):
    rng = random.Random(count)
    ids = _ids(25)
    durations = {cid: rng.expovariate(1.0) for cid in ids[:20]}  # five unknown
    parts = partition(ids, count, durations)
    assert len(parts) == count
    flat = [cid for part in parts for cid in part]
    assert sorted(flat) == sorted(ids) and len(flat) == len(ids)
    for part in parts:
        assert part == [cid for cid in ids if cid in part]
    assert partition(ids, count, durations) == parts  # deterministic
    assert [shard_ids(ids, i, count, durations) for i in range(1, count + 1)] == parts


def test_partition_balances_recorded_durations():
    """Greedy LPT keeps the longest shard within Graham's 4/3 - 1/(3K) of the optimum, so within
    that factor of the lower bound max(total / K, the longest check); the split in selection order
    (the first ids in shard 1, ...) does much worse on these durations."""
    rng = random.Random(0)
    ids = _ids(60)
    durations = {cid: rng.lognormvariate(0.0, 1.5) for cid in ids}
    for k in (2, 3, 4, 8):
        loads = [sum(durations[c] for c in part) for part in partition(ids, k, durations)]
        bound = max(sum(durations.values()) / k, max(durations.values()))
        assert max(loads) <= (4 / 3 - 1 / (3 * k)) * bound + 1e-9


def test_unknown_checks_get_the_median():
    durations = {"fam/a": 1.0, "fam/b": 2.0, "fam/c": 9.0}
    # fam/x unknown: the median 2.0 puts it with fam/a (1.0) not with fam/c (9.0)
    parts = partition(["fam/a", "fam/b", "fam/c", "fam/x"], 2, durations)
    assert parts == [["fam/c"], ["fam/a", "fam/b", "fam/x"]]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "2", "a/b", "-1/2", "1/2/3", ""])
def test_parse_shard_refuses(text):
    with pytest.raises(ValueError, match="I/K"):
        parse_shard(text)


def test_partition_refuses_bad_arguments():
    with pytest.raises(ValueError, match="count"):
        partition(["a/1"], 0)
    with pytest.raises(ValueError, match="distinct"):
        partition(["a/1", "a/1"], 2)
    with pytest.raises(ValueError, match="index"):
        shard_ids(["a/1"], 0, 2)


def test_load_durations(tmp_path):
    as_map = tmp_path / "d.json"
    as_map.write_text(json.dumps({"a/1": 1.5}))
    assert load_durations(as_map) == {"a/1": 1.5}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a/1": -1}))
    with pytest.raises(ValueError, match="a/1"):
        load_durations(bad)
    bad.write_text(json.dumps("x"))
    with pytest.raises(ValueError, match="bad.json"):
        load_durations(bad)


def test_committed_durations_cover_the_quick_selection():
    """verify/durations.json is readable and names most quick checks (a stale file still works:
    unknown checks get the median)."""
    durations = load_durations(DEFAULT_DURATIONS)
    quick = [c.id for c in select(all_checks(), None, True)]
    assert sum(cid in durations for cid in quick) >= 0.8 * len(quick)


@pytest.mark.parametrize("argv, text", [(["--shard", "0/3"], "--shard"), (["--shard", "x"], "--shard"),
                                         (["--durations", "d.json"], "only used with --shard"),
                                         (["--shard", "1/2", "--seeds", "2"], "--seeds"),
                                         (["--shard", "1/2", "--durations", "/nonexistent/d.json"], "--durations")])
def test_cli_refuses(argv, text, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert text in capsys.readouterr().err


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two real shards of the cheap selection and one unsharded run, as --json files."""
    out = tmp_path_factory.mktemp("shards")
    for i in (1, 2):
        assert cli.main(CHEAP + ["--shard", f"{i}/2", "--json", str(out / f"{i}.json")]) == 0
    assert cli.main(CHEAP + ["--json", str(out / "one.json")]) == 0
    return out


def _read(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def test_two_shards_merged_equal_one_run(shards):
    a, b = _read(shards / "1.json"), _read(shards / "2.json")
    assert a and b and not {r["id"] for r in a} & {r["id"] for r in b}
    assert merge.main([str(shards / "1.json"), str(shards / "2.json"), "--json", str(shards / "all.json"),
                       "--quick", "--only", "features/", "--durations-out", str(shards / "d.json")]) == 0
    merged = _read(shards / "all.json")
    assert [r["id"] for r in merged] == [r["id"] for r in _read(shards / "one.json")]
    assert [r["status"] for r in merged] == [r["status"] for r in _read(shards / "one.json")]
    assert set(load_durations(shards / "d.json")) == {r["id"] for r in merged}


def test_merge_finds_missing_duplicated_unexpected_and_failed(shards, tmp_path, capsys):
    one, two = str(shards / "1.json"), str(shards / "2.json")
    flags = ["--quick", "--only", "features/", "--json", str(tmp_path / "all.json")]
    missing = _read(shards / "2.json")[0]["id"]
    assert merge.main([one, *flags]) == 1
    assert missing in capsys.readouterr().err
    copy = tmp_path / "copy.json"
    copy.write_text((shards / "2.json").read_text())
    assert merge.main([one, two, str(copy), *flags]) == 1
    assert f"{missing} came in 2 inputs" in capsys.readouterr().err
    # shards that ran without --only, merged as if they had: the extra ids are named
    assert merge.main([one, two, "--quick", "--only", "features/trig", "--json", str(tmp_path / "all.json")]) == 1
    assert "not in the selection" in capsys.readouterr().err
    failed = _read(shards / "2.json")
    failed[0]["status"] = "fail"
    failed[0]["details"] = {"reasons": ["planted"]}
    bad = tmp_path / "failed.json"
    bad.write_text(json.dumps(failed))
    assert merge.main([one, str(bad), *flags]) == 1
    assert "planted" in capsys.readouterr().out
    assert [r["id"] for r in _read(tmp_path / "all.json")] == [r["id"] for r in _read(shards / "one.json")]


def test_merge_refuses_unreadable_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        merge.main([str(tmp_path / "absent.json"), "--json", str(tmp_path / "all.json")])
    assert exc.value.code == 2 and "absent.json" in capsys.readouterr().err
