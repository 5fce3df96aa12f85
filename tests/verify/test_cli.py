"""python -m verify's argument errors: each is a usage error (exit 2) found before any check runs,
and its message names the option and what was expected (issue 10: --seed -1, --device tpu/meta,
an unwritable --json found only after the run, --seeds with a new --json folder, --only '' and
--json '')."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import verify.__main__ as cli
from results.check import Check, CheckResult, Outcome
from tests.helpers import DEVICES, cuda_only
from verify import runner

ROOT = Path(__file__).resolve().parents[2]


def _tiny_checks():
    return [Check("t/one", "t", "s", "bound", run=lambda ctx: Outcome("pass", 0.0), threshold=1.0, compare="<="),
            Check("t/two", "t", "s", "bound", run=lambda ctx: Outcome("pass", 0.0), threshold=1.0, compare="<=")]


@pytest.fixture
def no_run(monkeypatch):
    """Any check run fails the test: usage errors must come before the work."""
    def refuse(*args, **kwargs):
        raise AssertionError("a check ran although the arguments were bad")

    monkeypatch.setattr(cli, "run_checks", refuse)
    monkeypatch.setattr(cli, "seed_sweep", refuse)


def usage_error(argv: list[str], capsys, *texts: str) -> str:
    """main(argv) exits with status 2 and stderr holds each of texts. Returns stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m verify" in err
    for text in texts:
        assert text in err, f"{text!r} not in {err!r}"
    return err


# --------------------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("value, shown", [("-1", "got -1"), ("-100", "got -100"), ("abc", "got 'abc'"),
                                          ("1.5", "got '1.5'"), ("", "got ''")])
def test_bad_seed_is_a_usage_error(no_run, capsys, value, shown):
    usage_error(["--seed", value, "--no-progress"], capsys, "argument --seed", "expected an int >= 0", shown)


@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_bad_seed_count_is_a_usage_error(no_run, capsys, value):
    usage_error(["--seeds", value, "--no-progress"], capsys, "argument --seeds", "expected an int >= 1")


