"""measure/scale_worker.py as the scale checks use it: one serving child for every check of a run
(``--serve``, WorkerSession), the problems of the last mechanism kept for its -train check, the
CUDA protocol (a warm-up call at every N, synchronised starts, >= CUDA_MIN_CALLS timed calls, the
GPU peak) beside the CPU one. The device-dependent tests run on "cpu" and on "cuda" when there is one."""
from __future__ import annotations

import copy
import dataclasses
import io
import json
import time

import numpy as np
import pytest
import torch

from measure import scale_worker as W
from verify import registry
from verify.favor import favor_tensors
from verify.mechanisms import get, mechanisms

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
#: CPU seconds the first call of each FIRST_CALL_SLOW runner spins (a one-off cost, as a cuFFT plan).
ONE_OFF_S = 0.3


def _first_call_slow_setup(problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)
    state = {"first": True}

    def runner() -> torch.Tensor:
        if state["first"]:  # one-off cost of a new size, no work of the call
            state["first"] = False
            start = time.process_time()
            while time.process_time() - start < ONE_OFF_S:
                pass
        return v * 1.0

    return runner


#: A record whose first call per set-up pays ONE_OFF_S of CPU (loaded by module:attribute).
FIRST_CALL_SLOW = dataclasses.replace(get("linear"), id="first-call-slow", fast_setup=_first_call_slow_setup,
                                      dense_setup=None, title="first call per set-up spins (test record)")
SPEC = f"{__name__}:FIRST_CALL_SLOW"


def _serve(lines: list[list[str]], capsys) -> list[dict]:
    """Run the serving loop in this process on ``lines`` (argv lists); its replies."""
    assert W.serve(requests=io.StringIO("".join(json.dumps({"argv": a}) + "\n" for a in lines))) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_serving_builds_each_problem_once_for_forward_and_train(monkeypatch, capsys):
    """scale/<id> then scale/<id>-train in one child: the second request builds no problem (the
    warm-up size, the references and N all come from the cache), after which they are dropped."""
    built = []
    original = registry.Mechanism.problem

    def counting(self, n, seed, variant=None, batch=()):
        built.append((self.id, n))
        return original(self, n, seed, variant, batch)

    monkeypatch.setattr(registry.Mechanism, "problem", counting)
    args = ["256", "--calls", "1", "--reference", "64", "128"]
    replies = _serve([["linear", *args], ["linear", *args, "--train"], ["causal", *args], ["linear", *args]], capsys)
    assert [r["report"]["problem_reused"] for r in replies] == [False, True, False, False]
    assert [r["report"]["train"] for r in replies] == [False, True, False, False]
    assert all(r["report"]["problem_s"] >= 0 and r["report"]["reference_s"] > 0 for r in replies)
    if replies[0]["report"]["peak_reset_after_setup"]:  # Linux: one child serves them all
        assert not any(r["exiting"] for r in replies)
    # built once for scale/linear and scale/linear-train, then dropped (the train request is the last user)
    linear = [n for m, n in built if m == "linear"]
    assert sorted(linear) == sorted(2 * sorted(set(linear))) and {64, 128, 256} <= set(linear), built
    assert {n for m, n in built if m == "causal"} >= {64, 128, 256}


def test_serving_answers_an_error_and_ends(capsys):
    replies = _serve([["linear", "0"], ["linear", "64", "--calls", "1"]], capsys)
    assert len(replies) == 1 and replies[0]["exiting"] and "invalid arguments" in replies[0]["error"]


