"""verify/runner.py and the ``python -m verify`` CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import verify.__main__ as cli
from results.check import Check, CheckResult, Outcome
from verify import runner

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"id", "title", "source", "kind", "status", "statistic", "threshold", "seconds", "details", "compare", "unit"}


def _check(cid, status="pass", quick=True, raises=False):
    def run(ctx):
        if raises:
            raise RuntimeError("boom")
        return Outcome(status, 1.0)

    return Check(cid, "title " + cid, "src", "bound", run=run, quick=quick, threshold=2.0, compare="<=")


CHECKS = [_check("equivalence/causal"), _check("equivalence/causal-2"), _check("equivalence/linear"),
          _check("performer/prf-variance", quick=False), _check("scale/causal")]


def test_select_quick_and_prefixes():
    assert [c.id for c in runner.select(CHECKS)] == [c.id for c in CHECKS]
    assert "performer/prf-variance" not in [c.id for c in runner.select(CHECKS, quick=True)]
    assert [c.id for c in runner.select(CHECKS, ["equivalence/causal"])] == ["equivalence/causal", "equivalence/causal-2"]
    assert [c.id for c in runner.select(CHECKS, ["scale", "equivalence/lin"])] == ["equivalence/linear", "scale/causal"]
    assert [c.id for c in runner.select(CHECKS, ["performer"])] == ["performer/prf-variance"]


def test_select_nothing_matches_is_an_error():
    with pytest.raises(ValueError, match=r"--only nonexistent matches no check"):
        runner.select(CHECKS, ["nonexistent"])
    with pytest.raises(ValueError, match="matches no check of --quick"):  # a full-only check in quick mode
        runner.select(CHECKS, ["performer"], quick=True)
    with pytest.raises(ValueError, match="matches no check"):  # prefixes and names, not substrings
        runner.select(CHECKS, ["ausal"])


def test_run_checks_reports_an_exception_as_a_failure(monkeypatch):
    checks = [_check("a/ok"), _check("a/boom", raises=True), _check("a/skip", status="skip")]
    monkeypatch.setattr(runner, "all_checks", lambda: checks)
    results = runner.run_checks(quick=True, progress=False)
    assert [r.id for r in results] == ["a/ok", "a/boom", "a/skip"]
    assert [r.status for r in results] == ["pass", "fail", "skip"]
    assert results[1].details["error"] == "RuntimeError: boom" and "Traceback" in results[1].details["traceback"]
    assert (results[1].title, results[1].threshold, results[1].compare) == ("title a/boom", 2.0, "<=")
    assert (results[0].title, results[0].statistic, results[0].threshold) == ("title a/ok", 1.0, 2.0)
    assert all(r.seconds >= 0 for r in results)
    assert [r.id for r in runner.run_checks(only=["a/ok"], progress=False)] == ["a/ok"]


def _seeded_checks():
    def flaky(ctx):  # fails for seeds divisible by 3
        return Outcome("fail" if ctx.seed % 3 == 0 else "pass")

    return [Check("s/flaky", "t", "s", "bound", run=flaky), _check("s/solid")]


def test_seed_sweep_counts_failures_per_check(monkeypatch):
    monkeypatch.setattr(runner, "all_checks", _seeded_checks)
    counts = runner.seed_sweep(7, progress=False)
    assert counts["s/flaky"] == {"runs": 7, "failures": 3, "failed_seeds": [0, 3, 6], "rate": 3 / 7}
    assert counts["s/solid"]["failures"] == 0 and counts["s/solid"]["rate"] == 0.0
    assert list(runner.seed_sweep(2, only=["s/solid"], progress=False)) == ["s/solid"]
    with pytest.raises(ValueError, match="seeds must be an int >= 1, got 0"):
        runner.seed_sweep(0, progress=False)


def test_cli_seed_sweep(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(runner, "all_checks", _seeded_checks)
    out = tmp_path / "seeds.json"
    assert cli.main(["--seeds", "4", "--no-progress", "--json", str(out)]) == 1  # s/flaky failed twice
    printed = capsys.readouterr().out
    assert "2/4 failed" in printed and "0/4 failed" in printed
    assert json.loads(out.read_text())["s/flaky"]["failed_seeds"] == [0, 3]
    assert cli.main(["--seeds", "2", "--only", "s/solid", "--no-progress"]) == 0


def test_format_table_counts_and_flags_failures():
    results = [CheckResult("a/one", "t", "src-1", "bound", "pass", 0.5, 1.0, compare="<="),
               CheckResult("a/two", "t", "src-2", "bound", "fail", float("inf"), None),
               CheckResult("a/three", "t", "src-3", "bound", "skip", None, None),
               CheckResult("a/four", "t", "src-4", "bound", "pass", 0.123456, 0.5, compare="<", unit="relative")]
    table = runner.format_table(results)
    lines = table.splitlines()
    tally = lines.index("2 passed, 1 failed, 1 skipped")
    assert lines[0].split() == ["id", "source", "status", "statistic", "pass", "if", "threshold", "unit", "seconds"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "FAIL" in lines[3] and "pass" in lines[2] and "skip" in lines[4]
    assert "0.123" in lines[5] and "0.123456" not in lines[5]
    assert lines[2].split()[3:6] == ["0.5", "<=", "1"] and lines[5].split()[3:7] == ["0.123", "<", "0.5", "relative"]
    # fixed width: every cell of every row starts where its column's dashes start
    starts = [i for i, ch in enumerate(lines[1]) if ch == "-" and (i == 0 or lines[1][i - 1] == " ")]
    assert len(starts) == 8
    for line in lines[2:6]:
        assert all(line[i] != " " and (i == 0 or line[i - 1] == " ") for i in starts), line
    # after the tally: the failing check and why (no reasons given: says so)
    assert lines[tally + 1:] == ["", "Why they failed:", "a/two:", "  - failed (the check gave no reason)"]


def _row(table: str, cid: str) -> list[str]:
    return next(line for line in table.splitlines() if line.startswith(cid + " ")).split("  ")


def test_format_table_directions_and_units():
    results = [CheckResult("scale/x", "t", "s", "scale", "pass", 412 * 2**20, 4 * 2**40 / 1000, compare="<=",
                           unit="bytes"),
               CheckResult("scale/y", "t", "s", "scale", "pass", 3 * 2**30 + 2**29, 1e3, compare="<=", unit="bytes"),
               CheckResult("time/a", "t", "s", "bound", "pass", 0.0123, 2.5, compare="<", unit="seconds"),
               CheckResult("time/b", "t", "s", "bound", "pass", 4.2e-5, 300.0, compare="<=", unit="seconds"),
               CheckResult("complexity/z", "t", "s", "complexity", "pass", 1.91, 1.8, compare=">", unit="exponent"),
               CheckResult("erratum/e", "t", "s", "erratum", "pass", 0.02, 1e-3, compare=">=", unit="ratio")]
    table = runner.format_table(results)
    cells = lambda cid: [c.strip() for c in _row(table, cid) if c.strip()]  # noqa: E731
    assert cells("scale/x")[3:6] == ["412 MiB", "<=", "4.1 GiB"]
    assert cells("scale/y")[3:6] == ["3.5 GiB", "<=", "1000 B"]
    assert cells("time/a")[3:6] == ["12.3 ms", "<", "2.5 s"]
    assert cells("time/b")[3:6] == ["42 us", "<=", "300 s"]
    assert cells("complexity/z")[3:7] == ["1.91", ">", "1.8", "exponent"]
    assert cells("erratum/e")[3:7] == ["0.02", ">=", "0.001", "ratio"]
    assert "Why they failed" not in table


@pytest.mark.parametrize("x, unit, text", [
    (None, "bytes", "-"), (512, "bytes", "512 B"), (2**10, "bytes", "1 KiB"), (1.5 * 2**20, "bytes", "1.5 MiB"),
    (4 * 2**40, "bytes", "4 TiB"), (2.0, "seconds", "2 s"), (0.0, "seconds", "0 s"), (1e-3, "seconds", "1 ms"),
    (float("inf"), "bytes", "inf"), (1e-10, "relative", "1e-10"), (3, "", "3")])
def test_format_value(x, unit, text):
    assert runner.format_value(x, unit) == text


def test_format_table_prints_every_failing_checks_reasons():
    results = [CheckResult("scale/a", "t", "s", "scale", "fail", 5 * 2**30, 2**30, compare="<=", unit="bytes",
                           details={"reasons": ["peak memory 5.00 GiB > 1.00 GiB", "one call took 400 s > 300 s"]}),
               CheckResult("eq/b", "t", "s", "equivalence", "fail", None, 1e-10, compare="<=",
                           details={"error": "ValueError: planted", "traceback": "Traceback (most recent call last)"}),
               CheckResult("eq/c", "t", "s", "equivalence", "fail", 1e-6, 1e-10, compare="<=", unit="relative"),
               CheckResult("eq/d", "t", "s", "equivalence", "pass", 1e-12, 1e-10, compare="<=",
                           details={"reasons": []})]
    table = runner.format_table(results)
    why = table.splitlines()[table.splitlines().index("Why they failed:"):]
    assert why == ["Why they failed:",
                   "scale/a:", "  - peak memory 5.00 GiB > 1.00 GiB", "  - one call took 400 s > 300 s",
                   "eq/b:", "  - ValueError: planted",
                   "eq/c:", "  - statistic 1e-06 is not <= threshold 1e-10"]
    assert "eq/d:" not in table and "Traceback" not in table


def test_write_json(tmp_path):
    path = tmp_path / "deep" / "dir" / "out.json"
    runner.write_json([CheckResult("a/b", "t", "s", "bound", "pass", float("nan"), 1.0)], path)
    data = json.loads(path.read_text())
    assert isinstance(data, list) and set(data[0]) == SCHEMA and data[0]["statistic"] == "nan"


def test_cli_subprocess_json(tmp_path):
    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, "-m", "verify", "--only", "equivalence/linear", "--json", str(out),
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["id"] for r in data] == ["equivalence/linear"]
    assert SCHEMA <= set(data[0])
    assert data[0]["kind"] == "equivalence" and data[0]["status"] == "pass"
    assert data[0]["statistic"] <= data[0]["threshold"] and data[0]["seconds"] > 0
    assert "1 passed, 0 failed, 0 skipped" in proc.stdout


def test_cli_subprocess_unknown_only_exits_2():
    proc = subprocess.run([sys.executable, "-m", "verify", "--only", "nonexistent", "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "matches no check" in proc.stderr


def test_cli_exit_1_when_a_check_fails(monkeypatch, capsys):
    failing = CheckResult("a/b", "t", "s", "bound", "fail", 2.0, 1.0,
                          details={"error": "ValueError: planted", "traceback": "Traceback: line 1"})
    monkeypatch.setattr(cli, "run_checks", lambda **kw: [failing])
    assert cli.main(["--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "a/b:\n  - ValueError: planted" in captured.out  # the reason, under the table
    assert "a/b raised:\nTraceback: line 1" in captured.err
    monkeypatch.setattr(cli, "run_checks", lambda **kw: [CheckResult("a/b", "t", "s", "bound", "skip", None, None)])
    assert cli.main(["--no-progress"]) == 0


def test_cli_list(capsys):
    assert cli.main(["--list", "--only", "equivalence/"]) == 0
    ids = capsys.readouterr().out.split()
    assert "equivalence/linear" in ids and all(i.startswith("equivalence/") for i in ids)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: --device cuda is valid here")
def test_cli_cuda_without_cuda_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--device", "cuda", "--only", "equivalence/linear"])
    assert info.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_run_checks_shares_one_sweep_cache(monkeypatch):
    seen = []

    def run(ctx):
        seen.append(ctx.sweeps)
        ctx.sweeps[len(seen)] = "sweep"
        return Outcome("pass", 0.0)

    monkeypatch.setattr(runner, "all_checks", lambda: [Check("a/one", "t", "s", "bound", run=run),
                                                      Check("a/two", "t", "s", "bound", run=run)])
    cache = {}
    runner.run_checks(progress=False, sweeps=cache)
    assert seen[0] is cache and seen[1] is cache and cache == {1: "sweep", 2: "sweep"}
    seen.clear()
    runner.run_checks(progress=False)  # without one: still one dict for the whole run
    assert seen[0] is seen[1] and seen[0] is not cache


@pytest.mark.parametrize("progress", [False, True])
def test_cli_reports_each_check_as_it_finishes(monkeypatch, capsys, tmp_path, progress):
    """One line per finished check, bar or not, and the JSON rewritten after each one: the third
    check reads the file while the run is still going and sees exactly the two before it, so a run
    stopped there would have kept them."""
    path = tmp_path / "out" / "v.json"
    seen_by_third = []

    def third(ctx):
        seen_by_third.append([r["id"] for r in json.loads(path.read_text())])
        return Outcome("pass", 0.5)

    def failing(ctx):
        return Outcome("fail", 3.0, {"reasons": ["3 > 2 (planted)"]})

    checks = [_check("a/one"), Check("a/two", "t", "s", "bound", run=failing, threshold=2.0, compare="<="),
              Check("a/three", "t", "s", "bound", run=third, threshold=2.0, compare="<=")]
    monkeypatch.setattr(runner, "all_checks", lambda: checks)
    argv = ["--json", str(path)] + ([] if progress else ["--no-progress"])
    assert cli.main(argv) == 1
    assert seen_by_third == [["a/one", "a/two"]]
    assert [r["id"] for r in json.loads(path.read_text())] == ["a/one", "a/two", "a/three"]
    lines = capsys.readouterr().out.splitlines()
    first = [i for i, line in enumerate(lines) if line.startswith("[")]
    assert [lines[i] for i in first[:3]] == ["[1/3] pass  a/one  1 <= 2  (0.0 s)",
                                             "[2/3] FAIL  a/two  3 <= 2  (0.0 s): 3 > 2 (planted)",
                                             "[3/3] pass  a/three  0.5 <= 2  (0.0 s)"]
    assert first[:3] == [0, 1, 2] and "3 passed" not in lines[2]  # the lines come before the table
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_cli_stopped_run_keeps_what_finished(tmp_path):
    """A run killed in the middle of its checks leaves their lines on stdout and their JSON."""
    script = tmp_path / "run.py"
    path = tmp_path / "v.json"
    script.write_text(
        "import os, signal, sys\n"
        "import verify.__main__ as cli\n"
        "from verify import runner\n"
        "from results.check import Check, Outcome\n"
        "def kill(ctx):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "ok = lambda ctx: Outcome('pass', 1.0)\n"
        "runner.all_checks = lambda: [Check('a/one', 't', 's', 'bound', run=ok),\n"
        "                             Check('a/two', 't', 's', 'bound', run=ok),\n"
        "                             Check('a/kill', 't', 's', 'bound', run=kill)]\n"
        f"sys.exit(cli.main(['--no-progress', '--json', {str(path)!r}]))\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9
    assert [line.split()[2] for line in proc.stdout.splitlines()] == ["a/one", "a/two"]
    assert [r["id"] for r in json.loads(path.read_text())] == ["a/one", "a/two"]
