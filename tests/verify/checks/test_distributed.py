"""distributed/<case> (issue 26): the judging of the ranks' answers (planted answers: exact rows
pass, a float64 error of 1e-9 on one rank, a case that raised, a failed launch each fail and are
named), and the real family on 2 and 4 gloo ranks (passes; about 10-15 s on two cores)."""
from __future__ import annotations

import numpy as np
import pytest

from verify.checks import distributed
from verify.sharding import CASE_IDS, DTYPES, available, single_process



#: the cases whose fast.distributed function this checkout has
AVAILABLE = available()


def _bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    cuts = np.linspace(0, n, world + 1).round().astype(int)
    return int(cuts[rank]), int(cuts[rank + 1])


def _exact_answers(case_id: str, world: int) -> list[dict]:
    """What correct ranks would answer: the one-process rows, cut the way a rank would hold them."""
    single = {dt: single_process(case_id, 0, dt) for dt in DTYPES}
    n = single["float64"]["out"].shape[-2]
    answers = []
    for r in range(world):
        s, e = _bounds(n, r, world)
        cut = {dt: {"out": x["out"].narrow(-2, s, e - s).clone(),
                    "grads": {k: g.narrow(-2, s, e - s).clone() for k, g in x["grads"].items()}}
               for dt, x in single.items()}
        answers.append({"rank": r, "world": world, "bounds": {case_id: (s, e)}, "runs": {case_id: cut},
                        "errors": {}, "bytes": {case_id: {dt: {"forward": 1024, "backward": 512} for dt in DTYPES}}})
    return answers


def test_exact_rows_pass_with_statistic_zero():
    out = distributed.judge("linear", 0, {2: _exact_answers("linear", 2), 4: _exact_answers("linear", 4)})
    assert out.status == "pass" and out.statistic == 0.0
    assert out.details["worlds"][4]["ranks"][3]["bytes_sent"]["float32"] == {"forward": 1024, "backward": 512}


def test_a_planted_error_on_one_rank_fails_and_is_named():
    answers = _exact_answers("favor-causal", 4)
    answers[2]["runs"]["favor-causal"]["float64"]["grads"]["k"] *= 1 + 1e-9  # 1e-9 relative > 1e-12
    out = distributed.judge("favor-causal", 0, {4: answers})
    assert out.status == "fail" and out.statistic == pytest.approx(1e3, rel=1e-3)
    assert out.details["worst"] == "4 ranks, rank 2, float64 grad_k"
    assert any("rank 2, float64 grad_k" in r for r in out.details["reasons"])
    answers = _exact_answers("sgformer", 2)
    answers[1]["runs"]["sgformer"]["float32"]["out"][0, 0] += 1.0  # a wrong row in float32
    assert "rank 1, float32 out" in distributed.judge("sgformer", 0, {2: answers}).details["worst"]


def test_a_case_that_raised_or_a_failed_launch_fails():
    answers = _exact_answers("padding", 2)
    answers[0]["errors"]["padding"] = "Traceback ...\nValueError: planted"
    out = distributed.judge("padding", 0, {2: answers})
    assert out.status == "fail" and "rank 0 raised: ValueError: planted" in out.details["reasons"][0]
    out = distributed.judge("padding", 0, {2: _exact_answers("padding", 2), 4: "rank 3 exited with status 1"})
    assert out.status == "fail" and out.statistic == float("inf")
    assert "4 ranks: the launch failed: rank 3 exited" in out.details["reasons"][0]


def test_ids_are_stable():
    assert [c.id for c in distributed.checks()] == [f"distributed/{cid}" for cid in CASE_IDS]
    assert all(c.quick and c.threshold == 1.0 for c in distributed.checks())


@pytest.mark.skipif(not AVAILABLE, reason="fast.distributed has no sharded function in this checkout")
def test_the_family_passes_on_two_and_four_gloo_ranks():
    """Every case this checkout can run passes; the others are skipped, saying why."""
    from results.check import Context

    results = {c.id: c.evaluate(Context(quick=True, seed=0)) for c in distributed.checks()}
    ran = {f"distributed/{cid}" for cid in AVAILABLE}
    failed = {cid: r.details.get("reasons") for cid, r in results.items() if cid in ran and r.status != "pass"}
    assert not failed
    assert all(r.status == "skip" and "fast.distributed has no" in r.details["reason"]
               for cid, r in results.items() if cid not in ran)
    for r in (results[cid] for cid in ran):
        for world in distributed.WORLDS:
            for rank in r.details["worlds"][world]["ranks"].values():
                assert rank["float64"]["out"] <= distributed.FLOAT64_TOL


@pytest.mark.skipif(not AVAILABLE, reason="fast.distributed has no sharded function in this checkout")
def test_graphs_and_segments_cross_rank_boundaries():
    """Every rank boundary at 2 and 4 ranks falls inside a packing segment, and one graph of the
    node cases spans two boundaries at 4 ranks: the cases test what crosses ranks."""
    from fast.distributed import shard_bounds
    from verify.sharding import GRAPH_SIZES, N_NODES, N_SEQ, SEGMENT_SIZES

    def labels(sizes):
        return np.repeat(np.arange(len(sizes)), sizes)

    seg, graph = labels(SEGMENT_SIZES), labels(GRAPH_SIZES)
    for world in (2, 4):
        for r in range(1, world):
            b = shard_bounds(N_SEQ, r, world)[0]
            assert seg[b - 1] == seg[b]
    cuts = [shard_bounds(N_NODES, r, 4)[0] for r in range(1, 4)]
    assert any(graph[cuts[i] - 1] == graph[cuts[i]] == graph[cuts[i + 1]] for i in range(2))
