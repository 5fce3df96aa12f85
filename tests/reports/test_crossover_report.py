"""reports.sections.crossover: a crossover interval whose end the timed grid cut off is written and
drawn open ("< 128", "> 4,096"); one inside the grid, or a bound extrapolated beyond it, stays closed."""
from __future__ import annotations

import pytest

from reports.sections.crossover import crossover_text, interval_ends, plot_crossover
from results.schema import Comparison
from tests.reports.synthetic import make_results

GRID = [128, 256, 512, 1024, 2048, 4096]


def comparison(crossover, low, high, sizes=GRID) -> Comparison:
    return Comparison("m", "v", list(sizes), [1.0] * len(sizes), None, crossover, low, high)


@pytest.mark.parametrize("crossover, low, high, text", [
    (1000.0, 800.0, 1300.0, "1,000 [800, 1,300]"),  # inside the grid: closed
    (1085.0, 128.0, 1132.0, "1,085 [< 128, 1,132]"),  # low end at the first N timed (issue 23 item 6)
    (1085.0, None, 1132.0, "1,085 [< 128, 1,132]"),  # low end not bounded
    (3000.0, 2000.0, 4096.0, "3,000 [2,000, > 4,096]"),  # high end at the last N timed
    (3000.0, 2000.0, None, "3,000 [2,000, > 4,096]"),  # curves never met in some replicates
    (2.0e5, 9.0e4, None, "200,000 [90,000, > 200,000]"),  # extrapolated estimate past the grid
    (5000.0, 4800.0, 5200.0, "5,000 [4,800, 5,200]"),  # extrapolated bound past the grid: a bound
    (128.0, None, 300.0, "< 128 [< 128, 300]"),  # fast wins at the first N: the estimate is a bound
])
def test_open_ends_are_written_open(crossover, low, high, text):
    assert crossover_text(comparison(crossover, low, high)) == text


def test_no_grid_no_inference_and_never():
    assert crossover_text(comparison(1000.0, None, None, sizes=[])) == "1,000 [?, ?]"
    assert crossover_text(comparison(None, None, None)) == "never"
    assert interval_ends(comparison(1000.0, 128.0, 4096.0)) == (128.0, True, 4096.0, True)


def test_open_ends_are_drawn_as_arrows(tmp_path, monkeypatch):
    """An open end ends in an arrow marker at the axis edge; a closed one in a cap."""
    import matplotlib.figure

    r = make_results()
    r.comparisons = [comparison(1085.0, 128.0, 1132.0) for _ in r.comparisons]
    for c, m in zip(r.comparisons, r.mechanisms):
        c.mechanism, c.variant = m.id, m.default_variant
    markers: list[str] = []
    savefig = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        markers.extend(line.get_marker() for line in fig.axes[0].get_lines())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    assert plot_crossover(r, tmp_path) == "crossover.png"
    assert markers.count("<") == len(r.comparisons)  # the open low ends
    assert markers.count("|") == len(r.comparisons)  # the closed high ends
    assert ">" not in markers
