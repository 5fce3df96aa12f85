"""The distributed section (reports.sections.distributed) from a synthetic results.schema
DistributedScaling record: efficiencies and their ranges, the bytes table's flatness, the
oversubscription note, both figures, the JSON round trip, and a run without the record. Every
number comes from a formula here; nothing is measured."""
from __future__ import annotations

from reports.page import render_page
from reports.sections import PageInputs
from reports.sections.distributed import bytes_rows, draw, scaling_rows, view
from results.check import CheckResult
from results.schema import CommunicationPoint, DistributedScaling, Results, ScalingPoint
from tests.reports.synthetic import make_results

PNG = b"\x89PNG\r\n\x1a\n"


def make_scaling(cpus: int = 2, grow: bool = False) -> DistributedScaling:
    """Weak: 1, 1.25, 2.5 s medians; strong: 4, 2.5, 2 s; each repeat x 0.9, 1, 1.2. Bytes 1088
    per rank at every N (or doubling with N where ``grow``)."""
    pts = []
    for kind, meds in (("weak", (1.0, 1.25, 2.5)), ("strong", (4.0, 2.5, 2.0))):
        for world, m in zip((1, 2, 4), meds):
            secs = [0.9 * m, m, 1.2 * m]
            pts.append(ScalingPoint(kind, world, 2**16 * world if kind == "weak" else 2**18, secs, m, min(secs),
                                    max(secs)))
    for kind in ("weak", "strong"):
        base = next(p for p in pts if p.kind == kind and p.world == 1)
        for p in pts:
            if p.kind == kind and p.world > 1:
                scale = 1 if kind == "weak" else p.world
                p.efficiency = base.median / (scale * p.median)
                p.efficiency_low = base.low / (scale * p.high)
                p.efficiency_high = base.high / (scale * p.low)
    comm = [CommunicationPoint(f, w, n, [1088 * (n // 2**12 if grow else 1)] * w)
            for f in ("favor", "favor-causal") for w in (2, 4) for n in (2**12, 2**15, 2**18)]
    return DistributedScaling("quick", "sharded_favor_attention", {"B": 1, "H": 2, "m": 32, "d": 32}, [1, 2, 4],
                              2**16, 2**18, 3, 1, cpus, pts, comm, None, "no CUDA device on this machine", 12.5,
                              [3.5, 3.9], {"weak": [0.8, 0.7, 0.9], "strong": [3.0, 3.2, 3.1]})


def _section(page: str) -> str:
    return page[page.index('<section id="distributed"'):page.index('<section id="gpu"')]


def test_scaling_rows_efficiencies_and_ranges():
    rows = {(r["kind"], r["world"]): r for r in scaling_rows(make_scaling())}
    assert rows["weak", "1"]["efficiency"] == "–"
    assert rows["strong", "one process"]["median"] == "3.1 s" and rows["weak", "one process"]["range"] == "700 ms – 900 ms"
    assert rows["weak", "2"]["efficiency"] == "0.80 [0.60, 1.07]"  # 1 / 1.25; 0.9 / 1.5; 1.2 / 1.125
    assert rows["strong", "4"]["efficiency"] == "0.50 [0.38, 0.67]"  # 4 / 8; 3.6 / 9.6; 4.8 / 7.2
    assert rows["weak", "4"]["shared"] == "yes" and rows["weak", "2"]["shared"] == "no"


def test_bytes_rows_flat_and_not_flat():
    assert all(r["flat"] and r["ratio"] == "1.00" for r in bytes_rows(make_scaling()))
    grown = bytes_rows(make_scaling(grow=True))
    assert not any(r["flat"] for r in grown) and grown[0]["ratio"] == "64.00"


def test_page_section_figures_and_oversubscription(tmp_path):
    r = make_results()
    r.distributed = make_scaling(cpus=2)
    r.checks = (r.checks or []) + [CheckResult("distributed/linear", "t", "issue 26", "equivalence", "pass", 0.02, 1.0,
                                               details={"worst": "4 ranks, rank 3, float32 out"})]
    figures = draw(PageInputs(r), tmp_path, print)
    for name in figures.values():
        assert (tmp_path / name).read_bytes().startswith(PNG)
    section = _section(render_page(r, {"variants": {}, **figures}))
    assert "What this machine can and cannot show" in section and "distributed/linear" in section
    assert "load average was 3.5 and 3.9" in section
    assert "as\nmeasured here at every N" in section and "torchrun" in section
    r.distributed = make_scaling(cpus=8, grow=True)
    section = _section(render_page(r, {"variants": {}, **draw(PageInputs(r), tmp_path, print)}))
    assert "What this machine can and cannot show" not in section and "some line is not flat" in section


def test_round_trip_and_no_record(tmp_path):
    r = make_results()
    r.distributed = make_scaling()
    back = Results.read(r.write(tmp_path / "results.json"))
    assert back.distributed == r.distributed
    r.distributed = None
    assert view(PageInputs(r), {})["distributed"] is None
    assert draw(PageInputs(r), tmp_path, print) == {"scaling": None, "bytes": None}
    assert "This run recorded no scaling measurement" in _section(render_page(r, {"variants": {}}))
    d = r.to_dict()
    d.pop("distributed")
    assert Results.from_dict(d).distributed is None
