"""The look every figure of the report shares: matplotlib (Agg), colours, markers, guides, the
panel grid, legends placed outside the axes, log axes, sweeps drawn as points and fitted lines, and
the one way a figure is saved.

Conventions on every figure: log-log axes for time and memory vs N (base-2 N axis); filled
points entered a fit, hollow ones did not; legends sit outside the axes (below a panel, or right
of it), never over data; a panel with many lines cycles markers through tab10's ten colours and
changes the dash every ten lines, so lines of one colour differ in marker and dash; ``save`` wraps
titles wider than their panel and hides tick labels that would touch (``tidy``), and
``text_overlaps`` lists any text that still runs into another (tests/reports/test_figure_layout.py
runs it on every figure). Each section module (reports.sections.*) draws its own figures with
these helpers; nothing here knows a section.

>>> from reports.style import line_styles, slug
>>> line_styles(2)
[('#1f77b4', 'o'), ('#ff7f0e', 's')]
>>> slug("a/b c")
'a_b_c'
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")  # headless: the report renders in CI and over ssh
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reports.format import fit_text, pow2_text  # noqa: E402
from results.schema import SweepResult  # noqa: E402

DPI = 110
#: Colour of the fast path and of its dense twin, the same on every figure.
COLORS = {"fast": "tab:blue", "dense": "tab:red"}
#: Markers cycled with the colours; 9 is coprime to 10, so (colour, marker) pairs repeat only
#: after 90 lines.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
#: Line styles, one per ten lines: the 11th line has the 1st one's colour, but dashed.
DASHES = ("-", "--", ":", "-.")
#: Grey guide lines through a reference point: (label, f(N), line style).
GUIDES = (("N", lambda n: n, "--"), ("N log N", lambda n: n * np.log(n), "-."), ("N²", lambda n: n**2, ":"))
GUIDE_COLOR = "0.55"
#: One page-width figure holds this many panels at most; further ones are listed in the caption.
MAX_PANELS = 36


def line_styles(n: int) -> list[tuple[str, str]]:
    """(colour, marker) of n lines: the ten tab10 colours (tab20's pale halves are hard to tell
    from their dark ones) with the markers cycled, so no two of the first 90 lines share both.
    Lines drawn with connecting segments add ``dashes(n)``.

    >>> from reports.style import line_styles
    >>> styles = line_styles(16)
    >>> len(set(styles)), len({c for c, _ in styles})
    (16, 10)
    """
    cmap = plt.get_cmap("tab10")
    return [(matplotlib.colors.to_hex(cmap(i % cmap.N)), MARKERS[i % len(MARKERS)]) for i in range(n)]


def dashes(n: int) -> list[str]:
    """Line style of each of n lines: solid for the first ten, dashed for the next ten, ...; with
    ``line_styles`` a line differs from any other in colour or in dash, and in marker.

    >>> from reports.style import dashes
    >>> dashes(12)[9:]
    ['-', '--', '--']
    """
    return [DASHES[(i // 10) % len(DASHES)] for i in range(n)]


def slug(text: str) -> str:
    """A file-name-safe form of an id ("toeplitz-1d" stays, "a/b c" -> "a_b_c").

    >>> from reports.style import slug
    >>> slug("toeplitz-1d"), slug("")
    ('toeplitz-1d', '_')
    """
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


def grid(n_panels: int, ncols: int = 3, w: float = 4.3, h: float = 3.9):
    """(figure, the first ``n_panels`` axes) of a grid of at most ``ncols`` columns, each panel
    ``w`` x ``h`` inches; the unused panels of the last row are hidden.

    >>> from reports.style import grid
    >>> import matplotlib.pyplot as plt
    >>> fig, axes = grid(4)
    >>> len(axes), [round(float(x), 1) for x in fig.get_size_inches()]
    (4, [12.9, 7.8])
    >>> plt.close(fig)
    """
    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False, layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def save(fig, out_dir: Path, name: str) -> str:
    """Write ``fig`` to ``out_dir / name`` (PNG at DPI) after ``tidy``, close it, and return ``name``."""
    tidy(fig)
    # bbox "tight" keeps the legends placed outside the axes inside the picture.
    fig.savefig(out_dir / name, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return name


def tidy(fig) -> None:
    """Make every figure legible the same way, whatever drew it: a panel title wider than its
    panel is wrapped onto more lines (two titles side by side would run into each other), and a
    tick label that would touch its neighbour is hidden (log axes label minor ticks such as
    "3×10⁴" beside "4×10⁴" on narrow panels), major labels kept first. Draws the figure twice.

    >>> import matplotlib.pyplot as plt
    >>> from reports.style import text_overlaps, tidy
    >>> fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
    >>> for ax in axes:
    ...     _ = ax.set_title("a long panel title that is far wider than its own panel is")
    >>> len(text_overlaps(fig)) > 0, tidy(fig), text_overlaps(fig)
    (True, None, [])
    >>> plt.close(fig)
    """
    # a layout pass without rasterising: it places every text as savefig will, at a third of a draw's cost
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    wrapped = False
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        width, text = ax.get_window_extent(renderer).width, ax.title.get_text()
        extent = ax.title.get_window_extent(renderer).width
        if text and extent > width:
            chars = max(12, int(len(text) * width / extent * 0.95))
            ax.title.set_text(textwrap.fill(" ".join(text.split()), chars))
            wrapped = True
    if wrapped:
        fig.draw_without_rendering()
    for ax in fig.axes:
        if ax.get_visible():
            _thin_tick_labels(ax, renderer)
    # keep the positions just laid out: savefig would repeat the constrained layout, the costliest
    # part of a draw, and to the same result ("none" keeps a colorbar's layout compatible)
    fig.set_layout_engine("none")


def _thin_tick_labels(ax, renderer, gap: float = 2.0) -> None:
    """Hide the tick labels of ``ax`` that would touch an already kept one (major ones kept first)."""
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        kept: list = []
        for label in (*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)):
            if not label.get_visible() or not label.get_text().strip() or not _in_view(label, ax, name):
                continue
            b = label.get_window_extent(renderer)
            if any(b.padded(gap / 2).overlaps(k.padded(gap / 2)) for k in kept):
                label.set_visible(False)
            else:
                kept.append(b)


def legend_below(ax, ncol: int = 1, title: str | None = None, fontsize: float = 7) -> None:
    """The panel's legend under its axes (nothing when the panel has no labelled artist)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False, fontsize=fontsize,
              title=title, title_fontsize=fontsize)


