"""Section "What the masks look like": the dense mask M of a small instance of every mechanism, as
heatmaps, and a table of their ranges.

>>> from reports.sections.gallery import ID, TITLE
>>> ID, TITLE
('gallery', 'What the masks look like')
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reports import style
from reports.sections import PageInputs
from results.schema import Gallery

ID = "gallery"
TITLE = "What the masks look like"
FIGURES: dict[str, Any] = {"gallery": None}
MASK_CMAP = "viridis"  # perceptually uniform, readable in grey scale and by colour-blind readers


def plot_gallery(gallery: Gallery | None, out_dir: Path, name: str = "mask_gallery.png") -> str | None:
    """One heatmap per mechanism of its dense mask M (n, n): row = query i, column = key j, linear
    colour scale from 0 to the panel's max (own colorbar). A failed panel shows its error text."""
    if gallery is None or not gallery.panels:
        return None
    from matplotlib.colors import Normalize

    panels = gallery.panels[:style.MAX_PANELS]
    fig, axes = style.grid(len(panels), ncols=4, w=3.1, h=2.8)
    for ax, p in zip(axes, panels):
        title = p.id + (f"  (N = {p.n})" if p.n != gallery.n else "")
        if p.matrix is None:
            ax.text(0.5, 0.5, textwrap.fill(p.error or "no matrix recorded", 34), ha="center", va="center",
                    fontsize=7, color="tab:red" if p.error else "0.3", transform=ax.transAxes)
            ax.set_xticks([]), ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("tab:red" if p.error else "0.6")
            ax.set_title(title + (" — FAILED" if p.error else ""), fontsize=9,
                         color="tab:red" if p.error else "black")
            continue
        m = np.asarray(p.matrix, float)
        hi = float(np.nanmax(m)) if m.size else 1.0
        hi = hi if hi > 0 else 1.0
        im = ax.imshow(m, cmap=MASK_CMAP, norm=Normalize(0.0, hi), interpolation="nearest", origin="upper")
        ax.set_xticks([0, m.shape[1] - 1]), ax.set_yticks([0, m.shape[0] - 1])
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, ticks=[0.0, hi])
        cb.ax.tick_params(labelsize=7)
        cb.ax.set_yticklabels(["0", f"{hi:.3g}"])
    fig.supxlabel("key j", fontsize=10)
    fig.supylabel("query i", fontsize=10)
    return style.save(fig, out_dir, name)


def gallery_sizes(gallery: Gallery | None) -> str:
    """The N of the panels: "N = 64", or, where some mechanism needed a smaller admissible size,
    the N requested and the N of each panel; "" without panels.

    >>> from reports.sections.gallery import gallery_sizes
    >>> gallery_sizes(None)
    ''
    """
    if gallery is None or not gallery.panels:
        return ""
    by_n: dict[int, list[str]] = {}
    for p in gallery.panels:
        by_n.setdefault(p.n, []).append(p.id)
    return (f"N = {gallery.n}" if set(by_n) <= {gallery.n} else
            f"N = {gallery.n} requested; the nearest admissible size at or below it where needed ("
            + "; ".join(f"N = {n}: {', '.join(ids)}" for n, ids in sorted(by_n.items(), reverse=True))
            + ")")


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"gallery": the figure's file name or None}.

    >>> from reports.sections.gallery import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'gallery': None}
    """
    return {"gallery": plot_gallery(inputs.results.gallery, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"gallery": the Gallery record or None, "gallery_sizes": gallery_sizes}.

    >>> from reports.sections.gallery import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'gallery': None, 'gallery_sizes': ''}
    """
    return {"gallery": inputs.results.gallery, "gallery_sizes": gallery_sizes(inputs.results.gallery)}
