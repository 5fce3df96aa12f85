"""The mask gallery: every registered dense mask, correct summaries, failures recorded, HTML section."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from reports.data import ReportData
from reports.figures import plot_gallery
from reports.gallery import GALLERY_N, MaskGallery, mask_gallery, mask_panel, restore_matrices, summarise
from reports.html import build_page
from reports.render import write_report
from verify.registry import get, mechanisms

from tests.reports.test_reports import synthetic_data


def _fake(mech_id: str, dense_mask, admissible=None) -> SimpleNamespace:
    """A registry-like record: make_problem(n, seed) -> object with .n."""
    fake = SimpleNamespace(id=mech_id, dense_mask=dense_mask,
                           make_problem=lambda n, seed: SimpleNamespace(n=n, seed=seed))
    if admissible is not None:
        fake.admissible = admissible
    return fake


def _boom(problem):
    raise RuntimeError("mask budget <exceeded> & more")


def _data_with(g: MaskGallery | None, light: bool = False) -> ReportData:
    """The synthetic report data with gallery ``g``; ``light``: no timings, memory or FAVOR (fast to draw)."""
    data = synthetic_data()
    data.gallery = g
    if light:
        data.timings, data.memory, data.favor = {}, {}, None
    return data


def test_gallery_covers_every_registered_dense_mask():
    mechs = mechanisms()
    g = mask_gallery()
    expected = [m.id for m in mechs if m.dense_mask is not None]
    assert expected, "the registry should have at least one dense mask"
    assert [p.id for p in g.panels] == expected
    assert g.without_mask == [m.id for m in mechs if m.dense_mask is None]
    for p in g.panels:
        assert p.error is None, p.error
        assert p.matrix.shape == (p.n, p.n) and p.n <= GALLERY_N
        assert p.min >= 0 and p.max >= p.min and 0 <= p.nonzero_fraction <= 1


@pytest.mark.parametrize("n", [64, 7])
def test_causal_summary_is_exact(n):
    p = mask_panel(get("causal"), n)
    assert p.n == n and p.error is None
    assert p.nonzero_fraction == pytest.approx((n + 1) / (2 * n), abs=0)
    assert (p.min, p.max) == (0.0, 1.0)
    np.testing.assert_array_equal(p.matrix, np.tril(np.ones((n, n))))


def test_summarise_counts_tiny_entries_as_nonzero():
    m = np.array([[1.0, 1e-300], [0.0, 0.5]])
    assert summarise(m) == (0.0, 1.0, 0.75)


def test_admissible_size_is_used_when_present():
    hyper = _fake("hyper", lambda p: np.eye(p.n), admissible=lambda n: 1 << (n.bit_length() - 1))
    plain = _fake("plain", lambda p: np.eye(p.n))
    g = mask_gallery([hyper, plain], n=60)
    assert [(p.id, p.n, p.matrix.shape) for p in g.panels] == [("hyper", 32, (32, 32)), ("plain", 60, (60, 60))]
    assert g.panels[0].nonzero_fraction == pytest.approx(1 / 32)
    page = build_page(_data_with(g), {"gallery": "mask_gallery.png"})
    assert "N = 32: hyper" in page and "N = 60: plain" in page


@pytest.mark.parametrize("mask, message", [
    (_boom, "RuntimeError: mask budget <exceeded> & more"),
    (lambda p: np.ones((p.n, p.n + 1)), "ValueError: dense_mask returned shape"),
    (lambda p: -np.eye(p.n), "ValueError: dense_mask has negative entries"),
    (lambda p: np.full((p.n, p.n), np.nan), "ValueError: dense_mask has 64 non-finite entries"),
])
def test_failing_mask_is_recorded_not_fatal(mask, message):
    good = _fake("good", lambda p: np.ones((p.n, p.n)))
    g = mask_gallery([good, _fake("bad", mask)], n=8)
    bad = g.panels[1]
    assert bad.id == "bad" and bad.matrix is None and bad.error.startswith(message)
    assert bad.min is None and g.errors == [bad]
    assert g.panels[0].error is None and g.panels[0].nonzero_fraction == 1.0
    stored = json.loads(json.dumps(_data_with(g).to_dict()))["mask_gallery"]["panels"][1]
    assert stored["id"] == "bad" and stored["error"].startswith(message)


def test_failing_mask_panel_and_page(tmp_path):
    g = mask_gallery([_fake("good", lambda p: np.ones((p.n, p.n))), _fake("bad", _boom)], n=8)
    assert plot_gallery(g, tmp_path) == "mask_gallery.png"
    assert (tmp_path / "mask_gallery.png").stat().st_size > 1000
    page = build_page(_data_with(g), {"gallery": "mask_gallery.png"})
    # shown, escaped, in plain view (not only inside the collapsed table), with the figure
    assert "dense_mask failed for 1 mechanism(s)" in page and 'src="mask_gallery.png"' in page
    assert "mask budget &lt;exceeded&gt; &amp; more" in page and "<exceeded>" not in page


def test_html_section_and_json_summaries(tmp_path):
    data = _data_with(mask_gallery(), light=True)
    index = write_report(data, tmp_path)
    page = index.read_text()
    assert "<h2>Masks M (gallery)</h2>" in page and 'src="mask_gallery.png"' in page
    assert "out_i = Σ_j M_ij K(q_i, k_j) v_j / Σ_j M_ij K(q_i, k_j)" in page
    assert f"N = {GALLERY_N}" in page and "normalised per panel to [0, max M]" in page
    assert "dense_mask failed" not in page  # no false alarm when every mask builds
    assert (tmp_path / "mask_gallery.png").stat().st_size > 5000
    results = json.loads((tmp_path / "results.json").read_text())
    gj = results["mask_gallery"]
    assert gj["n"] == GALLERY_N
    by_id = {p["id"]: p for p in gj["panels"]}
    assert set(by_id) == {m.id for m in mechanisms() if m.dense_mask is not None}
    assert by_id["causal"]["nonzero_fraction"] == pytest.approx((GALLERY_N + 1) / (2 * GALLERY_N))
    for p in gj["panels"]:  # summaries only: no matrices in the JSON
        assert set(p) == {"id", "n", "min", "max", "nonzero_fraction", "error"}
    assert results["figures"]["gallery"] == "mask_gallery.png"


def test_without_gallery_the_page_says_so():
    data = synthetic_data()
    data.gallery = None
    page = build_page(data, {})
    assert "No mask gallery in this run." in page


def test_restore_matrices_after_json_round_trip():
    g = mask_gallery()
    again = ReportData.from_dict(json.loads(json.dumps(_data_with(g).to_dict()))).gallery
    assert all(p.matrix is None for p in again.panels)
    restore_matrices(again)
    for a, b in zip(again.panels, g.panels):
        np.testing.assert_array_equal(a.matrix, b.matrix)
        assert a.note == ""
    # a stored summary that no longer matches the registry is flagged, not silently redrawn
    tampered = ReportData.from_dict(json.loads(json.dumps(_data_with(g).to_dict()))).gallery
    causal = next(p for p in tampered.panels if p.id == "causal")
    causal.nonzero_fraction = 0.25
    tampered.panels.append(type(causal)("gone-mechanism", 8, 0.0, 1.0, 1.0))
    restore_matrices(tampered)
    assert "differs from results.json" in causal.note
    assert tampered.panels[-1].matrix is None and "not in this checkout's registry" in tampered.panels[-1].note


def test_cli_from_json_draws_gallery(tmp_path):
    from reports.__main__ import main

    data = _data_with(mask_gallery(), light=True)
    data.write_json(tmp_path / "in.json")
    assert main(["--from-json", str(tmp_path / "in.json"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert (tmp_path / "out" / "mask_gallery.png").stat().st_size > 5000
    # an older results.json without a gallery still gets one, with a note
    old = _data_with(None, light=True)
    old.write_json(tmp_path / "old.json")
    assert main(["--from-json", str(tmp_path / "old.json"), "--out", str(tmp_path / "old"), "--no-progress"]) == 0
    page = (tmp_path / "old" / "index.html").read_text()
    assert "results.json had no mask gallery" in page and 'src="mask_gallery.png"' in page
