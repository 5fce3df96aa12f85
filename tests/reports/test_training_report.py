"""The training section (reports.sections.training) from a synthetic results.schema.Training record: the
table, both figures, the JSON round trip, escaping, and a run without the record. Nothing here
trains: every number comes from a formula (``make_training``); tests/reports/synthetic.py's
make_results supplies the rest of the Results."""
from __future__ import annotations

import html
import math

import numpy as np

from reports.page import render_page
from reports.sections.training import epoch_curves, latent_stats, plot_latent, plot_training_curves, training_view
from tests.reports.synthetic import MALICIOUS, make_results
from results.schema import (LatentGraph, Results, Training, TrainingDataset, TrainingRun, TrainingSummary)

PNG = b"\x89PNG\r\n\x1a\n"
MODELS = ("nodeformer", "sgformer", "difformer", "gcn", "mlp")
SEEDS = (0, 1, 2)
EPOCHS = 20
RUN_ERROR = "FloatingPointError: non-finite training loss <nan> at epoch 7"
#: final test accuracy per (data set, model), seed s adds 0.01 * (s - 1)
FINAL = {("sbm", "nodeformer"): 0.80, ("sbm", "sgformer"): 0.90, ("sbm", "difformer"): 0.70, ("sbm", "mlp"): 0.60, ("sbm", "gcn"): 0.95,
         ("karate", "nodeformer"): 0.70, ("karate", "sgformer"): 0.80, ("karate", "difformer"): 0.75,
         ("karate", "mlp"): 0.50, ("karate", "gcn"): 0.85}


def _run(ds: str, model: str, seed: int) -> TrainingRun:
    final = FINAL[ds, model] + 0.01 * (seed - 1)
    e = np.arange(1, EPOCHS + 1)
    loss = list(1.1 * np.exp(-e / 8) + 0.05)
    acc = list(final * (1 - np.exp(-e / 4)) / (1 - np.exp(-EPOCHS / 4)))  # reaches ``final`` at the end
    run = TrainingRun(ds, model, seed, EPOCHS, loss, [min(1.0, a + 0.1) for a in acc], acc, acc,
                      edge_loss=list(5.0 - 0.01 * e) if model == "nodeformer" else None,
                      best_epoch=EPOCHS, best_val_acc=acc[-1], test_at_best_val=acc[-1], seconds=0.5)
    if model in ("sgformer", "difformer"):
        run.attention_deviation = [0.001 * (seed + 1)] * (1 if model == "sgformer" else 2)
    return run


def _latent(ds: str, n: int, classes: int) -> LatentGraph:
    labels = [i % classes for i in range(n)]
    nodes = [c for c in range(classes)]  # node c has class c
    att = []
    for u in nodes:
        same = [i for i in range(n) if labels[i] == labels[u]]
        row = [0.0] * n
        for i in same:  # 0.75 of the mass on the own class, the rest uniform over the others
            row[i] = 0.75 / len(same)
        for i in range(n):
            if labels[i] != labels[u]:
                row[i] = 0.25 / (n - len(same))
        att.append(row)
    adj = [[1.0 if abs(i - u) == 1 else 0.0 for i in range(n)] for u in nodes]
    order = sorted(range(n), key=lambda i: (labels[i], i))
    return LatentGraph(ds, "nodeformer", 0, 1, nodes, labels, order, att, adj)


