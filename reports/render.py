"""Results (+ asv results) -> files: every section's figures (PNG) and index.html in one folder."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from reports.asv_history import AsvHistory, MechanismHistory, load_history, mechanism_histories
from reports.page import SECTIONS, render_page
from reports.sections import PageInputs
from reports.sections.gpu import GpuRun, gpu_or_sample
from reports.sections.peers import PeersSummary
from results.schema import Results


def make_figures(results: Results, out_dir: str | Path, history: AsvHistory | None = None,
                 histories: list[MechanismHistory] | None = None,
                 note: Callable[[str], None] = lambda msg: None,
                 peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> dict[str, Any]:
    """Write every section's figures into ``out_dir``, in page order; returns {key: file name or
    None} (each section's ``FIGURES`` keys, e.g. "variants": {mechanism id: file name}, "checks":
    the checks' own curves, "track_benchmarks": the asv track_ benchmarks drawn).
    ``peers``: the peers summary (reports.sections.peers.load_peers), drawn when it has rows;
    ``gpu``: the GPU run (reports.sections.gpu.load_gpu): its sweeps and its peers' ratios.

    >>> from reports.render import make_figures
    >>> from results.schema import Results
    >>> import tempfile
    >>> make_figures(Results({}), tempfile.mkdtemp())["time"] is None  # nothing measured: no figure
    True
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if histories is None:
        histories = mechanism_histories(history, [m.id for m in results.mechanisms]) if history is not None else []
    inputs = PageInputs(results, history, histories, peers, gpu)
    figures: dict[str, Any] = {}
    for section in SECTIONS:
        if section.FIGURES:
            note(f"figures: {section.ID}")
            figures.update(section.draw(inputs, out, note))
    return figures


def write_report(results: Results, out_dir: str | Path, asv_results: str | Path | None = None,
                 source: str = "results.json", note: Callable[[str], None] = lambda msg: None,
                 peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> Path:
    """Figures and index.html into ``out_dir`` (asv results re-read from ``asv_results`` when
    given); returns the index.html path. ``source``: how the page names the results file;
    ``peers``: the peers summary (None: the peers section says no peer run was found); ``gpu``:
    the GPU run (None or not found: the GPU section shows the shipped sample run, labelled as one,
    reports.sections.gpu.gpu_or_sample).

    >>> from reports.render import write_report
    >>> from results.schema import Results
    >>> import tempfile
    >>> write_report(Results({"mode": "quick"}), tempfile.mkdtemp()).name
    'index.html'
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = load_history(asv_results) if asv_results is not None else None
    histories = (mechanism_histories(history, [m.id for m in results.mechanisms])
                 if history is not None else [])
    gpu = gpu_or_sample(gpu)
    figures = make_figures(results, out, history, histories, note, peers, gpu)
    index = out / "index.html"
    index.write_text(render_page(results, figures, history, histories, source, peers, gpu), encoding="utf-8")
    return index
