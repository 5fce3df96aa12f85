"""Section "FAVOR+ estimation error vs m": the RMSE of the FAVOR+ estimate of the softmax kernel
against the number of random features, iid and orthogonal, beside the predicted RMSE; and FAVOR+
attention against exact softmax attention as a function of the q, k scale and m (where FAVOR+ is
accurate: results.schema.FavorAccuracy).

>>> from reports.sections.favor import ID, TITLE
>>> ID, TITLE
('favor', 'FAVOR+ estimation error vs m')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np

from reports import style
from reports.sections import PageInputs
from results.schema import FavorAccuracy, FavorError

ID = "favor"
TITLE = "FAVOR+ estimation error vs m"
FIGURES: dict[str, Any] = {"favor": None, "favor_accuracy": None}
#: The relative error the accuracy figure marks, and the section's sentence calls accurate.
ACCURATE = 0.10
MASK_TITLES = {"none": "no mask", "causal": "causal mask"}


def plot_favor(favor: FavorError | None, out_dir: Path, name: str = "favor_error.png") -> str | None:
    """Empirical RMSE of the FAVOR+ estimate vs m (with 95% intervals), and the predicted RMSE."""
    if favor is None or not favor.m:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    ax.plot(favor.m, favor.predicted_rmse, "k-", lw=1.5, label="predicted sqrt(Var), iid (slope −1/2)")
    styles = {"iid": ("tab:blue", "o"), "orthogonal": ("tab:orange", "s")}
    for c in favor.curves:
        color, marker = styles.get(c.kind, ("tab:gray", "^"))
        r = np.asarray(c.rmse, float)
        err = np.vstack([r - np.asarray(c.rmse_low, float), np.asarray(c.rmse_high, float) - r])
        ax.errorbar(c.m, r, yerr=err, fmt=marker, color=color, ms=4, capsize=2,
                    label=f"{c.kind}: slope {c.slope:.3f} [{c.slope_low:.3f}, {c.slope_high:.3f}]")
    ax.set(yscale="log", xlabel="number of random features m", ylabel="RMSE of φ(x)·φ(y) vs exp(x·y)",
           title=f"FAVOR+ estimation error, exp(x·y) = {favor.exact:.3f}, {favor.draws} draws per m")
    style.log2_x(ax)
    ax.grid(True, which="both", alpha=0.3)
    style.legend_right(ax, fontsize=8)
    return style.save(fig, out_dir, name)


def plot_favor_accuracy(acc: FavorAccuracy | None, out_dir: Path,
                        name: str = "favor_accuracy.png") -> str | None:
    """Relative error of FAVOR+ attention against exact softmax vs the q, k standard deviation, one
    line per m, one panel per mask, log-log, with the ACCURATE line; None without a record."""
    if acc is None or not acc.curves:
        return None
    masks = [k for k in MASK_TITLES if any(c.mask == k for c in acc.curves)]
    fig, axes = plt.subplots(1, len(masks), figsize=(5.2 * len(masks), 4.4), layout="constrained",
                             sharey=True, squeeze=False)
    colors = plt.cm.viridis(np.linspace(0.0, 0.85, len(acc.m)))
    for ax, mask in zip(axes[0], masks):
        for color, marker, m in zip(colors, style.MARKERS * len(acc.m), acc.m):
            c = acc.curve(mask, m)
            if c is not None:
                ax.plot(acc.std, c.error, marker=marker, color=color, ms=4, lw=1.3, label=f"m = {m}")
        ax.axhline(ACCURATE, color="tab:red", ls="--", lw=1)
        ax.text(acc.std[0], ACCURATE * 1.12, f"{ACCURATE:.0%}", color="tab:red", fontsize=8, va="bottom")
        ax.set(xscale="log", yscale="log", xlabel="q, k standard deviation", title=MASK_TITLES[mask])
        # labels at the powers of two only: half-octave labels (0.0884, 0.177, ...) would collide
        ticks = [s for s in acc.std if float(np.log2(s)).is_integer()] or acc.std
        ax.set_xticks(ticks, [f"{s:g}" for s in ticks])
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("‖FAVOR+ − softmax‖_F / ‖softmax‖_F")
    style.legend_right(axes[0][-1], fontsize=8)
    fig.suptitle(f"FAVOR+ attention against exact softmax, d = {acc.d}, N = {acc.n}, "
                 f"mean of {acc.seeds} seeds", fontsize=10)
    return style.save(fig, out_dir, name)


def accurate_range(acc: FavorAccuracy | None, threshold: float = ACCURATE) -> list[dict[str, Any]]:
    """Per m, the largest q, k std at which FAVOR+'s mean relative error stays under ``threshold``
    for every mask (None: at no std of the grid), and the errors at that std.

    >>> from reports.sections.favor import accurate_range
    >>> from results.schema import FavorAccuracy, FavorAccuracyCurve
    >>> acc = FavorAccuracy(64, 512, 1, True, [0.25, 0.5], [128], [
    ...     FavorAccuracyCurve("none", 128, [0.07, 0.5], [0.08, 0.6]),
    ...     FavorAccuracyCurve("causal", 128, [0.06, 0.4], [0.07, 0.5])])
    >>> accurate_range(acc)
    [{'m': 128, 'std': 0.25, 'errors': {'none': 0.07, 'causal': 0.06}}]
    """
    if acc is None:
        return []
    rows = []
    for m in acc.m:
        curves = [c for c in acc.curves if c.m == m]
        ok = [j for j in range(len(acc.std)) if curves and all(c.error[j] < threshold for c in curves)]
        best = max(ok, key=lambda j: acc.std[j]) if ok else None
        rows.append({"m": m, "std": None if best is None else acc.std[best],
                     "errors": {} if best is None else {c.mask: c.error[best] for c in curves}})
    return rows


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"favor": the figure's file name or None}.

    >>> from reports.sections.favor import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'favor': None, 'favor_accuracy': None}
    """
    return {"favor": plot_favor(inputs.results.favor_error, out_dir),
            "favor_accuracy": plot_favor_accuracy(inputs.results.favor_accuracy, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"favor": the FavorError record or None, "favor_x2": |x + y|² of its pair (None without one),
    "accuracy": the FavorAccuracy record or None, "accurate": accurate_range(accuracy),
    "accurate_threshold": ACCURATE, "accurate_logit_std": the logits' std at the widest accurate std,
    "accuracy_top": (min, max) error at the largest std or None, "accuracy_table": [(m, [[error per
    mask] per std])]}.

    >>> from reports.sections.favor import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})["favor"] is None
    True
    """
    favor = inputs.results.favor_error
    favor_x2 = sum((a + b) ** 2 for a, b in zip(favor.x, favor.y)) if favor is not None else None
    acc = inputs.results.favor_accuracy
    # the errors at the grid's largest std, every m and mask: how far off FAVOR+ is outside its range
    worst = [c.error[-1] for c in acc.curves] if acc is not None and acc.curves and acc.std else []
    accurate = accurate_range(acc)
    stds = [r["std"] for r in accurate if r["std"] is not None]
    # one row per m: per std, the errors of the masks in MASK_TITLES order ("none / causal")
    table = [] if acc is None else [
        (m, [[c.error[j] for k in MASK_TITLES if (c := acc.curve(k, m)) is not None] for j in range(len(acc.std))])
        for m in acc.m]
    return {"favor": favor, "favor_x2": favor_x2, "accuracy": acc, "accurate": accurate,
            "accurate_threshold": ACCURATE, "accurate_logit_std": max(stds) ** 2 if stds else None,
            "accuracy_top": (min(worst), max(worst)) if worst else None, "accuracy_table": table}