def legend_right(ax, fontsize: float = 7, title: str | None = None) -> None:
    """The panel's legend right of its axes (nothing when the panel has no labelled artist)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=fontsize, title=title,
              title_fontsize=fontsize)


def top_legend(fig, handles: list[Line2D]) -> None:
    """One legend for every panel, in one row above them."""
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False, fontsize=9)


def log2_x(ax) -> None:
    """A base-2 log x axis (N is swept in powers of two)."""
    ax.set_xscale("log", base=2)


def no_data(ax, text: str) -> None:
    """Grey text in the middle of an empty panel saying why it is empty."""
    ax.text(0.5, 0.5, textwrap.fill(text, 36), ha="center", va="center", transform=ax.transAxes,
            fontsize=8, color="0.35")


def draw_guides(ax, sizes: Iterable[float], ref_n: float, ref_y: float, guides=GUIDES) -> None:
    """Grey guide lines through (ref_n, ref_y) over the range of ``sizes``."""
    sizes = [s for s in sizes if s and s > 0]
    if not sizes or not (ref_y and ref_y > 0):
        return
    n = np.geomspace(min(sizes), max(sizes), 50)
    for _, f, style in guides:
        ax.plot(n, ref_y * f(n) / f(ref_n), style, color=GUIDE_COLOR, lw=1, zorder=1)


def guide_handles(guides=GUIDES) -> list[Line2D]:
    """Legend entries of the grey guides ("∝ N", ...)."""
    return [Line2D([], [], color=GUIDE_COLOR, ls=style, label=f"∝ {label}") for label, _, style in guides]


def point_handles() -> list[Line2D]:
    """Legend entries of the fit convention: filled point in the fit, hollow left out, fitted line."""
    return [Line2D([], [], color="0.3", marker="o", ls="none", label="point in the fit"),
            Line2D([], [], color="0.3", marker="o", ls="none", mfc="none", label="point left out of the fit"),
            Line2D([], [], color="0.3", ls="-", label="fitted line")]


def as_arrays(sizes, values) -> tuple[np.ndarray, np.ndarray]:
    """(N, values) as float arrays, None as nan (a gap on the plot).

    >>> from reports.style import as_arrays
    >>> as_arrays([1, 2], [0.5, None])
    (array([1., 2.]), array([0.5, nan]))
    """
    return np.asarray(sizes, float), np.asarray([np.nan if v is None else v for v in values], float)


def _fitted(s: SweepResult) -> np.ndarray:
    if len(s.fitted) == len(s.sizes):
        return np.asarray(s.fitted, bool)
    return np.ones(len(s.sizes), bool)


def sweep_points(ax, s: SweepResult, color: str, marker: str = "o", values=None, fit=None,
                 label: str | None = None, ms: float = 4) -> None:
    """Filled fitted points, hollow others, the fitted line over the fitted range, a failure mark."""
    n, t = as_arrays(s.sizes, s.seconds if values is None else values)
    keep = _fitted(s)
    ax.plot(n[keep], t[keep], marker, color=color, ms=ms, ls="none")
    ax.plot(n[~keep], t[~keep], marker, color=color, ms=ms, ls="none", mfc="none")
    if fit is not None and keep.any():
        nf = n[keep]
        ax.plot(nf, np.exp(fit.intercept) * nf**fit.slope, "-", color=color, lw=1.3)
    elif n.size > 1:
        ax.plot(n, t, "-", color=color, lw=0.8, alpha=0.6)
    if s.error is not None and s.error_n:
        ax.plot([s.error_n], [0.93], "X", color=color, ms=9, mec="tab:red", ls="none",
                transform=ax.get_xaxis_transform())
    if label is not None:
        ax.plot([], [], marker + "-", color=color, ms=ms, label=label)


def sweep_label(name: str, s: SweepResult, fit=None) -> str:
    """Legend text: "fast: 1.03 [0.98, 1.08]", or why there is no slope, and a failure."""
    fit = s.fit if fit is None else fit
    text = f"{name}: {fit_text(fit)}" if fit is not None else f"{name}: {'no fit' if s.sizes else 'not timed'}"
    if s.error is not None:
        text += f"; failed at N = {pow2_text(s.error_n)}" if s.error_n else "; failed"
    return text


def _drawn_texts(fig) -> list:
    """The visible, non-empty Text artists of a drawn figure: titles, suptitle, axis labels, the
    tick labels inside their axis' range, legend texts and titles, annotations."""
    from matplotlib.text import Text

    hidden_axes = [ax for ax in fig.axes if not ax.get_visible()]
    ticks: dict[int, tuple] = {}  # id(tick label) -> (axes, axis name): kept only inside the view
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            for label in (*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)):
                ticks[id(label)] = (ax, name)
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or t.axes in hidden_axes:
            continue
        if id(t) in ticks and not _in_view(t, *ticks[id(t)]):
            continue
        out.append(t)
    return out


