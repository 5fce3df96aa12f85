"""Register once, appears everywhere: one record with two variants, registered here and nowhere
else, shows up in verify's results JSON (sweeps per variant, the comparison with its dense twin,
its checks), in the asv suite (time_, peakmem_, track_ benchmarks) and on the rendered page, with
no other edit. This is the harness contract of docs/design.md ("The registry")."""
from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

from results.schema import Results
from verify.mechanisms import get, mechanisms
from verify.registry import Variant, register, unregister

TOY = "toy-once"
GRID = tuple(2**p for p in range(5, 10))


@pytest.fixture
def toy():
    """The linear record under a new id with two variants and small grids (no scale checks)."""
    base = get("linear")
    mech = dataclasses.replace(
        base, id=TOY, title="toy registered by a test",
        variants=(Variant("first", "first variant"), Variant("second", "second variant", params={"tag": 2})),
        fast_sizes=GRID, quick_fast_sizes=GRID, dense_sizes=GRID[:4], quick_dense_sizes=GRID[:4],
        scale=False, scale_train=False)
    register(mech)
    try:
        yield mech
    finally:
        unregister(TOY)


def _reload_asv():
    import asv_bench.accuracy
    import asv_bench.attention
    import asv_bench.complexity

    return [importlib.reload(m) for m in (asv_bench.attention, asv_bench.accuracy, asv_bench.complexity)]


def test_one_record_appears_in_json_asv_and_report(toy, tmp_path):
    from measure.pipeline import Options, collect

    assert TOY in [m.id for m in mechanisms()]

    # verify: measurements and checks of the new record, nothing else asked for
    results = collect(Options(quick=True, only=[TOY], skip_memory=True, progress=False, rounds=1, argv=[]))
    path = results.write(tmp_path / "results.json")
    again = Results.read(path)
    assert [m.id for m in again.mechanisms] == [TOY]
    assert [v.name for v in again.mechanisms[0].variants] == ["first", "second"]
    swept = {(s.variant, s.impl) for s in again.sweeps if s.mechanism == TOY}
    assert swept == {("first", "fast"), ("first", "dense"), ("second", "fast")}
    for s in again.sweeps:
        assert s.sizes == list(GRID if s.impl == "fast" else GRID[:4]) and s.error is None
    assert again.comparison(TOY, "first") is not None
    check_ids = {r.id for r in again.checks}
    assert {f"equivalence/{TOY}", f"complexity/{TOY}"} <= check_ids
    equivalence = next(r for r in again.checks if r.id == f"equivalence/{TOY}")
    assert equivalence.status == "pass"
    assert set(equivalence.details["variants"]) == {"first", "second"}
    assert json.loads(path.read_text())["schema"] == again.schema

    # asv: the generated suite holds the record's benchmarks
    attention, accuracy, complexity = _reload_asv()
    cls = TOY.replace("-", "_")
    try:
        assert hasattr(getattr(attention, cls), "time_attention")
        assert hasattr(getattr(attention, cls), "peakmem_attention")
        assert hasattr(getattr(accuracy, cls), "track_relative_error")
        assert hasattr(getattr(complexity, cls), "track_exponent")
    finally:
        unregister(TOY)
        reloaded = _reload_asv()
        register(toy)  # the fixture unregisters it
    assert not hasattr(reloaded[0], cls)

    # reports: the page renders the record and its two variants from the JSON alone
    from reports.render import write_report

    index = write_report(Results.read(path), tmp_path / "page")
    page = index.read_text()
    assert TOY in page and "first variant" in page and "second variant" in page
    pngs = [p for p in (tmp_path / "page").glob("*.png") if TOY in p.name]
    assert pngs and all(p.stat().st_size > 0 for p in pngs)
