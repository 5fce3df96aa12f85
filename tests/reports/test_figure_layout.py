"""Every figure of the report, rendered from synthetic inputs, has no text over other text: no tick
labels, titles, axis labels, legend entries or annotations whose boxes intersect, and no legend
over another legend (reports.style.text_overlaps, run on each figure as it is saved).

The inputs reproduce what made figures collide in a real run (issue 23 item 5): 16 mechanisms
(16 speed-up lines and time panels), the training record, and check curves shaped like
choromanski22/theorem-4.1 and -4.2, reid25/lemma-3.2 and wu22/theorem-1 and -2 (log axes that
span about one decade, where matplotlib labels minor ticks, and long panel titles side by side).
"""
from __future__ import annotations

import json
import math

import matplotlib.figure
import pytest

from reports.__main__ import main
from reports.style import dashes, line_styles, text_overlaps
from results.check import CheckResult
from tests.reports.synthetic import gpu_run, make_asv, make_results, write_peers
from tests.reports.test_training_report import make_training
from verify.plots import plot, series

LONG = "(1 - eps)-quantile of |K - kappa|, eps = 0.25, m = 16, q = k"


def _check(cid: str, plots: list[dict]) -> CheckResult:
    return CheckResult(cid, f"title of {cid}", "paper", "statistical", "pass", 0.5, 1.0, 0.5, {"plots": plots},
                       compare="<=")


def curve_checks() -> list[CheckResult]:
    """Check curves shaped like the real ones that collided (their axis ranges and titles)."""
    ne = [20_480, 36_864, 69_632, 135_168, 266_240]
    cost = [series(f"{who}, T = {t}", ne, [k * n * 1e-8 for n in ne])
            for who in ("fast", "expm_multiply") for k, t in ((1, "laplacian"), (3, "random-walk"))]
    err = [series("fast (float64)", [1e-12, 1e-9, 1e-6, 1e-3], [1e-12, 1e-9, 1e-6, 1e-3]),
           series("bound: delta", [1e-12, 1e-3], [1e-12, 1e-3], kind="bound")]
    walkers = [2, 4, 8, 16, 32, 64]
    sizes = [256, 512, 1024, 2048, 4096]
    q = [0.5, 0.8, 1.2, 1.6, 2.0, 2.5, 3.0, 3.5]
    tau = [0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0]
    return [
        _check("choromanski22/theorem-4.1", [
            plot("expm action: error vs tolerance", "delta asked for", "worst column error", err),
            plot("cost at N = 4096, growing degree", "N + E", "CPU seconds per call", cost)]),
        _check("choromanski22/theorem-4.2", [
            plot("RWGNK Monte Carlo error vs walkers", "walkers", "relative error",
                 [series("measured", walkers, [0.5 / math.sqrt(w) for w in walkers]),
                  series("w^-1/2", walkers, [0.6 / math.sqrt(w) for w in walkers], kind="line")])]),
        _check("reid25/lemma-3.2", [
            plot("GRF feature sparsity vs N", "N", "non-zeros per row",
                 [series("measured", sizes, [30 + math.log(n) for n in sizes]),
                  series("bound", sizes, [60.0] * len(sizes), kind="bound")])]),
        _check("wu22/theorem-1", [
            plot(f"wu22 Thm. 1 at tau = {t}: {LONG}", "|q| = |k|", "|phi.phi - kappa|",
                 [series("measured", q, [math.exp(p * p / t) - 1 for p in q]),
                  series("bound, r = |q|", q, [10 ** (p / t) for p in q], kind="bound")]) for t in (1, 0.5)]),
        _check("wu22/theorem-2", [
            plot("wu22 Thm. 2: kernelized Gumbel-softmax vs softmax(q.k)", "tau", "total variation",
                 [series("measured", tau, [0.3 + 0.1 * t for t in tau]),
                  series("bound", tau, [0.5 + 0.2 * t for t in tau], kind="bound")])]),
    ]


@pytest.fixture(scope="module")
def overlaps(tmp_path_factory):
    """{figure file name: its overlaps} of a full render; every figure goes through Figure.savefig."""
    root = tmp_path_factory.mktemp("layout")
    results = make_results(extra=14)
    results.training = make_training()
    results.checks = [*results.checks, *curve_checks()]
    results.write(root / "out" / "results.json")
    (root / "gpu.json").write_text(json.dumps(gpu_run()))
    found: dict[str, list[str]] = {}
    savefig = matplotlib.figure.Figure.savefig

    def checked_savefig(fig, fname, *args, **kwargs):
        found[getattr(fname, "name", str(fname))] = text_overlaps(fig)
        return savefig(fig, fname, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(matplotlib.figure.Figure, "savefig", checked_savefig)
    try:
        assert main(["--out", str(root / "out"), "--asv-results", str(make_asv(root / "asv")),
                     "--peers-json", str(write_peers(root / "peers.json")), "--gpu-json", str(root / "gpu.json"),
                     "--no-progress"]) == 0
    finally:
        mp.undo()
    return found


def test_every_figure_was_checked(overlaps):
    for name in ("crossover.png", "time_vs_n.png", "training_curves.png", "training_latent.png", "numerics.png",
                 "check_choromanski22_theorem-4.1.png", "check_wu22_theorem-1.png", "gpu_sweeps.png", "peers.png"):
        assert name in overlaps, sorted(overlaps)


def test_no_text_overlaps_in_any_figure(overlaps):
    bad = {name: found for name, found in overlaps.items() if found}
    assert not bad, "\n".join(f"{name}: {found[:4]}" for name, found in bad.items())


def test_text_overlaps_finds_colliding_texts_and_legends():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(4, 2))
    for ax in axes:
        ax.plot([0, 1], label="a label long enough to reach the other panel")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.1))
    try:
        found = text_overlaps(fig)
    finally:
        plt.close(fig)
    assert "legend 0 overlaps legend 1" in found
    assert any("a label long enough" in f for f in found)


def test_sixteen_lines_stay_distinct():
    styles, ls = line_styles(16), dashes(16)
    assert len({(c, m, d) for (c, m), d in zip(styles, ls)}) == 16
    # two lines of one colour differ in marker and dash too; only tab10's ten colours (tab20's pale
    # halves were hard to tell from their dark ones)
    assert all(styles[i][1] != styles[j][1] and ls[i] != ls[j]
               for i in range(16) for j in range(i + 1, 16) if styles[i][0] == styles[j][0])
    assert len({c for c, _ in styles}) == 10
