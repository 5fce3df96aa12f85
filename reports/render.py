"""Turn a ReportData into files: the PNG figures, index.html and results.json in one folder."""
from __future__ import annotations

from pathlib import Path

from reports.data import ReportData


def write_report(data: ReportData, out_dir: str | Path) -> Path:
    """Write figures, index.html and results.json into ``out_dir``; returns the index.html path."""
    from reports.figures import make_figures
    from reports.html import build_page

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = make_figures(data, out)
    data.write_json(out / "results.json", figures=figures)
    index = out / "index.html"
    index.write_text(build_page(data, figures), encoding="utf-8")
    return index
