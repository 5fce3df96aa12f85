"""measure/gpu.py (make gpu-check): what can run without a GPU, on the CPU."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from measure import gpu
from verify.mechanisms import mechanisms
from verify.registry import lookup


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the run would measure")
def test_without_cuda_it_says_so_and_exits_2(capsys, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available on this machine" in err and "nothing was measured" in err
    assert not out.exists()


def test_a_cpu_device_is_refused(capsys):
    assert gpu.main(["--device", "cpu"]) == 2
    assert "'cpu' is not a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu.main(["--budget", "-1"])


def test_sweep_curve_times_and_measures_each_n():
    mech = lookup("linear")
    c = gpu.sweep_curve(mech, "cpu", (256, 512, 1024), budget_s=60.0, rounds=2)
    assert c["sizes"] == [256, 512, 1024] and c["error"] is None and c["variant"] == mech.default_variant.name
    assert all(t > 0 for t in c["seconds"]) and len(c["peak_bytes"]) == 3 and all(b >= 0 for b in c["peak_bytes"])
    assert c["fit"] is not None and c["complexity"] == "N" and c["dtype"] == "float32"
    json.dumps(c)  # plain JSON
    # a used-up budget still measures the first N, and no more
    assert gpu.sweep_curve(mech, "cpu", (256, 512, 1024), budget_s=0.0, rounds=1)["sizes"] == [256]


def test_sweep_curve_records_an_error_and_keeps_the_points_before_it():
    real = lookup("linear")

    def setup(problem, device, dtype):
        if problem.q.shape[-2] > 256:
            raise MemoryError("planted")
        return real.fast_setup(problem, device, dtype)

    mech = SimpleNamespace(id="x", title="x", complexity="N", default_variant=real.default_variant,
                           problem=real.problem, fast_setup=setup)
    c = gpu.sweep_curve(mech, "cpu", (256, 512, 1024), budget_s=60.0, rounds=1)
    assert c["sizes"] == [256] and c["error"] == "N = 512: MemoryError: planted" and c["fit"] is None


def test_sweep_sizes_start_at_the_launch_floor():
    for mech in mechanisms():
        sizes = gpu.sweep_sizes(mech)
        assert sizes and list(sizes) == sorted(set(sizes))
        assert all(n >= gpu.MIN_SWEEP_N for n in sizes) and all(mech.admissible(n) == n for n in sizes)


def test_run_child_stops_at_its_limit_and_keeps_the_output():
    child = gpu.run_child([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                          timeout=3, echo=False)
    assert child.timed_out and child.tail == "started" and child.seconds < 30
    done = gpu.run_child([sys.executable, "-c", "print('a'); print('b')"], timeout=60, echo=False)
    assert not done.timed_out and done.returncode == 0 and done.tail == "a\nb"


def test_parse_junit(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite>'
        '<testcase classname="tests.fast.test_a" name="test_ok[cuda]" time="0.5"/>'
        '<testcase classname="tests.fast.test_a" name="test_bad" time="0.1"><failure message="assert 10 == 12">x'
        '</failure></testcase>'
        '<testcase classname="tests.fast.test_b" name="test_skip" time="0"><skipped message="needs CUDA"/></testcase>'
        '</testsuite></testsuites>')
    assert gpu.parse_junit(xml) == [
        {"id": "tests/fast/test_a.py::test_ok[cuda]", "outcome": "passed", "seconds": 0.5, "message": ""},
        {"id": "tests/fast/test_a.py::test_bad", "outcome": "failed", "seconds": 0.1, "message": "assert 10 == 12"},
        {"id": "tests/fast/test_b.py::test_skip", "outcome": "skipped", "seconds": 0.0, "message": "needs CUDA"}]
    assert gpu.parse_junit(tmp_path / "missing.xml") == []


def test_collect_rewrites_the_json_after_each_stage_within_the_budget(tmp_path, monkeypatch):
    """Each stage sees the JSON of the stages before it; each gets its share of what is left, so
    stages that use all their time still end within the budget, and one that is quick leaves its
    time to the next."""
    out = tmp_path / "o" / "gpu.json"
    clock = [0.0]
    limits = {}

    def stage(name, use_all=True):
        def run(limit):
            limits[name] = limit
            clock[0] += limit if use_all else 0.0
            seen = json.loads(out.read_text())
            return {"saw": sorted(k for k in gpu.STAGES if k in seen), "returncode": 0}
        return run

    def install(use_all):
        monkeypatch.setattr(gpu.time, "perf_counter", lambda: clock[0])
        monkeypatch.setattr(gpu, "cuda_environment", lambda device: {"device": device})
        monkeypatch.setattr(gpu, "tests_stage", lambda work, limit, echo: stage("tests", use_all)(limit))
        monkeypatch.setattr(gpu, "checks_stage", lambda work, dev, limit, echo, only: stage("checks", use_all)(limit))
        monkeypatch.setattr(gpu, "sweeps_stage", lambda dev, limit, progress: stage("sweeps", use_all)(limit))
        monkeypatch.setattr(gpu, "causal_stage", lambda dev, limit, progress: stage("causal", use_all)(limit))
        monkeypatch.setattr(gpu, "peers_stage", lambda work, dev, limit, echo: stage("peers", use_all)(limit))

    install(use_all=True)
    run = gpu.collect("cuda", out, budget_s=100.0, skip=("peers",), echo=False)
    assert run["tests"]["saw"] == [] and run["checks"]["saw"] == ["tests"] and run["sweeps"]["saw"] == ["checks", "tests"]
    assert run["causal"]["saw"] == ["checks", "sweeps", "tests"]
    assert "peers" not in run and run["skipped_stages"] == ["peers"] and run["failures"] == []
    assert json.loads(out.read_text())["seconds"] == run["seconds"] == pytest.approx(100.0)
    sh = gpu.SHARES
    ran = sh["tests"] + sh["checks"] + sh["sweeps"] + sh["causal"]  # the shares of the stages that run
    assert limits == pytest.approx({"tests": 100 * sh["tests"] / ran, "checks": 100 * sh["checks"] / ran,
                                    "sweeps": 100 * sh["sweeps"] / ran, "causal": 100 * sh["causal"] / ran})
    clock[0] = 0.0
    install(use_all=False)  # instant stages: each later one may use what the earlier ones left
    gpu.collect("cuda", out, budget_s=100.0, echo=False)
    assert limits == pytest.approx({"tests": 100 * sh["tests"], "checks": 100 * sh["checks"] / (1 - sh["tests"]),
                                    "sweeps": 100 * sh["sweeps"] / (sh["sweeps"] + sh["causal"] + sh["peers"]),
                                    "causal": 100 * sh["causal"] / (sh["causal"] + sh["peers"]), "peers": 100.0})


def test_failures_name_what_failed():
    assert gpu.failures({}) == []
    run = {"tests": {"cases": [{"id": "t::a", "outcome": "failed"}, {"id": "t::b", "outcome": "passed"}],
                     "returncode": 1},
           "checks": {"results": [{"id": "scale/x", "status": "fail"}, {"id": "y", "status": "pass"}],
                      "timed_out": True},
           "peers": {"returncode": 1}}
    got = gpu.failures(run)
    assert got == ["1 CUDA test(s) failed: t::a", "1 check(s) failed: scale/x", "the peer suite exited with status 1",
                   "the checks stage ran out of its time and was stopped"]


def test_merge_benchmark_reports():
    a = {"machine_info": {"node": "x"}, "benchmarks": [{"name": "a"}], "maskbench": {"peers": {"p": "1"},
                                                                                     "skipped": ["s1"]}}
    b = {"machine_info": {"node": "y"}, "benchmarks": [{"name": "b"}], "maskbench": {"skipped": ["s1", "s2"]}}
    merged = gpu.merge_benchmark_reports([a, b])
    assert [x["name"] for x in merged["benchmarks"]] == ["a", "b"] and merged["machine_info"] == {"node": "x"}
    assert merged["maskbench"] == {"peers": {"p": "1"}, "skipped": ["s1", "s2"]}
    assert gpu.merge_benchmark_reports([]) is None


def test_peers_stage_runs_each_operation_apart_and_summarises(tmp_path, monkeypatch):
    """On the CPU: SDPA's math kernel runs in float32 there and its memory-efficient one refuses,
    so one part times and the other skips with torch's reason; the summary holds the first."""
    monkeypatch.setattr(gpu, "PEER_OPS", ("softmax-math", "softmax-efficient"))
    small = ("--bench-N", "256", "--bench-d", "16")
    out = gpu.peers_stage(tmp_path, "cpu", timeout=600, echo=False, bench_args=small)
    assert [p["op"] for p in out["parts"]] == ["softmax-math", "softmax-efficient"]
    assert all(p["returncode"] == 0 and not p["timed_out"] for p in out["parts"]), out["tail"]
    rows = out["summary"]["rows"]
    assert rows and {r["op"] for r in rows} == {"softmax-math"} and {r["dtype"] for r in rows} == {"float32"}
    assert any("torch-sdpa-efficient cannot run on cpu" in s for s in out["summary"]["skipped"])
    assert not [f for op in gpu.PEER_OPS for f in tmp_path.glob(f"gpu-peers-{op}.json")]  # merged, removed
    assert json.loads((tmp_path / "gpu-peers-summary.json").read_text()) == out["summary"]
    none = gpu.peers_stage(tmp_path, "cpu", timeout=1, echo=False, bench_args=small)  # no time for any part
    assert none["summary"] is None and "no part of the peer suite finished" in none["summary_error"]
    assert [p["skipped"] for p in none["parts"]] == ["no time left"] * 2


