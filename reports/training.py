"""The "Training" section: learned latent graphs trained end to end (issue 13), from the
``training`` record of the results JSON (verify.schema.Training, written by verify.training).

``training_view`` turns it into the table (test accuracy at the best validation epoch, mean and
spread over seeds, the paired difference to the MLP with its interval), ``plot_training_curves``
draws the loss and accuracy curves per data set (mean over seeds, the band min..max), and
``plot_latent`` the learned latent graph: NodeFormer's attention rows of a few nodes (heads
averaged) beside the same rows of the input adjacency, columns grouped by class. This module
measures nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reports import format as fmt
from reports.figures import _legend_below, _save, line_styles
from verify.schema import LatentGraph, Results, Training, TrainingRun

MODEL_TITLES = {"nodeformer": "NodeFormer", "sgformer": "SGFormer", "difformer": "DIFFormer", "mlp": "MLP"}


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
        vs = fmt.DASH
        if s.model == "mlp":
            vs = "baseline"
        elif s.diff_mean is not None:
            vs = _pp(s.diff_mean) + (f" [{_pp(s.diff_low)}, {_pp(s.diff_high)}]" if s.diff_low is not None else "")
        rows.append(TrainingRow(titles.get(s.dataset, s.dataset), model_title(s.model), s.seeds,
                                f"{_pct(s.mean)} ± {_pct(s.std)}", f"{_pct(s.min)} – {_pct(s.max)}", vs,
                                _verdict(s.diff_low, s.diff_high) if s.model != "mlp" else "skip",
                                str(int(np.median(best))) if best else fmt.DASH))
    datasets = [{"name": d.name, "title": d.title, "description": d.description, "graph": d.graph, "n": d.n,
                 "edges": d.edges, "features": d.features, "classes": d.classes,
                 "split": f"{d.train} / {d.val} / {d.test}",
                 "homophily": fmt.DASH if d.homophily is None else f"{d.homophily:.2f}"} for d in t.datasets]
    settings = [(str(k), fmt.value_text(v)) for k, v in t.settings.items()]
    errors = [f"{r.dataset}/{r.model}/seed {r.seed}: {r.error}" for r in t.runs if r.error]
    return TrainingView(t.mode, fmt.seconds_text(t.seconds), fmt.DASH if t.threads is None else str(t.threads),
                        ", ".join(str(s) for s in t.seeds), settings, datasets, rows,
                        [latent_stats(g) for g in t.latent], errors)


# ------------------------------------------------------------------------------- figures


def _curves(runs: list[TrainingRun], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mean, min, max) over seeds of one per-epoch curve, on the epochs every run has."""
    series = [np.array([np.nan if v is None else v for v in getattr(r, key) or []], dtype=float) for r in runs]
    series = [s for s in series if s.size]
    if not series:
        return None
    n = min(s.size for s in series)
    a = np.stack([s[:n] for s in series])
    with np.errstate(all="ignore"):
        return np.nanmean(a, 0), np.nanmin(a, 0), np.nanmax(a, 0)


def plot_training_curves(results: Results, out_dir: Path, name: str = "training_curves.png") -> str | None:
    """One row per data set: training loss (cross-entropy on the training nodes, log scale) and
    accuracy (test solid, train dotted) per epoch, one colour per model; lines are means over the
    seeds, bands their min..max."""
    import matplotlib.pyplot as plt

    t = results.training
    if t is None or not t.runs:
        return None
    datasets = [d.name for d in t.datasets] or list(dict.fromkeys(r.dataset for r in t.runs))
    titles = {d.name: d.title for d in t.datasets}
    models = list(dict.fromkeys(t.models or [r.model for r in t.runs]))
    styles = dict(zip(models, line_styles(len(models))))
    fig, axes = plt.subplots(len(datasets), 2, figsize=(10, 3.3 * len(datasets)), squeeze=False,
                             layout="constrained")
    for row, ds in zip(axes, datasets):
        loss_ax, acc_ax = row
        for model in models:
            runs = [r for r in t.runs if (r.dataset, r.model) == (ds, model)]
            color = styles[model][0]
            loss = _curves(runs, "train_loss")
            if loss is not None:
                x = np.arange(1, loss[0].size + 1)
                loss_ax.plot(x, loss[0], color=color, lw=1.3, label=model_title(model))
                loss_ax.fill_between(x, loss[1], loss[2], color=color, alpha=0.15, lw=0)
            for key, ls, label in (("test_acc", "-", "test"), ("train_acc", ":", "train")):
                c = _curves(runs, key)
                if c is None:
                    continue
                x = np.arange(1, c[0].size + 1)
                acc_ax.plot(x, c[0], ls, color=color, lw=1.3 if ls == "-" else 1.0,
                            label=f"{model_title(model)} {label}")
                if key == "test_acc":
                    acc_ax.fill_between(x, c[1], c[2], color=color, alpha=0.15, lw=0)
        loss_ax.set_yscale("log")
        loss_ax.set_title(f"{titles.get(ds, ds)}: training loss", fontsize=9)
        loss_ax.set_ylabel("cross-entropy (train nodes)", fontsize=8)
        acc_ax.set_title(f"{titles.get(ds, ds)}: accuracy (test solid, train dotted)", fontsize=9)
        acc_ax.set_ylabel("accuracy", fontsize=8)
        acc_ax.set_ylim(0, 1.02)
        for ax in row:
            ax.set_xlabel("epoch", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.25)
    _legend_below(axes[-1][0], ncol=len(models))
    _legend_below(axes[-1][1], ncol=max(1, len(models)))
    return _save(fig, Path(out_dir), name)


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
    return _save(fig, Path(out_dir), name)