def test_a_session_serves_in_one_child_and_recovers_from_failures_and_stops():
    """Real children: a bad request fails naming the mechanism (that child ends), a call stopped by
    the watchdog still reports (that child ends too), and then one fresh child serves both of
    linear's requests, the second from its cache."""
    from tests.verify import planted_mechanisms

    s = W.WorkerSession()
    try:
        with pytest.raises(RuntimeError, match="linear at N=0"):
            s.request(W.worker_argv("linear", 0), 120, "linear at N=0")
        start = time.perf_counter()
        rep = s.request(W.worker_argv("tests.verify.planted_mechanisms:BUSY", 256, calls=2, budget=0.5), 120, "busy")
        assert time.perf_counter() - start < planted_mechanisms.BUSY_S / 2
        assert rep["stopped"] and rep["stopped_in"] == "call" and rep["timed_s"] == [] and s.proc is None
        first = s.request(W.worker_argv("linear", 256, calls=1, reference=[64, 128]), 120, "linear")
        second = s.request(W.worker_argv("linear", 256, calls=1, train=True, reference=[64, 128]), 120, "linear")
        assert first["finite"] and second["finite"] and second["train"] and second["shape"][-2] == 256
        assert (first["problem_reused"], second["problem_reused"]) == (False, True)
        assert s.started == 3 if first["peak_reset_after_setup"] else s.started == 4
    finally:
        s.close()
    assert s.proc is None


def test_run_worker_times_out_and_kills_the_child():
    import subprocess

    s = W.WorkerSession()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            s.request(W.worker_argv("tests.verify.planted_mechanisms:BUSY", 64, calls=1), 3.0, "busy")
        assert s.proc is None
    finally:
        s.close()


@pytest.mark.parametrize("device", DEVICES)
def test_the_timing_protocol_of_each_device(device, capsys):
    """CPU: the calls asked for, CPU seconds, the first call's one-off cost inside the timed call
    (an upper bound). CUDA: a warm-up call at every N takes the one-off cost, >= CUDA_MIN_CALLS
    synchronised calls on the wall clock, and the GPU's peak over its pre-set-up baseline."""
    assert W.main([SPEC, "512", "--device", device, "--calls", "1", "--reference", "128", "256"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ref = rep["reference"]
    if device == "cpu":
        assert rep["clock"] == "cpu" and rep["warmup_s"] is None and len(rep["timed_s"]) == 1
        assert rep["timed_s"][0] >= ONE_OFF_S and min(min(r) for r in ref["calls_s"]) >= ONE_OFF_S
        assert rep["cuda_baseline_allocated"] is None and "cuda_max_allocated" not in rep
    else:
        assert rep["clock"] == "wall" and rep["warmup_s"] >= ONE_OFF_S
        assert len(rep["timed_s"]) >= W.CUDA_MIN_CALLS and max(rep["timed_s"]) < ONE_OFF_S
        assert all(len(r) >= W.CUDA_MIN_CALLS and max(r) < ONE_OFF_S for r in ref["calls_s"])
        assert rep["cuda_max_allocated"] >= rep["cuda_baseline_allocated"] >= 0
        assert rep["cuda_max_allocated"] > 0  # q, k, v and the output live on the GPU


def _arrays(problem) -> dict:
    out = {name: getattr(problem, name) for name in ("q", "k", "v", "projection")}
    out.update({f"extras.{k}": v for k, v in problem.extras.items()})
    return out


@pytest.mark.parametrize("mech_id", sorted({m.id for m in mechanisms() if m.scale or m.scale_train}))
@pytest.mark.parametrize("device", DEVICES)
def test_fast_setup_never_writes_into_its_problem(mech_id, device):
    """The serving child hands scale/<id>-train the problem scale/<id> ran on: set-up and the calls
    (forward; forward + backward) must leave every array of it as it was."""
    mech = get(mech_id)
    problem = mech.problem(mech.admissible(300), 0)
    before = copy.deepcopy(_arrays(problem))
    for train in (False, True):
        runner = W._setup(mech, problem, device, train)
        with torch.enable_grad() if train else torch.inference_mode():
            W._call(runner, train, device == "cuda")
    after = _arrays(problem)
    assert after.keys() == before.keys()
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(after[name], value, equal_nan=True), name
        elif isinstance(value, torch.Tensor):
            assert torch.equal(after[name], value), name
        else:
            assert after[name] == value, name
