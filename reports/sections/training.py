"""Section "Training": learned latent graphs trained end to end (issue 13), from the
``training`` record of the results JSON (results.schema.Training, written by measure.training).

``training_view`` turns it into the table (test accuracy at the best validation epoch, mean and
spread over seeds, the paired differences to the MLP and to the GCN with their intervals),
``plot_training_curves`` draws the loss (and NodeFormer's edge loss), validation and test accuracy
curves per data set (mean over seeds, the band min..max), and
``plot_latent`` the learned latent graph: NodeFormer's attention rows of a few nodes (heads
averaged) beside the same rows of the input adjacency, columns grouped by class. This module
measures nothing.

>>> from reports.sections.training import ID, TITLE
>>> ID, TITLE
('training', 'Training: learned latent graphs')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.schema import LatentGraph, Results, Training, TrainingRun

ID = "training"
TITLE = "Training: learned latent graphs"
FIGURES: dict[str, Any] = {"training_curves": None, "training_latent": None}
MODEL_TITLES = {"nodeformer": "NodeFormer", "sgformer": "SGFormer", "difformer": "DIFFormer", "gcn": "GCN",
                "mlp": "MLP"}


def model_title(model: str) -> str:
    return MODEL_TITLES.get(model, model)


def _pct(x: float | None) -> str:
    return fmt.DASH if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _pp(x: float | None) -> str:
    return fmt.DASH if x is None or not np.isfinite(x) else f"{100 * x:+.1f}"


# ------------------------------------------------------------------------------- view


@dataclass
class TrainingRow:
    dataset: str
    model: str
    seeds: int
    mean: str  # "91.1 ± 0.8" (percent, sample std)
    range: str  # "90.0 – 92.0"
    vs_mlp: str  # "+28.9 [+25.0, +32.7]" (percentage points, paired over seeds)
    vs_class: str  # "pass" (above the MLP: interval above 0), "fail" (below), "skip" (neither / no MLP)
    best_epoch: str  # median epoch of best validation accuracy over seeds
    vs_gcn: str = fmt.DASH  # the same against the GCN ("baseline" on the GCN's own row)
    vs_gcn_class: str = "skip"
    attention: str = fmt.DASH  # SGFormer / DIFFormer: attention's deviation from its constant term (median, %)
    excluded: str = ""  # seeds left out because their run stopped with an error


@dataclass
class LatentStats:
    """Per latent graph: where NodeFormer's attention of the shown nodes goes, against chance."""

    dataset: str
    seed: int
    layer: int
    nodes: str
    same_class: str  # attention mass on nodes of the query's own class (mean over rows)
    same_class_uniform: str  # the same share under uniform attention
    on_neighbours: str  # attention mass on the query's input neighbours
    neighbours_uniform: str


@dataclass
class TrainingView:
    mode: str
    seconds: str
    threads: str
    seeds: str
    settings: list[tuple[str, str]]
    datasets: list[dict]
    rows: list[TrainingRow]
    latent: list[LatentStats]
    errors: list[str] = field(default_factory=list)
    n_seeds: int = 0


def latent_stats(g: LatentGraph) -> LatentStats:
    att = np.asarray(g.attention, dtype=float)
    adj = np.asarray(g.adjacency, dtype=float) > 0
    labels = np.asarray(g.labels)
    n = labels.size
    same = np.array([labels == labels[u] for u in g.nodes])  # (R, N)
    on_same = (att * same).sum(1).mean() if att.size else float("nan")
    uni_same = same.sum(1).mean() / n if att.size else float("nan")
    on_nbr = (att * adj).sum(1).mean() if att.size else float("nan")
    uni_nbr = adj.sum(1).mean() / n if att.size else float("nan")
    return LatentStats(g.dataset, g.seed, g.layer, ", ".join(str(u) for u in g.nodes), _pct(on_same),
                       _pct(uni_same), _pct(on_nbr), _pct(uni_nbr))


def _vs_text(is_base: bool, mean, low, high) -> str:
    if is_base:
        return "baseline"
    if mean is None:
        return fmt.DASH
    return _pp(mean) + (f" [{_pp(low)}, {_pp(high)}]" if low is not None else "")


