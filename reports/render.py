"""Results (+ asv results) -> files: the PNG figures and index.html in one folder."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from reports import figures as fig
from reports.check_plots import plot_check_figures
from reports.gpu import GpuRun, load_gpu, plot_gpu_sweeps
from reports.asv_history import AsvHistory, MechanismHistory, load_history, mechanism_histories, other_track_series
from reports.page import render_page
from reports.peers import PeersSummary, plot_peers
from reports.roofline import plot_roofline
from reports.training import plot_latent, plot_training_curves
from results.schema import Results


def make_figures(results: Results, out_dir: str | Path, history: AsvHistory | None = None,
                 histories: list[MechanismHistory] | None = None,
                 note: Callable[[str], None] = lambda msg: None,
                 peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> dict[str, Any]:
    """Write every figure into ``out_dir``; returns {key: file name or None}, with "variants":
    {mechanism id: file name}, "checks": the checks' own curves (reports.check_plots.CheckFigure
    list) and "track_benchmarks": the asv track_ benchmarks drawn.
    ``peers``: the peers summary (reports.peers.load_peers), drawn when it has rows; ``gpu``: the
    GPU run (reports.gpu.load_gpu): its sweeps and its peers' ratios."""
    gpu_peers = None
    if gpu is not None and (gpu.data.get("peers") or {}).get("summary"):
        gpu_peers = PeersSummary.from_dict(gpu.data["peers"]["summary"], gpu.path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    for key, draw in (("gallery", lambda: fig.plot_gallery(results.gallery, out)),
                      ("time", lambda: fig.plot_time(results, out)),
                      ("crossover", lambda: fig.plot_crossover(results, out)),
                      ("memory", lambda: fig.plot_memory(results, out)),
                      ("favor", lambda: fig.plot_favor(results.favor_error, out)),
                      ("peers", lambda: plot_peers(peers, out)),
                      ("roofline", lambda: plot_roofline(results, out)),
                      ("numerics", lambda: fig.plot_numerics(results, out)),
                      ("training_curves", lambda: plot_training_curves(results, out)),
                      ("training_latent", lambda: plot_latent(results, out)),
                      ("gpu_sweeps", lambda: plot_gpu_sweeps(gpu, out)),
                      ("gpu_peers", lambda: plot_peers(gpu_peers, out, "gpu_peers.png"))):
        note(f"figure: {key}")
        figures[key] = draw()
    note("figure: curves of the checks")
    figures["checks"] = plot_check_figures(results.checks, out)
    figures["variants"] = {}
    taken: set[str] = set()
    for m in results.mechanisms:
        if not fig.has_variant_view(results, m):
            continue
        name = f"variants_{fig.slug(m.id)}.png"
        while name in taken:  # two ids with the same slug
            name = name[:-4] + "_.png"
        taken.add(name)
        note(f"figure: variants of {m.id}")
        figures["variants"][m.id] = fig.plot_variants(results, m, out, name)
    figures["asv_history"] = figures["asv_track"] = None
    figures["track_benchmarks"] = []
    if history is not None and history.commits:
        if histories is None:
            histories = mechanism_histories(history, [m.id for m in results.mechanisms])
        claims = {m.id: m.complexity for m in results.mechanisms}
        note("figure: asv history")
        figures["asv_history"] = fig.plot_history(histories, history.commits, claims, out)
        track = other_track_series(history)
        figures["asv_track"] = fig.plot_track(track, history.commits, out)
        figures["track_benchmarks"] = list(track)[: fig.MAX_PANELS]
    return figures


def write_report(results: Results, out_dir: str | Path, asv_results: str | Path | None = None,
                 source: str = "results.json", note: Callable[[str], None] = lambda msg: None,
                 peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> Path:
    """Figures and index.html into ``out_dir`` (asv results re-read from ``asv_results`` when
    given); returns the index.html path. ``source``: how the page names the results file;
    ``peers``: the peers summary (None: the peers section says no peer run was found); ``gpu``:
    the GPU run (None: the GPU section says none was found)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = load_history(asv_results) if asv_results is not None else None
    histories = (mechanism_histories(history, [m.id for m in results.mechanisms])
                 if history is not None else [])
    figures = make_figures(results, out, history, histories, note, peers, gpu)
    index = out / "index.html"
    index.write_text(render_page(results, figures, history, histories, source, peers, gpu), encoding="utf-8")
    return index
