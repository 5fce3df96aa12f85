"""The FAVOR+ section's accuracy part (reports.sections.favor): the figure of FAVOR+ attention's error
against exact softmax vs the q, k scale and m, the sentence on where it is accurate, the table, and a
run without the record. Every number comes from a formula here; nothing measures."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from reports import style
from reports.page import render_page
from reports.sections import PageInputs
from reports.sections.favor import accurate_range, plot_favor_accuracy, view
from results.schema import FavorAccuracy, FavorAccuracyCurve, Results

PNG = b"\x89PNG\r\n\x1a\n"
STD = [0.0625, 0.125, 0.25, 0.5, 1.0]
M = [16, 64, 128, 256, 512]


def _error(mask: str, m: int, std: float) -> float:
    # the shape measured at d = 64: ~ exp(c std^2) / sqrt(m), causal a little lower
    return (0.9 if mask == "causal" else 1.0) * (std / 0.25) ** 1.5 * (16 / m) ** 0.5 * (1 + 8 * std ** 3)


def make_accuracy() -> FavorAccuracy:
    curves = [FavorAccuracyCurve(mask, m, [_error(mask, m, s) for s in STD], [1.1 * _error(mask, m, s) for s in STD])
              for mask in ("none", "causal") for m in M]
    return FavorAccuracy(64, 1024, 4, True, STD, M, curves)


def _section(page: str) -> str:
    return page[page.index('<section id="favor"'):page.index("</section>", page.index('<section id="favor"'))]


def test_accurate_range_per_m():
    rows = accurate_range(make_accuracy())
    assert [r["m"] for r in rows] == M
    by_m = {r["m"]: r["std"] for r in rows}
    # under 10% for both masks: m = 16 at no std (0.125 at std 0.0625), m = 512 up to 0.125
    assert by_m[16] is None
    for m, std in by_m.items():
        if std is not None:
            assert all(_error(k, m, std) < 0.1 for k in ("none", "causal"))
            nxt = STD.index(std) + 1
            assert nxt == len(STD) or _error("none", m, STD[nxt]) >= 0.1
    assert by_m[512] is not None and by_m[512] >= by_m[64]


def test_figure_draws_without_overlaps(tmp_path, monkeypatch):
    saved = []
    real_save = style.save

    def keep(fig, out_dir, name):
        text_overlaps = getattr(style, "text_overlaps", None)
        if text_overlaps is not None:  # the figure layout test's helper (issue 23)
            saved.append(text_overlaps(fig))
        return real_save(fig, out_dir, name)

    monkeypatch.setattr(style, "save", keep)
    name = plot_favor_accuracy(make_accuracy(), tmp_path)
    assert name == "favor_accuracy.png" and (tmp_path / name).read_bytes()[:8] == PNG
    assert all(found == [] for found in saved), saved
    assert plot_favor_accuracy(None, tmp_path) is None
    plt.close("all")


def test_section_states_the_range_and_the_table():
    acc = make_accuracy()
    page = render_page(Results({"mode": "quick"}, favor_accuracy=acc), {"favor_accuracy": "favor_accuracy.png"})
    section = _section(page)
    assert 'src="favor_accuracy.png"' in section
    assert "Where FAVOR+ is accurate" in section and "m = 16: at no std measured" in section
    v = view(PageInputs(Results({}, favor_accuracy=acc)), {})
    best = max(r["std"] for r in v["accurate"] if r["std"] is not None)
    assert v["accurate_logit_std"] == pytest.approx(best ** 2)
    lo, hi = v["accuracy_top"]
    assert lo == pytest.approx(min(_error(k, m, 1.0) for k in ("none", "causal") for m in M))
    assert hi == pytest.approx(max(_error(k, m, 1.0) for k in ("none", "causal") for m in M))
    # the table: one row per m, one cell per std, "none / causal"
    assert section.count("<tr><td class=\"num\">") == len(M)
    first = f"{_error('none', 16, STD[0]):.2g} / {_error('causal', 16, STD[0]):.2g}"
    assert first in section


def test_section_without_the_record():
    section = _section(render_page(Results({"mode": "quick"}), {}))
    assert "recorded no FAVOR+ accuracy experiment" in section
