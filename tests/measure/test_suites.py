"""measure.suites: the peer suite and asv run from measure, with the child processes replaced (the
real runs take minutes; `make report` runs them), and the pipeline's two stages."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from measure import stages, suites


class FakeChildren:
    """Stands in for measure.suites.run_child: records each argv, answers from ``codes`` by the
    program's role, and writes the files the real children would."""

    def __init__(self, codes: dict[str, int] | None = None, raise_on: str | None = None):
        self.calls: list[list[str]] = []
        self.codes = codes or {}
        self.raise_on = raise_on

    @staticmethod
    def role(argv: list[str]) -> str:
        if "pytest" in argv:
            return "pytest"
        if any(a.endswith("summary.py") for a in argv):
            return "summary"
        if argv[0] == "git":
            return "git"
        return "asv " + argv[1]

    def __call__(self, argv, cwd, env=None, timeout=None):
        self.calls.append(list(argv))
        role = self.role(argv)
        if role == self.raise_on:
            raise subprocess.TimeoutExpired(argv, timeout or 1)
        code = self.codes.get(role, 0)
        if role == "pytest" and code in (0, 1):
            path = Path(cwd) / argv[argv.index("--benchmark-json") + 1]
            path.write_text(json.dumps({"benchmarks": []}))
        if role == "summary" and code == 0:
            (Path(cwd) / argv[argv.index("--out") + 1]).write_text("{}")
        out = "0123456789abcdef0123456789abcdef01234567\n" if role == "git" else "last line of output\n"
        return subprocess.CompletedProcess(argv, code, stdout=out, stderr="")


@pytest.fixture
def root(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "asv.conf.json").write_text("{}")
    return tmp_path


def test_repo_root_is_this_checkout():
    assert suites.repo_root() == Path(suites.__file__).resolve().parents[1]


def test_peers_runs_the_quick_grid_then_the_summary(monkeypatch, root):
    fake = FakeChildren()
    monkeypatch.setattr(suites, "run_child", fake)
    run = suites.run_peers("cpu", root=root)
    assert run.ok and run.output == str(suites.PEERS_SUMMARY)
    pytest_argv, summary_argv = fake.calls
    assert {"--quick", "--benchmark-enable", "--device"} <= set(pytest_argv)
    assert pytest_argv[pytest_argv.index("--device") + 1] == "cpu"
    assert pytest_argv[pytest_argv.index("--threads") + 1] == str(suites.PEER_THREADS)
    assert summary_argv[-2:] == ["--out", str(suites.PEERS_SUMMARY)]
    assert (root / suites.PEERS_SUMMARY).is_file() and "--bench-d" not in pytest_argv
    suites.run_peers("cpu", root=root, quick=True)
    quick = fake.calls[-2]
    assert quick[quick.index("--bench-d") + 1] == suites.QUICK_PEER_D


def test_peers_with_failed_benchmarks_still_summarises_and_says_so(monkeypatch, root):
    monkeypatch.setattr(suites, "run_child", FakeChildren({"pytest": 1}))
    run = suites.run_peers("cpu", root=root)
    assert run.ok and "some benchmarks failed" in run.note


@pytest.mark.parametrize("codes, raise_on, says", [
    ({"pytest": 2}, None, "the peer suite stopped (exit 2)"),
    ({"summary": 1}, None, "summary.py failed"),
    ({}, "pytest", "was stopped"),
])
def test_peers_failures_are_notes_not_exceptions(monkeypatch, root, codes, raise_on, says):
    monkeypatch.setattr(suites, "run_child", FakeChildren(codes, raise_on))
    run = suites.run_peers("cpu", root=root)
    assert not run.ok and run.output is None and says in run.note
    assert run.command == "make bench-ops ARGS=--quick"


def test_history_records_this_commit_under_the_make_machine(monkeypatch, root):
    fake = FakeChildren()
    monkeypatch.setattr(suites, "run_child", fake)
    run = suites.run_history(root=root)
    assert run.ok and "01234567" in run.note
    asv_run = fake.calls[-1]
    assert asv_run[1:3] == ["run", "--python=same"]
    assert asv_run[asv_run.index("--set-commit-hash") + 1] == "0123456789abcdef0123456789abcdef01234567"
    assert asv_run[asv_run.index("--machine") + 1] == suites.ASV_MACHINE == "maskbench-local"
    assert asv_run[asv_run.index("-b") + 1] == suites.ASV_BENCHMARKS


@pytest.mark.parametrize("codes, says", [
    ({"git": 128}, "not a git checkout"),
    ({"asv machine": 1}, "asv machine failed"),
    ({"asv run": 2}, "asv run failed (exit 2)"),
])
def test_history_failures_are_notes(monkeypatch, root, codes, says):
    monkeypatch.setattr(suites, "run_child", FakeChildren(codes))
    run = suites.run_history(root=root)
    assert not run.ok and says in run.note and run.command == "make bench"


def test_without_the_checkout_nothing_runs(monkeypatch):
    monkeypatch.setattr(suites, "repo_root", lambda: None)
    monkeypatch.setattr(suites, "run_child", lambda *a, **k: pytest.fail("a child was started"))
    assert "no benchmarks/ folder" in suites.run_peers("cpu").note
    assert "no asv.conf.json" in suites.run_history().note


def _stub_stages(monkeypatch, calls):
    for name in ("favor_stage", "favor_accuracy_stage", "gallery_stage", "training_stage", "distributed_stage"):
        monkeypatch.setattr(stages, name, lambda *a, **k: None)
    monkeypatch.setattr(stages, "sweeps_stage", lambda *a, **k: ([], []))
    monkeypatch.setattr(stages, "peers_stage", lambda device, quick, status: calls.append(("peers", device)) or "p ok")
    monkeypatch.setattr(stages, "history_stage", lambda status: calls.append(("history",)) or "h ok")


def test_pipeline_runs_both_unless_skipped_or_only(monkeypatch):
    from measure.pipeline import Options, collect

    calls: list = []
    _stub_stages(monkeypatch, calls)
    base = {"quick": True, "skip_memory": True, "skip_verify": True, "skip_training": True,
            "progress": False, "argv": []}
    res = collect(Options(**base))
    assert calls == [("peers", "cpu"), ("history",)]
    assert res.environment["peers_run"] == "p ok" and res.environment["history_run"] == "h ok"
    assert {"peers", "history"} <= set(res.stage_seconds)
    calls.clear()
    collect(Options(**base, skip_peers=True))
    assert calls == [("history",)]
    calls.clear()
    collect(Options(**base, skip_history=True, skip_peers=True))
    collect(Options(**base, only=["linear"]))
    assert calls == []


def test_cli_flags():
    from measure.cli import parse_args

    opts = parse_args(["--skip-peers", "--skip-history"])[0]
    assert opts.skip_peers and opts.skip_history
    assert not parse_args([])[0].skip_peers