# ------------------------------------------------------------------------------ the causal stage (issue 25)


def test_causal_plan_puts_the_targets_first_and_the_crossover_in_bfloat16():
    plan = gpu.causal_plan()
    first_n = gpu.CAUSAL_SIZES[0]
    assert plan[:3] == [(impl, first_n, "float32", "forward") for impl in ("maskbench", "attend", "fla")]
    largest = [i for i, p in enumerate(plan) if p[1] == max(gpu.CAUSAL_SIZES)]
    assert largest == list(range(len(plan) - len(largest), len(plan)))  # the costliest points come last
    assert {p[0] for p in plan} == set(gpu.CAUSAL_IMPLS)
    assert {p[2] for p in plan if p[0] == "sdpa-flash"} == {"bfloat16"}
    assert {p[1] for p in plan if p[0] == "sdpa-flash"} == set(gpu.CROSSOVER_SIZES)
    assert {(p[1], p[2], p[3]) for p in plan if p[0] == "fla"} == {
        (n, dt, ps) for n in gpu.CAUSAL_SIZES for dt in ("float32", "bfloat16") for ps in gpu.PASSES}
    assert len(plan) == len(set(plan))


def test_causal_peers_that_cannot_run_here_say_why():
    assert "needs --device cuda" in gpu.causal_unavailable("fla", "cpu", "float32")
    assert gpu.causal_unavailable("maskbench", "cpu", "float32") is None