def _verdict(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "skip"
    return "pass" if low > 0 else ("fail" if high < 0 else "skip")


def training_view(results: Results) -> TrainingView | None:
    """The section's content, or None when the run has no training record."""
    t: Training | None = results.training
    if t is None:
        return None
    titles = {d.name: d.title for d in t.datasets}
    rows = []
    for s in t.summary:
        best = [r.best_epoch for r in t.runs if (r.dataset, r.model) == (s.dataset, s.model) and r.best_epoch]
        vs = _vs_text(s.model == "mlp", s.diff_mean, s.diff_low, s.diff_high)
        vs_gcn = _vs_text(s.model == "gcn", s.gcn_diff_mean, s.gcn_diff_low, s.gcn_diff_high)
        devs = [v for r in t.runs if (r.dataset, r.model) == (s.dataset, s.model) and r.error is None
                for v in (r.attention_deviation or [])]
        rows.append(TrainingRow(titles.get(s.dataset, s.dataset), model_title(s.model), s.seeds,
                                f"{_pct(s.mean)} ± {_pct(s.std)}", f"{_pct(s.min)} – {_pct(s.max)}", vs,
                                _verdict(s.diff_low, s.diff_high) if s.model != "mlp" else "skip",
                                str(int(np.median(best))) if best else fmt.DASH, vs_gcn,
                                _verdict(s.gcn_diff_low, s.gcn_diff_high) if s.model != "gcn" else "skip",
                                f"{100 * float(np.median(devs)):.2f}" if devs else fmt.DASH,
                                ", ".join(str(k) for k in s.excluded)))
    datasets = [{"name": d.name, "title": d.title, "description": d.description, "graph": d.graph, "n": d.n,
                 "edges": d.edges, "features": d.features, "classes": d.classes,
                 "split": f"{d.train} / {d.val} / {d.test}",
                 "homophily": fmt.DASH if d.homophily is None else f"{d.homophily:.2f}"} for d in t.datasets]
    settings = [(str(k), fmt.value_text(v)) for k, v in t.settings.items()]
    errors = [f"{r.dataset}/{r.model}/seed {r.seed}: {r.error}" for r in t.runs if r.error]
    return TrainingView(t.mode, fmt.seconds_text(t.seconds), fmt.DASH if t.threads is None else str(t.threads),
                        ", ".join(str(s) for s in t.seeds), settings, datasets, rows,
                        [latent_stats(g) for g in t.latent], errors, len(t.seeds))


# ------------------------------------------------------------------------------- figures


def epoch_curves(runs: list[TrainingRun], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mean, min, max) over seeds of one per-epoch curve, on the epochs every run has; runs that
    stopped with an error are left out (they would cut the others' curves short)."""
    series = [np.array([np.nan if v is None else v for v in getattr(r, key) or []], dtype=float)
              for r in runs if r.error is None]
    series = [s for s in series if s.size]
    if not series:
        return None
    n = min(s.size for s in series)
    a = np.stack([s[:n] for s in series])
    with np.errstate(all="ignore"):
        return np.nanmean(a, 0), np.nanmin(a, 0), np.nanmax(a, 0)


def plot_training_curves(results: Results, out_dir: Path, name: str = "training_curves.png") -> str | None:
    """One row per data set, three panels: training loss (cross-entropy on the training nodes,
    solid; NodeFormer's edge loss, Eq. 10, dashed where recorded; log scale), validation accuracy,
    and accuracy on the test (solid) and training (dotted) nodes; one colour per model; lines are
    means over the seeds (runs that stopped with an error left out), bands their min..max."""
    import matplotlib.pyplot as plt

    t = results.training
    if t is None or not t.runs:
        return None
    datasets = [d.name for d in t.datasets] or list(dict.fromkeys(r.dataset for r in t.runs))
    titles = {d.name: d.title for d in t.datasets}
    models = list(dict.fromkeys(t.models or [r.model for r in t.runs]))
    styles = dict(zip(models, style.line_styles(len(models))))
    fig, axes = plt.subplots(len(datasets), 3, figsize=(14, 3.3 * len(datasets)), squeeze=False,
                             layout="constrained")

    def draw(ax, c, color, ls, label, band=True, lw=1.3):
        x = np.arange(1, c[0].size + 1)
        ax.plot(x, c[0], ls, color=color, lw=lw, label=label)
        if band:
            ax.fill_between(x, c[1], c[2], color=color, alpha=0.15, lw=0)

    for row, ds in zip(axes, datasets):
        loss_ax, val_ax, acc_ax = row
        for model in models:
            runs = [r for r in t.runs if (r.dataset, r.model) == (ds, model)]
            color = styles[model][0]
            title = model_title(model)
            loss = epoch_curves(runs, "train_loss")
            if loss is not None:
                draw(loss_ax, loss, color, "-", title)
            edge = epoch_curves(runs, "edge_loss")
            if edge is not None:
                draw(loss_ax, edge, color, "--", f"{title} edge loss", band=False, lw=1.0)
            val = epoch_curves(runs, "val_acc")
            if val is not None:
                draw(val_ax, val, color, "-", title)
            for key, ls, label in (("test_acc", "-", "test"), ("train_acc", ":", "train")):
                c = epoch_curves(runs, key)
                if c is not None:
                    draw(acc_ax, c, color, ls, f"{title} {label}", band=key == "test_acc",
                         lw=1.3 if ls == "-" else 1.0)
        loss_ax.set_yscale("log")
        loss_ax.set_title(f"{titles.get(ds, ds)}: training loss (edge loss dashed)", fontsize=9)
        loss_ax.set_ylabel("cross-entropy (train nodes)", fontsize=8)
        val_ax.set_title(f"{titles.get(ds, ds)}: validation accuracy", fontsize=9)
        acc_ax.set_title(f"{titles.get(ds, ds)}: accuracy (test solid, train dotted)", fontsize=9)
        for ax in (val_ax, acc_ax):
            ax.set_ylabel("accuracy", fontsize=8)
            ax.set_ylim(0, 1.02)
        for ax in row:
            ax.set_xlabel("epoch", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.25)
    # one legend for all panels (three legends below the last row ran into each other): a colour
    # per model, then what the solid, dashed and dotted lines are
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=styles[m][0], lw=1.3, label=model_title(m)) for m in models]
    handles += [Line2D([], [], color="0.3", ls=ls, lw=1.1, label=what) for ls, what in
                (("-", "training loss; test accuracy"), ("--", "edge loss (Eq. 10)"), (":", "training accuracy"))]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 8), frameon=False, fontsize=8)
    return style.save(fig, Path(out_dir), name)


