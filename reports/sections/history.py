"""Section "History across commits (asv)": each mechanism's fitted exponent and fast-path time at a
fixed N across the commits asv has results for, and every other asv track_ benchmark.

The asv result files are read by reports.asv_history (re-read on every render); this module
tabulates and draws them.

>>> from reports.sections.history import ID, TITLE
>>> ID, TITLE
('history', 'History across commits (asv)')
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reports import format as fmt
from reports import style
from reports.asv_history import AsvHistory, AsvSeries, MechanismHistory, other_track_series
from reports.sections import PageInputs

ID = "history"
TITLE = "History across commits (asv)"
FIGURES: dict[str, Any] = {"asv_history": None, "asv_track": None, "track_benchmarks": []}


def _commit_axis(ax, commits: list[str]) -> None:
    ax.set_xticks(range(len(commits)), [c[:8] for c in commits], rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, max(len(commits) - 0.5, 0.5))
    ax.grid(True, alpha=0.3)


def _history_lines(ax, lines, commits: list[str]) -> list[float]:
    """Plot each line over the commit positions (gaps where a commit has no value); returns the values."""
    values = []
    for line, (color, marker), dash in zip(lines, style.line_styles(len(lines)), style.dashes(len(lines))):
        y = np.asarray([np.nan if v is None else v for v in line.values], float)
        ax.plot(range(len(commits)), y, dash, marker=marker, color=color, ms=5, lw=1.2, label=line.label)
        values += [v for v in y if np.isfinite(v)]
    return values


def _seconds_axis(ax, values: list[float]) -> None:
    """Seconds as "1.2 ms" ticks; a log axis only when the values span more than a decade (a
    narrow range on a log axis gets unreadable "1.1x10^-3" tick labels)."""
    from matplotlib.ticker import FuncFormatter

    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 10:
        ax.set_yscale("log")
    else:
        hi = max(pos) if pos else 1.0
        ax.set_ylim(0, hi * 1.15)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: fmt.seconds_text(y) if y > 0 else "0"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))


#: The exponent a class should fit (a guide on the exponent panels).
CLASS_EXPONENT = {"N": 1.0, "N log N": 1.0, "N log^2 N": 1.0, "N diam": 1.0, "N + E": 1.0, "N^2": 2.0}


def plot_history(histories: list[MechanismHistory], commits: list[str], claims: dict[str, str],
                 out_dir: Path, name: str = "asv_history.png") -> str | None:
    """Two panels per mechanism, x = commits in commit-date order (short hashes): its fitted
    exponent (asv track_exponent; grey guide: the class's exponent) and its fast path's time at
    a fixed N (asv time_attention). Without any time_attention result (``make report`` records
    only the exponents) one panel per mechanism: 23 empty time panels would say nothing."""
    if not histories or not commits:
        return None
    per = 2 if has_times(histories) else 1
    shown = histories[: style.MAX_PANELS // per]
    fig, axes = style.grid(per * len(shown), ncols=4, w=3.6, h=3.1)
    for i, h in enumerate(shown):
        ax_e, ax_t = axes[per * i], (axes[per * i + 1] if per == 2 else None)
        if h.exponent:
            values = _history_lines(ax_e, h.exponent, commits)
            claim = claims.get(h.mechanism)
            if claim in CLASS_EXPONENT:
                ax_e.axhline(CLASS_EXPONENT[claim], ls="--", color=style.GUIDE_COLOR, lw=1)
                values.append(CLASS_EXPONENT[claim])
            if values:  # at least +-0.15 around the data: commit-to-commit noise should look small
                ax_e.set_ylim(min(values) - 0.15, max(values) + 0.15)
        else:
            style.no_data(ax_e, "no track_exponent results")
        ax_e.set_title(f"{h.mechanism}: fitted exponent", fontsize=9)
        ax_e.set_ylabel("exponent", fontsize=8)
        if ax_t is None:
            _commit_axis(ax_e, commits)
            continue
        if h.time:
            _seconds_axis(ax_t, _history_lines(ax_t, h.time, commits))
        else:
            style.no_data(ax_t, "no time_attention results for 'fast'")
        ax_t.set_title(f"{h.mechanism}: fast path at N = {fmt.pow2_text(h.time_n)}" if h.time_n else
                       f"{h.mechanism}: fast path", fontsize=9)
        ax_t.set_ylabel("time per call", fontsize=8)
        for ax in (ax_e, ax_t):
            _commit_axis(ax, commits)
            if len(ax.get_legend_handles_labels()[0]) > 1:
                style.legend_below(ax, fontsize=6)
    return style.save(fig, out_dir, name)


def has_times(histories: list[MechanismHistory]) -> bool:
    """Whether any mechanism has asv time_attention results (the figure's time panels).

    >>> from reports.sections.history import has_times
    >>> from reports.asv_history import MechanismHistory
    >>> has_times([MechanismHistory("linear", "linear")])
    False
    """
    return any(h.time for h in histories)


def plot_track(series: dict[str, list[AsvSeries]], commits: list[str], out_dir: Path,
               name: str = "asv_track.png") -> str | None:
    """Every other asv track_ benchmark across commits: one panel per benchmark, one line per
    parameter combination (legend below the panel)."""
    if not series or not commits:
        return None
    benches = list(series)[:style.MAX_PANELS]
    fig, axes = style.grid(len(benches), ncols=3, w=4.4, h=3.6)
    x_of = {c: i for i, c in enumerate(commits)}
    for ax, bench in zip(axes, benches):
        lines = series[bench]
        for s, (color, marker), dash in zip(lines, style.line_styles(len(lines)), style.dashes(len(lines))):
            ax.plot([x_of[c] for c in s.commits], s.values, dash, marker=marker, color=color, ms=4, lw=1,
                    label=s.label)
        values = [v for s in lines for v in s.values if v is not None]
        if values and min(values) > 0 and max(values) / min(values) > 30:
            ax.set_yscale("log")
        ax.set_title(bench, fontsize=8)
        _commit_axis(ax, commits)
        style.legend_below(ax, ncol=2, fontsize=6)
    return style.save(fig, out_dir, name)


# ------------------------------------------------------------------------------- table


@dataclass
class HistoryView:
    results_dir: str
    files: int
    commits: list[tuple[str, str]]  # (short hash, date)
    rows: list[tuple[str, list[str]]]  # (mechanism, one cell per commit)
    notes: list[str]
    errors: list[str]
    figure: str | None
    track_figure: str | None
    track_benchmarks: list[str]
    mechanisms: int
    times: bool = True  # any time_attention result (else the figure has exponent panels only)


def _commit_dates(history: AsvHistory) -> dict[str, str]:
    out = {}
    for s in history.series:
        for c, ms in zip(s.commits, s.dates_ms):
            if ms:
                out[c] = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return out


def history_view(history: AsvHistory | None, histories: list[MechanismHistory], figure: str | None,
                 track_figure: str | None, track_benchmarks: list[str]) -> HistoryView | None:
    if history is None:
        return None
    dates = _commit_dates(history)
    rows = []
    for h in histories:
        cells = []
        for i in range(len(history.commits)):
            e = next((line.values[i] for line in h.exponent if line.values[i] is not None), None)
            t = next((line.values[i] for line in h.time if line.values[i] is not None), None)
            parts = [f"exp {e:.2f}" if e is not None else "", fmt.seconds_text(t) if t is not None else ""]
            cells.append(" · ".join(p for p in parts if p) or fmt.DASH)
        rows.append((h.mechanism, cells))
    notes = [f"{h.mechanism}: time at N = {fmt.pow2_text(h.time_n)}, {h.time_note}"
             for h in histories if h.time_n is not None and not h.time_note.startswith("largest")]
    return HistoryView(history.results_dir, history.files, [(c[:8], dates.get(c, "")) for c in history.commits],
                       rows, notes, history.errors, figure, track_figure, track_benchmarks, len(histories),
                       has_times(histories))


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"asv_history", "asv_track": the figures' file names or None, "track_benchmarks": the
    track_ benchmarks drawn} (nothing drawn without asv results).

    >>> from reports.sections.history import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'asv_history': None, 'asv_track': None, 'track_benchmarks': []}
    """
    history = inputs.history
    if history is None or not history.commits:
        return {"asv_history": None, "asv_track": None, "track_benchmarks": []}
    claims = {m.id: m.complexity for m in inputs.results.mechanisms}
    note("figure: asv history")
    track = other_track_series(history)
    return {"asv_history": plot_history(inputs.histories, history.commits, claims, out_dir),
            "asv_track": plot_track(track, history.commits, out_dir),
            "track_benchmarks": list(track)[: style.MAX_PANELS]}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"history": history_view (None when no asv results folder was given)}.

    >>> from reports.sections.history import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'history': None}
    """
    return {"history": history_view(inputs.history, inputs.histories, figures.get("asv_history"),
                                    figures.get("asv_track"), figures.get("track_benchmarks", []))}
