"""measure.distributed (issue 26 item 3): the scaling points' arithmetic (slowest rank per repeat,
efficiency and its range from the extremes), and a small real run on 1 and 2 gloo ranks whose
bytes per rank do not grow with N."""
from __future__ import annotations

import pytest

from measure.distributed import _point, scaling
from verify.sharding import available


def test_point_takes_the_slowest_rank_and_its_efficiency_range():
    base = _point("strong", 1, 64, [[4.0, 3.6, 4.8]], None)
    assert (base.median, base.low, base.high, base.efficiency) == (4.0, 3.6, 4.8, None)
    # rank 1 is the slower one in the first two repeats
    p = _point("strong", 2, 64, [[2.0, 1.9, 2.5], [2.2, 2.0, 2.1]], base)
    assert p.seconds == [2.2, 2.0, 2.5] and p.median == 2.2
    assert p.efficiency == pytest.approx(4.0 / (2 * 2.2))
    assert p.efficiency_low == pytest.approx(3.6 / (2 * 2.5)) and p.efficiency_high == pytest.approx(4.8 / (2 * 2.0))
    weak = _point("weak", 2, 128, [[1.0, 1.0, 1.0]], _point("weak", 1, 64, [[0.5, 0.5, 0.5]], None))
    assert weak.efficiency == pytest.approx(0.5)  # weak: t(1) / t(P), no factor P


@pytest.mark.skipif("favor" not in available(), reason="fast.distributed has no sharded_favor_attention here")
def test_a_small_run_has_flat_bytes_per_rank():
    res = scaling(True, worlds=(1, 2), tokens_per_rank=256, strong_n=512, bytes_ns=(256, 2048, 16384),
                  bytes_worlds=(2,))
    assert [(p.kind, p.world, p.n) for p in res.points] == [("weak", 1, 256), ("strong", 1, 512), ("weak", 2, 512),
                                                             ("strong", 2, 512)]
    assert all(len(p.seconds) == res.repeats and p.low <= p.median <= p.high for p in res.points)
    assert res.point("weak", 2).efficiency is not None and res.point("weak", 1).efficiency is None
    assert {k: len(v) for k, v in res.single_process.items()} == {"weak": res.repeats, "strong": res.repeats}
    for func in ("favor", "favor-causal"):
        sent = [c.bytes_per_rank for c in res.communication if c.function == func]
        assert len(sent) == 3 and all(len(b) == 2 and min(b) > 0 for b in sent)
        assert len({tuple(b) for b in sent}) == 1  # the same bytes at every N


def test_pipeline_runs_the_stage_unless_skipped_or_only(monkeypatch):
    """collect() with every other stage replaced: the record lands in Results.distributed and its
    time in stage_seconds; --skip-distributed and --only leave it out; a raising stage is recorded."""
    from measure import stages
    from measure.cli import parse_args
    from measure.pipeline import Options, collect
    from results.schema import DistributedScaling, Results

    fake = DistributedScaling("quick", "f", {"H": 1}, [1, 2], 4, 8, 1, 1, 2)
    for name in ("favor_stage", "favor_accuracy_stage", "gallery_stage", "training_stage"):
        monkeypatch.setattr(stages, name, lambda *a, **k: None)
    monkeypatch.setattr(stages, "sweeps_stage", lambda *a, **k: ([], []))
    monkeypatch.setattr(stages, "distributed_stage", lambda quick, status=None: fake)
    base = {"quick": True, "skip_memory": True, "skip_verify": True, "skip_peers": True, "skip_history": True,
            "skip_training": True, "progress": False, "argv": []}
    res = collect(Options(**base))
    assert res.distributed is fake and "distributed" in res.stage_seconds
    assert Results.from_dict(res.to_dict()).distributed == fake
    assert collect(Options(**base, skip_distributed=True)).distributed is None
    only = collect(Options(**base, only=["linear"]))
    assert only.distributed is None and "distributed" not in only.stage_seconds
    monkeypatch.setattr(stages, "distributed_stage", lambda *a, **k: 1 / 0)
    assert "ZeroDivisionError" in collect(Options(**base)).environment["stage_errors"]["distributed"]
    assert parse_args(["--quick", "--skip-distributed"])[0].skip_distributed is True
    assert parse_args(["--quick"])[0].skip_distributed is False