def make_training(with_error: bool = True) -> Training:
    runs = [_run(ds, m, s) for ds in ("sbm", "karate") for m in MODELS for s in SEEDS]
    if with_error:
        runs[1].error = RUN_ERROR
    summary = []
    for ds in ("sbm", "karate"):
        mlp = [r.test_at_best_val for r in runs if (r.dataset, r.model) == (ds, "mlp")]
        gcn = [r.test_at_best_val for r in runs if (r.dataset, r.model) == (ds, "gcn")]
        for m in MODELS:
            acc = [r.test_at_best_val for r in runs if (r.dataset, r.model) == (ds, m)]
            diff = np.array(acc) - np.array(mlp)
            s = TrainingSummary(ds, m, 3, float(np.mean(acc)), float(np.std(acc, ddof=1)), min(acc), max(acc),
                                float(np.mean(mlp)))
            if m != "mlp":
                s.diff_mean = float(diff.mean())
                s.diff_low, s.diff_high = s.diff_mean - 0.05, s.diff_mean + 0.05
            s.gcn_mean = float(np.mean(gcn))
            if m != "gcn":
                s.gcn_diff_mean = float(np.mean(np.array(acc) - np.array(gcn)))
                s.gcn_diff_low, s.gcn_diff_high = s.gcn_diff_mean - 0.03, s.gcn_diff_mean + 0.03
            summary.append(s)
    summary[-3].diff_low, summary[-2].diff_high = -0.2, 0.7  # karate difformer: interval over 0
    datasets = [TrainingDataset("sbm", "planted partition (SBM)", "3 blocks " + MALICIOUS, "the SBM graph", 30, 60, 4,
                                3, 9, 6, 15, 0.74),
                TrainingDataset("karate", "karate club", "Zachary", "the friendship graph", 34, 78, 34, 2, 14, 6, 14,
                                None)]
    return Training("quick", {"epochs": EPOCHS, "lr": 0.01, "lambda": 0.1}, datasets, list(MODELS), list(SEEDS),
                    runs, summary, [_latent("sbm", 30, 3), _latent("karate", 34, 2)], 12.5, 1)


def results_with_training(**kw) -> Results:
    r = make_results()
    r.training = make_training(**kw)
    return r


def _section(page: str) -> str:
    return page[page.index('<section id="training"'):page.index('<section id="history"')]


def test_view_rows_and_verdicts():
    v = training_view(results_with_training())
    assert (v.mode, v.seconds, v.threads, v.seeds) == ("quick", "12.5 s", "1", "0, 1, 2")
    rows = {(r.dataset, r.model): r for r in v.rows}
    assert len(rows) == 10
    sg = rows["planted partition (SBM)", "SGFormer"]
    assert (sg.seeds, sg.mean, sg.range, sg.vs_mlp, sg.vs_class, sg.best_epoch) == (
        3, "90.0 ± 1.0", "89.0 – 91.0", "+30.0 [+25.0, +35.0]", "pass", str(EPOCHS))
    assert (sg.vs_gcn, sg.vs_gcn_class, sg.attention) == ("-5.0 [-8.0, -2.0]", "fail", "0.20")  # median of .1 .2 .3 %
    assert rows["planted partition (SBM)", "DIFFormer"].attention == "0.20"
    gcn = rows["planted partition (SBM)", "GCN"]
    assert (gcn.vs_gcn, gcn.vs_gcn_class, gcn.vs_mlp, gcn.attention) == ("baseline", "skip", "+35.0 [+30.0, +40.0]",
                                                                         "–")
    assert rows["planted partition (SBM)", "MLP"].vs_mlp == "baseline"
    assert rows["planted partition (SBM)", "MLP"].vs_gcn == "-35.0 [-38.0, -32.0]"
    assert rows["karate club", "DIFFormer"].vs_class == "skip"  # interval straddles 0
    assert [d["homophily"] for d in v.datasets] == ["0.74", "–"]
    assert v.errors == [f"sbm/nodeformer/seed 1: {RUN_ERROR}"]
    assert ("lambda", "0.1") in v.settings


def test_latent_stats_are_the_planted_shares():
    g = _latent("sbm", 30, 3)
    s = latent_stats(g)
    assert (s.same_class, s.same_class_uniform) == ("75.0", "33.3")
    # node 0's neighbours: node 1 (class 1) -> 0.25 / 20; nodes 1, 2: two neighbours each, one of each other class
    want = (0.25 / 20 + 2 * 0.25 / 20 + 2 * 0.25 / 20) / 3
    assert s.on_neighbours == f"{100 * want:.1f}"
    assert s.neighbours_uniform == f"{100 * (5 / 3) / 30:.1f}"


def test_figures_are_pngs(tmp_path):
    r = results_with_training()
    assert plot_training_curves(r, tmp_path) == "training_curves.png"
    assert plot_latent(r, tmp_path) == "training_latent.png"
    for name in ("training_curves.png", "training_latent.png"):
        p = tmp_path / name
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000