def test_seed_zero_and_large_seeds_are_accepted(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(cli, "run_checks", lambda **kw: seen.update(kw) or [])
    assert cli.main(["--seed", "0", "--no-progress"]) == 0
    assert seen["seed"] == 0
    assert cli.main(["--seed", str(2**70), "--no-progress"]) == 0  # SeedSequence takes any int >= 0
    assert seen["seed"] == 2**70


def test_runner_refuses_a_negative_seed_before_any_check(monkeypatch):
    monkeypatch.setattr(runner, "all_checks", lambda: pytest.fail("checks were collected"))
    for seed in (-1, True, 1.0, "3"):
        with pytest.raises(ValueError, match="the seed must be an int >= 0"):
            runner.run_checks(seed=seed, progress=False)
    assert runner.check_seed(np.int64(3)) == 3 and runner.check_seed(0) == 0


def test_subprocess_negative_seed_exits_2():
    proc = subprocess.run([sys.executable, "-m", "verify", "--list", "--seed", "-1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "argument --seed: expected an int >= 0" in proc.stderr


# -------------------------------------------------------------------------------------- device


@pytest.mark.parametrize("device, text", [
    ("tpu", "must be a torch device string"),
    ("", "must be a torch device string"),
    ("cuda:x", "must be a torch device string"),
    ("meta", "holds no data"),
    ("meta:0", "holds no data"),
])
def test_bad_device_is_a_usage_error(no_run, capsys, device, text):
    err = usage_error(["--device", device, "--only", "t/", "--no-progress"], capsys, "argument --device", text)
    assert repr(device) in err


def test_device_without_a_backend_is_a_usage_error(no_run, capsys):
    """A device string torch parses but cannot allocate on here (no MPS/XPU build, no such GPU)."""
    candidates = ["xpu", "mps", f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"]
    for device in candidates:
        try:
            torch.zeros(1, device=device)
            continue  # this machine has it
        except Exception:  # noqa: BLE001 - any failure to allocate
            pass
        usage_error(["--device", device, "--no-progress"], capsys, "argument --device", repr(device))


def test_device_is_checked_for_list_and_seed_sweeps_too(no_run, capsys):
    usage_error(["--device", "tpu", "--list"], capsys, "argument --device")
    usage_error(["--device", "meta", "--seeds", "2"], capsys, "argument --device", "holds no data")


def test_runner_refuses_a_bad_device_before_any_check(monkeypatch):
    monkeypatch.setattr(runner, "all_checks", lambda: pytest.fail("checks were collected"))
    for device in ("tpu", "meta", 3):
        with pytest.raises(ValueError, match="device"):
            runner.run_checks(device=device, progress=False)
        with pytest.raises(ValueError, match="device"):
            runner.seed_sweep(2, device=device, progress=False)
    assert runner.check_device("cpu") == "cpu" and runner.check_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_device_runs(monkeypatch, capsys, device):
    monkeypatch.setattr(runner, "all_checks", _tiny_checks)
    assert cli.main(["--device", device, "--only", "t/one", "--no-progress"]) == 0
    assert "1 passed, 0 failed, 0 skipped" in capsys.readouterr().out


@cuda_only
def test_absent_cuda_index_is_a_usage_error(no_run, capsys):
    """cuda:N past the last GPU parses but cannot hold a tensor (a CPU-only machine refuses every cuda
    device earlier: test_device_without_a_backend_is_a_usage_error)."""
    device = f"cuda:{torch.cuda.device_count()}"
    err = usage_error(["--device", device, "--no-progress"], capsys, "argument --device", "cannot hold a tensor")
    assert repr(device) in err


# ---------------------------------------------------------------------------------------- --only


@pytest.mark.parametrize("extra", [[], ["--list"], ["--seeds", "2"], ["--only", "t/one"]])
def test_empty_only_is_a_usage_error(no_run, capsys, extra):
    usage_error(["--only", "", *extra, "--no-progress"], capsys, "argument --only", "expected a check id prefix",
                "empty string")


def test_runner_select_refuses_an_empty_prefix():
    with pytest.raises(ValueError, match="non-empty check id prefixes"):
        runner.select(_tiny_checks(), ["t/one", ""])
    assert [c.id for c in runner.select(_tiny_checks(), [])] == ["t/one", "t/two"]  # [] = no filter


def test_unknown_only_in_a_seed_sweep_fails_before_the_first_seed(monkeypatch, capsys):
    monkeypatch.setattr(runner, "all_checks", _tiny_checks)
    monkeypatch.setattr(runner, "run_checks", lambda **kw: pytest.fail("a seed ran"))
    usage_error(["--seeds", "3", "--only", "nope", "--no-progress"], capsys, "--only nope matches no check")


def _mech_checks(quick_train: bool = True) -> list[Check]:
    def check(cid, quick=True):
        return Check(cid, "t", "s", "bound", run=lambda ctx: Outcome("pass", 0.0), quick=quick, threshold=1.0,
                     compare="<=")

    return [check("equivalence/nodeformer"), check("equivalence/nodeformer-gumbel"), check("equivalence/difformer"),
            check("complexity/nodeformer"), check("complexity/nodeformer-gumbel"), check("scale/nodeformer"),
            check("scale/nodeformer-train", quick=quick_train), check("wu22/theorem-1"), check("perf/linear"),
            check("performer/prf-variance")]


def _use(monkeypatch, checks) -> None:
    """Every path of main (--list imports verify.checks.all_checks; the runs use runner's) sees checks()."""
    import verify.checks

    monkeypatch.setattr(runner, "all_checks", checks)
    monkeypatch.setattr(verify.checks, "all_checks", checks)


def test_check_belongs_to():
    assert runner.check_belongs_to("complexity/linear", "linear")
    assert runner.check_belongs_to("scale/linear-train", "linear")
    assert runner.check_belongs_to("equivalence/tree-dc/path", "tree-dc")
    assert not runner.check_belongs_to("equivalence/linear-x", "linear")  # only scale/ has suffixes
    assert not runner.check_belongs_to("complexity/causal", "linear")
    assert not runner.check_belongs_to("equivalence/nodeformer-gumbel", "nodeformer")  # another mechanism


def test_only_a_mechanism_id_selects_every_check_about_it():
    """A bare name that starts no id selects the checks about it (scale's -train too), not those of a
    mechanism whose id it merely begins (nodeformer-gumbel)."""
    ids = [c.id for c in runner.select(_mech_checks(), ["nodeformer"])]
    assert ids == ["equivalence/nodeformer", "complexity/nodeformer", "scale/nodeformer", "scale/nodeformer-train"]
    assert [c.id for c in runner.select(_mech_checks(), ["theorem-1", "difformer"])] == ["equivalence/difformer",
                                                                                         "wu22/theorem-1"]
    with pytest.raises(ValueError, match="did you mean: nodeformer, nodeformer-gumbel, nodeformer-train"):
        runner.select(_mech_checks(), ["node"])  # a name, not the start of one (scale/'s suffix rule aside)


def test_only_prefixes_and_exact_ids_keep_their_meaning():
    checks = _mech_checks()
    assert [c.id for c in runner.select(checks, ["equivalence/nodeformer"])] == ["equivalence/nodeformer",
                                                                                 "equivalence/nodeformer-gumbel"]
    assert [c.id for c in runner.select(checks, ["perf"])] == ["perf/linear", "performer/prf-variance"]  # prefix first
    assert [c.id for c in runner.select(checks, ["scale/nodeformer-train"])] == ["scale/nodeformer-train"]


def test_unknown_only_suggests_what_contains_it_briefly(capsys, monkeypatch):
    """The error names the value, suggests at most 12 valid values that contain it (counting the
    rest), points to --list, and never dumps every id."""
    _use(monkeypatch, lambda: [Check(f"fam{i}/nodeformer-v{i}", "t", "s", "bound", run=lambda ctx: Outcome("pass", 0.0),
                                     threshold=1.0, compare="<=") for i in range(20)])
    err = usage_error(["--list", "--only", "nodeform"], capsys, "--only nodeform matches no check",
                      "did you mean: nodeformer-v0, nodeformer-v1", "(and 8 more)",
                      "python -m verify --list shows every id")
    assert "nodeformer-v12" not in err and "[" not in err.split("error:")[1]


def test_unknown_only_suggests_close_matches(monkeypatch, capsys):
    _use(monkeypatch, _mech_checks)
    usage_error(["--list", "--only", "nodeformr"], capsys, "did you mean: nodeformer", "--list shows every id")
    usage_error(["--list", "--only", "equivalnce/"], capsys, "did you mean: equivalence/")
    err = usage_error(["--list", "--only", "zzz"], capsys, "--only zzz matches no check", "--list shows every id")
    assert "did you mean" not in err


def test_only_matching_only_full_checks_in_quick_mode_says_so(monkeypatch, capsys):
    _use(monkeypatch, lambda: _mech_checks(quick_train=False))
    usage_error(["--list", "--quick", "--only", "scale/nodeformer-train"], capsys,
                "matches no check of --quick, only checks that run without --quick: scale/nodeformer-train")


def test_one_unknown_only_value_among_good_ones_is_refused(monkeypatch, capsys):
    """A typo next to a valid value must not pass as 'all green' for the valid one alone."""
    _use(monkeypatch, _mech_checks)
    usage_error(["--list", "--only", "perf/", "--only", "nodefromer"], capsys, "--only nodefromer matches no check")


def test_only_nodeformer_on_the_real_registry(capsys):
    assert cli.main(["--list", "--quick", "--only", "nodeformer"]) == 0
    ids = capsys.readouterr().out.split()
    assert "equivalence/nodeformer" in ids and "scale/nodeformer-train" in ids
    assert all(i.split("/", 1)[1] in ("nodeformer", "nodeformer-train") for i in ids)


def test_exclude_drops_id_prefixes_after_only(capsys, no_run):
    assert cli.main(["--list", "--quick", "--only", "nodeformer", "--exclude", "scale/"]) == 0
    ids = capsys.readouterr().out.split()
    assert "equivalence/nodeformer" in ids and not any(i.startswith("scale/") for i in ids)
    usage_error(["--list", "--quick", "--only", "scale/", "--exclude", "scale"], capsys, "drops every one of the")
    usage_error(["--quick", "--exclude", ""], capsys, "argument --exclude", "empty")
    usage_error(["--seeds", "2", "--exclude", "scale/"], capsys, "not with --seeds")


# ---------------------------------------------------------------------------------------- --json


def test_empty_json_is_a_usage_error(no_run, capsys):
    usage_error(["--json", "", "--no-progress"], capsys, "argument --json", "expected a file path")


def test_unwritable_json_is_found_before_the_run(no_run, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    usage_error(["--json", str(blocker / "out.json"), "--no-progress"], capsys, "argument --json", "cannot write",
                str(blocker / "out.json"))
    usage_error(["--json", str(blocker / "sub" / "out.json"), "--seeds", "2"], capsys, "argument --json")
    usage_error(["--json", str(tmp_path), "--no-progress"], capsys, "argument --json", "directory")
    assert blocker.read_text() == "x"


def test_json_check_leaves_nothing_behind_when_the_run_fails(monkeypatch, tmp_path):
    def crash(**kwargs):
        raise RuntimeError("the run failed")

    monkeypatch.setattr(cli, "run_checks", crash)
    new = tmp_path / "new" / "dir" / "out.json"
    with pytest.raises(RuntimeError, match="the run failed"):
        cli.main(["--json", str(new), "--no-progress"])
    assert new.parent.is_dir() and not new.exists()  # the folder is made up front, the file is not left
    old = tmp_path / "old.json"
    old.write_text("previous results")
    with pytest.raises(RuntimeError):
        cli.main(["--json", str(old), "--no-progress"])
    assert old.read_text() == "previous results"  # checked by appending nothing, never truncated


def test_json_into_a_new_folder_for_a_plain_run_and_a_seed_sweep(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runner, "all_checks", _tiny_checks)
    plain = tmp_path / "a" / "b" / "plain.json"
    assert cli.main(["--only", "t/one", "--json", str(plain), "--no-progress"]) == 0
    assert [r["id"] for r in json.loads(plain.read_text())] == ["t/one"]
    swept = tmp_path / "c" / "d" / "seeds.json"
    assert cli.main(["--seeds", "1", "--json", str(swept), "--no-progress"]) == 0
    assert json.loads(swept.read_text()) == {cid: {"runs": 1, "failures": 0, "failed_seeds": [], "rate": 0.0}
                                             for cid in ("t/one", "t/two")}


def test_write_sweep_json_creates_the_folder(tmp_path):
    path = tmp_path / "x" / "y.json"
    runner.write_sweep_json({"a/b": {"runs": 2, "failures": 1, "failed_seeds": [0], "rate": 0.5}}, path)
    assert json.loads(path.read_text())["a/b"]["rate"] == 0.5


def test_list_ignores_json(monkeypatch, tmp_path, capsys):
    """--list writes nothing, so its --json is neither checked nor created."""
    monkeypatch.setattr(runner, "all_checks", _tiny_checks)
    monkeypatch.setattr("verify.checks.all_checks", _tiny_checks)
    target = tmp_path / "new" / "x.json"
    assert cli.main(["--list", "--json", str(target)]) == 0
    assert capsys.readouterr().out.split() == ["t/one", "t/two"] and not target.parent.exists()


def test_a_failing_run_still_writes_json_and_exits_1(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "run_checks", lambda **kw: [CheckResult("a/b", "t", "s", "bound", "fail", 2.0, 1.0)])
    out = tmp_path / "deep" / "r.json"
    assert cli.main(["--json", str(out), "--no-progress"]) == 1
    assert json.loads(out.read_text())[0]["status"] == "fail"
