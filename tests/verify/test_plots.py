"""verify.plots: the plot data a check records for the report."""
from __future__ import annotations

import json
import math

import pytest

from verify.plots import plot, series, validate_plot


def test_series_and_plot_are_json_ready_and_round_trip():
    p = plot("error vs walks", "n", "error", [series("measured", [1, 2, 4], [0.5, 0.35, math.inf],
                                                      lower=[0.4, 0.3, 0.2], upper=[0.6, 0.4, 0.3]),
                                               series("bound", [1, 4], [1.0, 0.5], kind="bound")])
    back = json.loads(json.dumps(p))
    assert validate_plot(back) == p
    assert p["series"][0]["y"] == [0.5, 0.35, None]  # non-finite y becomes a gap
    assert p["xlog"] and p["ylog"]


@pytest.mark.parametrize("make, message", [
    (lambda: series("a", [1, 2], [1.0]), "differ in length"),
    (lambda: series("a", [1, math.nan], [1.0, 2.0]), "finite"),
    (lambda: series("a", [1], [1.0], kind="bar"), "kind"),
    (lambda: series("a", [1], [1.0], kind="line", lower=[0.5]), "'points' only"),
    (lambda: series("a", [1, 2], [1.0, 2.0], upper=[3.0]), "upper has 1"),
    (lambda: series("a", ["x"], [1.0]), "numbers"),
    (lambda: plot("t", "x", "y", []), "non-empty"),
    (lambda: validate_plot({"title": "t"}), "needs the keys"),
    (lambda: validate_plot([1]), "must be a dict"),
    (lambda: validate_plot({"title": "t", "xlabel": "", "ylabel": "", "series": [{"x": [1]}]}), "label, x and y"),
])
def test_malformed_plots_are_refused_naming_the_problem(make, message):
    with pytest.raises(ValueError, match=message):
        make()