def test_section_renders_table_figures_and_escapes():
    r = results_with_training()
    page = render_page(r, {"variants": {}, "training_curves": "training_curves.png",
                           "training_latent": "training_latent.png"})
    assert 'href="#training"' in page
    section = _section(page)
    assert 'src="training_curves.png"' in section and 'src="training_latent.png"' in section
    assert section.count("<tr><td>planted partition (SBM)</td>") == 5 and section.count("<tr><td>karate club</td>") == 5
    assert '<td class="num pass">+30.0 [+25.0, +35.0]</td>' in section
    assert '<td class="num fail">-5.0 [-8.0, -2.0]</td>' in section  # SGFormer vs GCN
    assert "vs GCN" in section and "3 seed(s)" in section and "initialisation, noise and" in section
    assert "the plain GCN is as good or better" in section and "nearly a no-op" in section
    assert "<script>" not in section and html.escape(MALICIOUS, quote=False) in section.replace("&#39;", "'")
    assert "FloatingPointError: non-finite training loss &lt;nan&gt; at epoch 7" in section
    assert "75.0" in section and "33.3" in section  # the latent table
    assert "recorded no training demo" not in section
    # the sections keep the table of contents' order
    assert page.index('<section id="favor"') < page.index('<section id="training"') < page.index(
        '<section id="history"')


def test_round_trip_through_the_results_json(tmp_path):
    r = results_with_training()
    r.training.runs[0].train_loss[3] = math.inf  # a non-finite number survives as "inf"
    back = Results.read(r.write(tmp_path / "results.json"))
    assert back.training == r.training
    assert back.to_dict() == r.to_dict()
    assert training_view(back) == training_view(r)


def test_no_training_record_no_figure_and_a_note(tmp_path):
    r = make_results()
    assert r.training is None and training_view(r) is None
    assert plot_training_curves(r, tmp_path) is None and plot_latent(r, tmp_path) is None
    section = _section(render_page(r, {"variants": {}}))
    assert "This run recorded no training demo" in section and "--skip-training" in section
    # an older results file without the key reads as no record
    d = r.to_dict()
    d.pop("training")
    assert Results.from_dict(d).training is None


def test_a_record_without_latent_graphs_or_runs_still_renders(tmp_path):
    r = results_with_training(with_error=False)
    r.training.latent = []
    assert plot_latent(r, tmp_path) is None
    section = _section(render_page(r, {"variants": {}, "training_curves": plot_training_curves(r, tmp_path)}))
    assert "Runs that stopped early" not in section and "attention on the own class" not in section
    r.training.runs = []
    assert plot_training_curves(r, tmp_path) is None


def test_one_seed_has_no_interval():
    r = results_with_training()
    s = r.training.summary[0]
    s.seeds, s.std, s.diff_low, s.diff_high, s.gcn_diff_low, s.gcn_diff_high = 1, 0.0, None, None, None, None
    row = training_view(r).rows[0]
    assert row.vs_mlp == "+20.0" and row.vs_class == "skip"
    assert row.vs_gcn == "-15.0" and row.vs_gcn_class == "skip"


def test_an_errored_run_does_not_cut_the_mean_curves_and_is_listed():
    r = results_with_training()
    runs = [x for x in r.training.runs if (x.dataset, x.model) == ("sbm", "nodeformer")]
    runs[1].test_acc = runs[1].test_acc[:6]  # stopped at epoch 7 (RUN_ERROR)
    mean, low, high = epoch_curves(runs, "test_acc")
    assert mean.size == EPOCHS  # the two complete runs, all epochs
    assert np.allclose(mean, np.mean([runs[0].test_acc, runs[2].test_acc], axis=0))
    r.training.summary[0].excluded = [1]
    assert training_view(r).rows[0].excluded == "1"
    assert "excluded (error): seeds 1" in _section(render_page(r, {"variants": {}}))


def test_old_summary_and_run_records_still_read():
    """A results file from before the GCN baseline and the attention diagnostics reads, the new
    fields empty."""
    t = make_training()
    d = t.to_dict()
    for s in d["summary"]:
        for k in ("gcn_mean", "gcn_diff_mean", "gcn_diff_low", "gcn_diff_high", "excluded"):
            s.pop(k)
    for run in d["runs"]:
        run.pop("score_ratio"), run.pop("attention_deviation")
    for ds in d["datasets"]:
        ds.pop("draw_seed")
    back = Training.from_dict(d)
    assert back.summary[0].gcn_diff_mean is None and back.summary[0].excluded == []
    assert back.runs[0].attention_deviation is None and back.datasets[0].draw_seed is None
    assert back.summary[0].diff_mean == t.summary[0].diff_mean
