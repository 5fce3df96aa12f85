"""verify/checks/scale.py: scale/<id> and scale/<id>-train are generated from the registry flags,
and judged from the child's report (faked here: the real run needs N = 2^20)."""
from __future__ import annotations

import dataclasses

import pytest

from verify import registry
from verify.checks import scale as S
from verify.mechanisms import get, mechanisms
from verify.result import Context


def test_checks_follow_the_registry_flags():
    ids = [c.id for c in S.checks()]
    want = []
    for m in mechanisms():
        want += [f"scale/{m.id}"] * m.scale + [f"scale/{m.id}-train"] * m.scale_train
    assert ids == want
    assert {"scale/linear", "scale/causal", "scale/block-toeplitz", "scale/tree-exp", "scale/linear-train",
            "scale/causal-train", "scale/block-toeplitz-train"} == set(ids)
    for c in S.checks():
        assert (c.kind, c.compare, c.unit, c.threshold) == ("scale", "<=", "bytes", S.DENSE_BYTES / 1000)
        assert c.source == get(c.id.split("/")[1].removesuffix("-train")).source
        assert ("forward + backward" in c.title) == c.id.endswith("-train")


def test_a_newly_flagged_record_gets_its_checks(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(dataclasses.replace(get("packing"), id="packing-copy", scale=True, scale_train=True))
    ids = [c.id for c in S.checks()]
    assert ids[-2:] == ["scale/packing-copy", "scale/packing-copy-train"]


def _report(peak=2**28, finite=True, shape=(S.N, 16), first=3.0, second=2.0, train=False):
    return {"mechanism": "x", "n": S.N, "setup_s": 1.0, "first_s": first, "second_s": second,
            "calls_s": [first, second], "baseline_rss": 10**8, "after_setup_rss": 2 * 10**8,
            "peak_rss": 10**8 + peak, "peak_reset_after_setup": True, "finite": finite, "shape": list(shape),
            "threads": 1, "device": "cpu", "train": train}


def _fake_worker(monkeypatch, report, log=None):
    def worker(mech_id, n, *, device, seed, calls, train, timeout):
        if log is not None:
            log.append(dict(mech_id=mech_id, n=n, device=device, seed=seed, calls=calls, train=train))
        return {**report, "train": train}

    monkeypatch.setattr(S, "run_worker", worker)


@pytest.mark.parametrize("check_id, train", [("scale/causal", False), ("scale/causal-train", True)])
def test_pass_and_the_worker_call(monkeypatch, check_id, train):
    calls = []
    _fake_worker(monkeypatch, _report(), calls)
    check = next(c for c in S.checks() if c.id == check_id)
    r = check.evaluate(Context(quick=True, seed=3))
    assert calls == [dict(mech_id="causal", n=S.N, device="cpu", seed=3, calls=1, train=train)]
    assert r.status == "pass" and r.statistic == 2**28 <= r.threshold and r.unit == "bytes"
    assert r.details["train"] is train and r.details["call_s"] == 2.0 and r.details["reasons"] == []
    assert r.details["calls_s"] == [3.0, 2.0]  # the timings
    check.evaluate(Context(quick=False))
    assert calls[-1]["calls"] == 2


@pytest.mark.parametrize("report, words", [
    (_report(peak=5 * 2**30), ["peak memory 5.00 GiB > 4.10 GiB"]),
    (_report(finite=False), ["non-finite"]),
    (_report(shape=(1000, 16)), ["lacks N=1048576"]),
    (_report(first=400.0, second=350.0), ["took 350.0 s > 300.0 s"]),
    (_report(peak=5 * 2**30, first=400.0, second=350.0, finite=False), ["non-finite", "peak memory", "took 350.0 s"]),
])
def test_every_failure_reason(monkeypatch, report, words):
    _fake_worker(monkeypatch, report)
    r = S.check_for(get("linear"), train=True).evaluate(Context())
    assert r.status == "fail" and len(r.details["reasons"]) == len(words)
    for reason, word in zip(r.details["reasons"], words):
        assert word in reason
    assert "forward + backward" in r.details["statistic"]


def test_uses_the_one_memory_helper(monkeypatch):
    import verify.memory as memory

    seen = {}

    def fake(mech_id, n, **kw):
        seen.update(kw, mech_id=mech_id, n=n)
        return _report()

    monkeypatch.setattr(memory, "run_scale_worker", fake)
    S.run_worker("linear", 8, device="cpu", seed=0, calls=1, train=True, timeout=5.0)
    assert seen == dict(mech_id="linear", n=8, device="cpu", seed=0, calls=1, train=True, timeout=5.0)