def plot_latent(results: Results, out_dir: Path, name: str = "training_latent.png") -> str | None:
    """One row per latent graph: the input adjacency rows of the shown nodes (left) and
    NodeFormer's learned attention rows of the same nodes (right, heads averaged, N x weight so
    1 = uniform, power-scaled colours), columns ordered by class with thin lines between classes,
    each row labelled with its node and class."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    t = results.training
    if t is None or not t.latent:
        return None
    fig, axes = plt.subplots(len(t.latent), 2, figsize=(12, 0.45 * sum(len(g.nodes) for g in t.latent)
                                                        + 1.6 * len(t.latent)),
                             squeeze=False, layout="constrained")
    titles = {d.name: d.title for d in t.datasets}
    for (adj_ax, att_ax), g in zip(axes, t.latent):
        order = np.asarray(g.order, dtype=int)
        labels = np.asarray(g.labels)[order]
        adj = np.asarray(g.adjacency, dtype=float)[:, order]
        att = np.asarray(g.attention, dtype=float)[:, order] * len(order)
        bounds = np.flatnonzero(np.diff(labels)) + 0.5
        ylabels = [f"node {u} (class {g.labels[u]})" for u in g.nodes]
        adj_ax.imshow(adj, aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        vmax = max(float(np.nanmax(att)) if att.size else 1.0, 1.0)
        im = att_ax.imshow(att, aspect="auto", cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=vmax),
                           interpolation="nearest")
        fig.colorbar(im, ax=att_ax, fraction=0.03, pad=0.01).set_label("N × attention (1 = uniform)", fontsize=7)
        for ax, what in ((adj_ax, "input graph: adjacency rows"),
                         (att_ax, f"learned latent graph: NodeFormer layer {g.layer + 1} attention (heads averaged)")):
            for b in bounds:
                ax.axvline(b, color="tab:red", lw=0.8)
            ax.set_yticks(range(len(g.nodes)), ylabels, fontsize=7)
            ax.set_xlabel("all nodes, grouped by class (red lines: class boundaries)", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.set_title(f"{titles.get(g.dataset, g.dataset)}: {what}", fontsize=8)
    return style.save(fig, Path(out_dir), name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"training_curves": plot_training_curves, "training_latent": plot_latent} (None without a
    training record).

    >>> from reports.sections.training import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'training_curves': None, 'training_latent': None}
    """
    return {"training_curves": plot_training_curves(inputs.results, out_dir),
            "training_latent": plot_latent(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"training": training_view (None when the run has no training record)}.

    >>> from reports.sections.training import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'training': None}
    """
    return {"training": training_view(inputs.results)}
