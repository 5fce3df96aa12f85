"""verify/runner.py and the ``python -m verify`` CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import verify.__main__ as cli
from verify import runner
from verify.result import Check, CheckResult

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"id", "title", "source", "kind", "status", "statistic", "threshold", "seconds", "details"}


def _check(cid, status="pass", quick=True, raises=False):
    def run(ctx):
        if raises:
            raise RuntimeError("boom")
        return CheckResult(cid, "title " + cid, "src", "bound", status, 1.0, 2.0)

    return Check(cid, "title " + cid, "src", "bound", run=run, quick=quick)


CHECKS = [_check("equivalence/causal"), _check("equivalence/causal-2"), _check("equivalence/linear"),
          _check("performer/prf-variance", quick=False), _check("scale/causal")]


def test_select_quick_and_prefixes():
    assert [c.id for c in runner.select(CHECKS)] == [c.id for c in CHECKS]
    assert "performer/prf-variance" not in [c.id for c in runner.select(CHECKS, quick=True)]
    assert [c.id for c in runner.select(CHECKS, ["equivalence/causal"])] == ["equivalence/causal", "equivalence/causal-2"]
    assert [c.id for c in runner.select(CHECKS, ["scale", "equivalence/lin"])] == ["equivalence/linear", "scale/causal"]
    assert [c.id for c in runner.select(CHECKS, ["performer"])] == ["performer/prf-variance"]


def test_select_nothing_matches_is_an_error():
    with pytest.raises(ValueError, match=r"--only \['nonexistent'\] matches no check; known ids: equivalence/causal"):
        runner.select(CHECKS, ["nonexistent"])
    with pytest.raises(ValueError, match="matches no check"):  # a full-only check in quick mode
        runner.select(CHECKS, ["performer"], quick=True)
    with pytest.raises(ValueError, match="matches no check"):  # prefixes, not substrings
        runner.select(CHECKS, ["causal"])


def test_run_checks_reports_an_exception_as_a_failure(monkeypatch):
    checks = [_check("a/ok"), _check("a/boom", raises=True), _check("a/skip", status="skip")]
    monkeypatch.setattr(runner, "all_checks", lambda: checks)
    results = runner.run_checks(quick=True, progress=False)
    assert [r.id for r in results] == ["a/ok", "a/boom", "a/skip"]
    assert [r.status for r in results] == ["pass", "fail", "skip"]
    assert results[1].details["error"] == "RuntimeError: boom" and "Traceback" in results[1].details["traceback"]
    assert all(r.seconds >= 0 for r in results)
    assert [r.id for r in runner.run_checks(only=["a/ok"], progress=False)] == ["a/ok"]


def _seeded_checks():
    def flaky(ctx):  # fails for seeds divisible by 3
        return CheckResult("s/flaky", "t", "s", "bound", "fail" if ctx.seed % 3 == 0 else "pass", None, None)

    return [Check("s/flaky", "t", "s", "bound", run=flaky), _check("s/solid")]


def test_seed_sweep_counts_failures_per_check(monkeypatch):
    monkeypatch.setattr(runner, "all_checks", _seeded_checks)
    counts = runner.seed_sweep(7, progress=False)
    assert counts["s/flaky"] == {"runs": 7, "failures": 3, "failed_seeds": [0, 3, 6], "rate": 3 / 7}
    assert counts["s/solid"]["failures"] == 0 and counts["s/solid"]["rate"] == 0.0
    assert list(runner.seed_sweep(2, only=["s/solid"], progress=False)) == ["s/solid"]
    with pytest.raises(ValueError, match="seeds must be >= 1"):
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
    results = [CheckResult("a/one", "t", "src-1", "bound", "pass", 0.5, 1.0),
               CheckResult("a/two", "t", "src-2", "bound", "fail", float("inf"), None),
               CheckResult("a/three", "t", "src-3", "bound", "skip", None, None),
               CheckResult("a/four", "t", "src-4", "bound", "pass", 0.123456, 0.5)]
    table = runner.format_table(results)
    lines = table.splitlines()
    assert lines[-1] == "2 passed, 1 failed, 1 skipped"
    assert lines[0].split() == ["id", "source", "status", "statistic", "threshold", "seconds"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "FAIL" in lines[3] and "pass" in lines[2] and "skip" in lines[4]
    assert "0.123" in lines[5] and "0.123456" not in lines[5]
    # fixed width: every cell of every row starts where its column's dashes start
    starts = [i for i, ch in enumerate(lines[1]) if ch == "-" and (i == 0 or lines[1][i - 1] == " ")]
    assert len(starts) == 6
    for line in [lines[0]] + lines[2:6]:
        assert all(line[i] != " " and (i == 0 or line[i - 1] == " ") for i in starts), line


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
    failing = CheckResult("a/b", "t", "s", "bound", "fail", 2.0, 1.0, details={"error": "ValueError: planted"})
    monkeypatch.setattr(cli, "run_checks", lambda **kw: [failing])
    assert cli.main(["--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "planted" in captured.err
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