@pytest.mark.parametrize("impl", ["maskbench", "attend", "attend-stable", "favor", "favor-decayed"])
@pytest.mark.parametrize("pass_", gpu.PASSES)
def test_causal_runner_runs_maskbench_on_the_cpu(monkeypatch, impl, pass_):
    monkeypatch.setattr(gpu, "CAUSAL_SHAPE", (1, 2, 8, 8))  # small: the plumbing, not the speed
    run = gpu.causal_runner(impl, 40, "float32", pass_, "cpu")
    run()
    run()  # gradients are cleared between calls: a second call runs as the first
    with pytest.raises(ValueError, match="impl must be one of"):
        gpu.causal_runner("flash", 40, "float32", pass_, "cpu")


def test_causal_stage_with_fakes_skips_absent_peers_records_errors_and_keeps_to_its_budget(monkeypatch):
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    clock = [0.0]
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(gpu, "causal_unavailable", lambda impl, device, dtype: "not here" if impl == "fla" else None)

    def runner(impl, n, dtype, pass_, device):
        if impl == "attend" and n == 32 and dtype == "float32" and pass_ == "forward":
            raise RuntimeError("planted")
        return lambda: None

    def timed(run, device, rounds):
        clock[0] += 10.0  # each point costs 10 s
        return [1.0, 2.0, 3.0][:rounds]

    monkeypatch.setattr(gpu, "causal_runner", runner)
    monkeypatch.setattr(gpu, "time_point", timed)
    plan = gpu.causal_plan(sizes=(32, 64), crossover_sizes=(16,))
    out = gpu.causal_stage("cpu", budget_s=75.0, plan=plan)
    assert out["skipped"] == {"fla float32": "not here", "fla bfloat16": "not here"}
    assert not [p for p in out["points"] if p["impl"] == "fla"]
    ran = [p for p in out["points"] if "seconds" in p]
    # 75 s at 10 s a point (the point that raised took none)
    assert len(ran) == 8 and all(p["seconds"] == [1.0, 2.0, 3.0] for p in ran)
    errors = [p for p in out["points"] if "error" in p]
    assert errors == [{"impl": "attend", "n": 32, "dtype": "float32", "pass": "forward",
                       "error": "RuntimeError: planted", "wall_s": 0.0}]
    assert all(p["wall_s"] == 10.0 for p in ran)  # each point's whole cost, warm-up included
    assert out["triton_f32_default"] == gpu.F32_DEFAULT == "tf32x3"  # fla-core at float32 accuracy too
    assert out["not_run"] and out["not_run"][-1] == {"impl": "attend-stable", "n": 64, "dtype": "float32",
                                                             "pass": "forward+backward"}  # the largest N runs last
    json.dumps(out)
    # an error of maskbench's own fails the run; a skipped peer does not
    assert gpu.failures({"causal": out}) == ["1 causal comparison point(s) of maskbench raised: attend N = 32 float32 "
                                             "forward"]