def _in_view(label, ax, name: str) -> bool:
    """Whether a tick label of ``ax``'s ``name`` ("x" or "y") axis is drawn: matplotlib keeps the
    labels of ticks outside the view limits but does not draw them."""
    box, pos = ax.get_window_extent(), label.get_window_extent()
    lo, hi, mid = ((box.x0, box.x1, (pos.x0 + pos.x1) / 2) if name == "x" else
                   (box.y0, box.y1, (pos.y0 + pos.y1) / 2))
    return lo - 1 <= mid <= hi + 1


def text_overlaps(fig, pad: float = 0.5) -> list[str]:
    """Every pair of drawn texts whose boxes intersect (each box shrunk by ``pad`` pixels, so that
    texts which only touch pass), and every pair of legends whose boxes intersect, as readable
    lines; [] when nothing collides. Draws the figure (Agg) first. O(T²) for T texts.

    >>> import matplotlib.pyplot as plt
    >>> from reports.style import text_overlaps
    >>> fig, ax = plt.subplots()
    >>> _ = ax.text(0.5, 0.5, "left"); _ = ax.text(0.5, 0.5, "right")
    >>> text_overlaps(fig)
    ["'left' overlaps 'right'"]
    >>> plt.close(fig)
    """
    fig.canvas.draw()
    boxes = []
    for t in _drawn_texts(fig):
        b = t.get_window_extent()
        if b.width > 2 * pad and b.height > 2 * pad:
            boxes.append((t.get_text(), b.padded(-pad)))
    legends = [lg for ax in fig.axes if ax.get_visible() and (lg := ax.get_legend()) is not None]
    legends += list(fig.legends)
    found = [f"{a!r} overlaps {b!r}" for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
             if ba.overlaps(bb)]
    lboxes = [lg.get_window_extent().padded(-pad) for lg in legends]
    found += [f"legend {i} overlaps legend {j}" for i in range(len(lboxes)) for j in range(i + 1, len(lboxes))
              if lboxes[i].overlaps(lboxes[j])]
    return found
