"""Section "FAVOR+ estimation error vs m": the RMSE of the FAVOR+ estimate of the softmax kernel
against the number of random features, iid and orthogonal, beside the predicted RMSE.

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
from results.schema import FavorError

ID = "favor"
TITLE = "FAVOR+ estimation error vs m"
FIGURES: dict[str, Any] = {"favor": None}


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


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"favor": the figure's file name or None}.

    >>> from reports.sections.favor import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'favor': None}
    """
    return {"favor": plot_favor(inputs.results.favor_error, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"favor": the FavorError record or None, "favor_x2": |x + y|² of its pair (None without one)}.

    >>> from reports.sections.favor import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'favor': None, 'favor_x2': None}
    """
    favor = inputs.results.favor_error
    favor_x2 = sum((a + b) ** 2 for a, b in zip(favor.x, favor.y)) if favor is not None else None
    return {"favor": favor, "favor_x2": favor_x2}