def test_crossing_interpolates_in_log_n():
    sizes = [2**11, 2**12, 2**13, 2**14]
    assert gpu.crossing(sizes, [4.0, 2.0, 1.0, 0.5]) == pytest.approx(2**13)  # 1.0 is not faster yet
    # between 2^13 (1.25) and 2^14 (0.5): log2 N = 13 + log 1.25 / (log 1.25 - log 0.5)
    import math
    want = 2 ** (13 + math.log(1.25) / (math.log(1.25) - math.log(0.5)))
    assert gpu.crossing(sizes, [4.0, 2.0, 1.25, 0.5]) == pytest.approx(want)
    assert gpu.crossing(sizes, [0.9, 0.8, 0.7, 0.5]) == "below"
    assert gpu.crossing(sizes, [4.0, 2.0, 0.5, 1.5]) is None  # slower again at the largest N: no crossover
    want = 2 ** (12 + math.log(2) / (math.log(2) - math.log(0.9)))  # the last crossing, not the first
    assert gpu.crossing(sizes, [0.5, 2.0, 0.9, 0.8]) == pytest.approx(want)


def test_causal_summary_ratios_and_crossover_interval():
    pts = [{"impl": "maskbench", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [1.0, 2.0, 3.0]},
           {"impl": "attend", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [1.0, 1.0, 1.0]},
           {"impl": "fla", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [3.0, 3.0, 3.0]},
           {"impl": "favor", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [2.5, 2.6, 2.7]},
           {"impl": "attend-stable", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [1.4, 1.5, 1.6]},
           {"impl": "favor-decayed", "n": 64, "dtype": "float32", "pass": "forward", "seconds": [3.0, 3.9, 4.0]},
           {"impl": "maskbench", "n": 128, "dtype": "float32", "pass": "forward", "error": "x"}]
    for n, fav, sdp in ((2**11, 2.0, 1.0), (2**12, 2.0, 4.0)):
        pts += [{"impl": impl, "n": n, "dtype": "bfloat16", "pass": "forward", "seconds": [t * 0.9, t, t * 1.1]}
                for impl, t in (("favor", fav), ("sdpa-flash", sdp))]
    got = gpu.causal_summary(pts)
    assert got["vs_fla"] == [{"n": 64, "dtype": "float32", "pass": "forward", "fla_s": 3.0, "maskbench_s": 2.0,
                              "fla_over_maskbench": 1.5, "attend_s": 1.0, "fla_over_attend": 3.0}]
    assert got["favor_vs_given"] == [{"n": 64, "pass": "forward", "favor_s": 2.6, "given_s": 2.0,
                                      "favor_over_given": pytest.approx(1.3)}]
    assert got["stable_vs_plain"] == [{"n": 64, "pass": "forward", "stable_s": 1.5, "plain_s": 1.0,
                                       "stable_over_plain": 1.5}]
    assert got["decayed_vs_favor"] == [{"n": 64, "pass": "forward", "decayed_s": 3.9, "favor_s": 2.6,
                                        "decayed_over_favor": pytest.approx(1.5)}]
    cross = got["crossover"]["forward"]
    assert cross["sizes"] == [2**11, 2**12] and cross["favor_over_sdpa"] == pytest.approx([2.0, 0.5])
    assert cross["n"] == pytest.approx(2**11.5)  # log ratio +log 2 to -log 2: halfway in log N
    lo, hi = cross["interval"]
    assert 2**11 < lo < cross["n"] < hi < 2**12
    assert "forward+backward" not in got["crossover"]


def test_causal_stage_runs_end_to_end_on_the_cpu(monkeypatch):
    """The real runners at a small shape: maskbench's points time, fla-core skips with its reason (a
    GPU peer), and the summary holds the FAVOR+ ratio (SDPA flash may or may not run on this CPU)."""
    monkeypatch.setattr(gpu, "CAUSAL_SHAPE", (1, 2, 16, 16))
    out = gpu.causal_stage("cpu", budget_s=120.0, plan=gpu.causal_plan(sizes=(64,), crossover_sizes=(32, 64)),
                           rounds=1)
    assert not [p for p in out["points"] if "error" in p], out["points"]
    assert {p["impl"] for p in out["points"]} >= {"maskbench", "attend", "attend-stable", "favor", "favor-decayed"}
    assert [(r["n"], r["pass"]) for r in out["summary"]["decayed_vs_favor"]] == [(64, p) for p in gpu.PASSES]
    assert [(r["n"], r["pass"]) for r in out["summary"]["stable_vs_plain"]] == [(64, p) for p in gpu.PASSES]
    assert "needs --device cuda" in out["skipped"]["fla float32"]
    assert [(r["n"], r["pass"]) for r in out["summary"]["favor_vs_given"]] == [(64, p) for p in gpu.PASSES]
    assert all(r["favor_over_given"] > 0 for r in out["summary"]["favor_vs_given"])
    json.dumps(out)


def test_checks_stage_runs_untimed_shards_side_by_side_then_the_timed_families_alone(tmp_path, monkeypatch):
    """On CUDA with 16 cores: four --shard processes over everything but complexity/ and scale/
    (each with a quarter of the cores), then one process of those two families; the results come
    back in the selection's order whichever process wrote them, and a killed process is a timeout."""
    untimed, timed = gpu.check_groups()
    assert untimed and timed and all(i.startswith(gpu.TIMED_FAMILIES) for i in timed)
    assert not any(i.startswith(gpu.TIMED_FAMILIES) for i in untimed)
    calls = []

    def fake_child(cmd, timeout, echo=True, env=None, label=""):
        calls.append((cmd, timeout, env, label))
        out = Path(cmd[cmd.index("--json") + 1])
        if "--shard" in cmd:
            i, k = map(int, cmd[cmd.index("--shard") + 1].split("/"))
            ids = untimed[i - 1::k]
        elif label == "checks timed":
            ids = timed
        else:  # the one untimed process of a selection too small to split
            ids = gpu.check_groups(tuple(cmd[i + 1] for i, a in enumerate(cmd) if a == "--only"))[0]
        out.write_text(json.dumps([{"id": x, "status": "pass"} for x in reversed(ids)]))
        return gpu.Child(cmd, -9 if label == "checks timed" else 0, 1.0, label == "checks timed", "tail")

    monkeypatch.setattr(gpu, "run_child", fake_child)
    monkeypatch.setattr(gpu.os, "cpu_count", lambda: 16)
    stage = gpu.checks_stage(tmp_path, "cuda", 100.0, echo=False)
    shards = [c for c in calls if "--shard" in c[0]]
    assert sorted(c[0][c[0].index("--shard") + 1] for c in shards) == ["1/4", "2/4", "3/4", "4/4"]
    for cmd, limit, env, _ in shards:
        assert cmd.count("--exclude") == 2 and "complexity/" in cmd and "scale/" in cmd
        assert env["OMP_NUM_THREADS"] == "4" and limit == pytest.approx(100.0 * gpu.UNTIMED_SHARE)
    last = calls[-1][0]
    assert "--shard" not in last and "complexity/" not in last and "scale/" not in last
    assert [r["id"] for r in stage["results"]] == untimed + timed
    assert json.loads((tmp_path / "gpu-verify.json").read_text()) == stage["results"]
    assert stage["timed_out"] and stage["returncode"] == -9 and len(stage["children"]) == 5
    calls.clear()
    stage = gpu.checks_stage(tmp_path, "cuda", 100.0, echo=False, only=("equivalence/causal",))
    assert len(calls) == 1 and "--shard" not in calls[0][0] and calls[0][1] == 100.0
    assert [r["id"] for r in stage["results"]] == gpu.check_groups(("equivalence/causal",))[0]


def _fla_installed(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "fla" else real(name, *a))


def test_no_warm_child_without_cuda_or_fla(tmp_path, monkeypatch):
    assert gpu.start_warm("cpu", tmp_path) is None
    if importlib.util.find_spec("fla") is None:
        assert gpu.start_warm("cuda", tmp_path) is None
    _fla_installed(monkeypatch)
    assert gpu.start_warm("cpu", tmp_path) is None


def test_warm_children_are_waited_for_then_killed(tmp_path, monkeypatch):
    """One child per dtype, side by side, each with the run's TRITON_F32_DEFAULT; the record is
    None while one runs on, and the worst status once all ended."""
    _fla_installed(monkeypatch)
    warm = gpu.start_warm("cuda", tmp_path, codes=[
        "import os; print('warm:', os.environ['TRITON_F32_DEFAULT'], flush=True)",
        "import os, time; print('warm:', os.environ['TRITON_F32_DEFAULT'], flush=True); time.sleep(600)"])
    got = gpu.finish_warm(warm, 1.0)  # the second still running: left running
    assert got["returncode"] is None and warm.running()
    got = gpu.finish_warm(warm, 0.0, kill=True)
    assert got["returncode"] not in (None, 0) and not warm.running()  # killed: the worst status
    want = f"warm: {os.environ.get('TRITON_F32_DEFAULT', gpu.F32_DEFAULT)}"
    assert got["tail"] == f"{want}\n{want}"
    assert [log.name for log in warm.logs] == [f"gpu-warm-{dtype}.log" for dtype in gpu.WARM_DTYPES]


def test_warm_children_split_the_dtypes(tmp_path, monkeypatch):
    """By default each dtype gets its own child calling warm_fla with that dtype alone."""
    _fla_installed(monkeypatch)
    calls = []

    class Proc:
        def __init__(self, argv, **kw):
            calls.append(argv[-1])

    monkeypatch.setattr(gpu.subprocess, "Popen", Proc)
    gpu.start_warm("cuda:0", tmp_path)
    assert calls == [f"from measure.gpu import warm_fla; warm_fla('cuda:0', ({dtype!r},))" for dtype in gpu.WARM_DTYPES]


def test_collect_waits_for_the_warm_child_before_the_causal_stage(tmp_path, monkeypatch):
    """The warm child starts with the run; the causal stage starts only after it ended (here at
    once), and the run records it."""
    _fla_installed(monkeypatch)
    marker = tmp_path / "warmed"
    real_start = gpu.start_warm
    monkeypatch.setattr(gpu, "start_warm", lambda device, work: real_start(
        device, work, codes=[f"import pathlib, time; time.sleep(1); pathlib.Path({str(marker)!r}).touch(); print('ok')"]))
    monkeypatch.setattr(gpu, "cuda_environment", lambda device: {"device": device})
    seen = {}

    def causal(device, limit, progress):
        seen["warmed"] = marker.exists()
        return {"points": []}

    monkeypatch.setattr(gpu, "causal_stage", causal)
    run = gpu.collect("cuda", tmp_path / "gpu.json", budget_s=100.0, skip=("tests", "checks", "sweeps", "peers"),
                      echo=False)
    assert seen == {"warmed": True} and run["warm"]["returncode"] == 0 and run["warm"]["tail"] == "ok"


def test_a_verify_process_that_ends_early_fails_the_run():
    """A shard that exits 2 (bad arguments) or is killed by the system leaves checks missing, not
    passed; a failed or inconclusive check (1, 3) is in the results, and a timeout says so itself."""
    assert gpu.failures({"checks": {"returncode": 2, "results": []}}) == [
        "a verify process exited with status 2 (see the checks stage's output)"]
    assert gpu.failures({"checks": {"returncode": 3, "results": [{"id": "x/y", "status": "inconclusive"}]}}) == []
    assert gpu.failures({"checks": {"returncode": -9, "timed_out": True, "results": []}}) == [
        "the checks stage ran out of its time and was stopped"]
