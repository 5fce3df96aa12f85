"""The page: the sections in order, each one's view gathered into one context and rendered through
Jinja2 templates.

``SECTIONS`` lists the section modules (reports.sections.*) in page order; the page numbers and
titles them, and includes each one's partial ``templates/sections/<module>.html.j2`` inside
``templates/index.html.j2``. ``page_context`` gathers the sections' views (rows of ready text:
units applied, fits formatted) and ``render_page`` fills the templates with it. Autoescaping is on,
so every value from the data (ids, check details, tracebacks, environment strings) is escaped; the
prose lives in the templates. The sections loop over Results.mechanisms and their variants: a newly
registered family appears with no change here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from reports import format as fmt
from reports.asv_history import AsvHistory, MechanismHistory, mechanism_histories
from reports.sections import (PageInputs, crossover, distributed, environment, favor, gallery, gpu, history, memory,
                              numerics, peers, roofline, summary, time_vs_n, training, variants, verification)
from reports.sections.gpu import GpuRun
from reports.sections.peers import PeersSummary
from results.schema import Results

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: The page's sections in order: its table of contents, its numbered headings, its figures.
SECTIONS = (summary, gallery, time_vs_n, crossover, memory, peers, roofline, variants, verification, numerics, favor,
            training, distributed, gpu, history, environment)
#: Sections shown folded (their heading only, one click opens them): the long ones a reader scanning the page
#: for "is it right, is it fast" does not need open (the summary table carries each one's headline number, and
#: the box at the top names every failed check and missed roofline target); the page stays under 15,000 px
#: at 1400 px wide (tests/reports/test_page_scan.py; a real quick report of 23 mechanisms measured 17,066 px
#: in headless Chromium with memory (3,277 px) and roofline (4,616 px) open).
FOLDED = ("gallery", "time", "memory", "peers", "roofline", "variants", "training", "distributed", "gpu", "history",
          "environment")
#: A folded section whose view shows nothing measured stays open: its one line names the command that fills it
#: (make bench-ops, make bench, make gpu-check) and costs no height.
EMPTY = {"peers": lambda v: not v["peers"].found or bool(v["peers"].error),
         "history": lambda v: v["history"] is None or not v["history"].commits,
         "gpu": lambda v: not v["gpu"].found or bool(v["gpu"].error),
         "distributed": lambda v: v["distributed"] is None and not v["distributed_check_rows"]}
#: A word beside a section's heading, in sight even when it is folded (the GPU section showing the shipped sample).
NOTES = {"gpu": lambda v: f"sample run ({v['gpu'].sample_label}), not yours" if v["gpu"].sample_for else ""}


@dataclass(frozen=True)
class Part:
    """One section as the page template places it: anchor, heading and the partial to include.

    >>> from reports.page import summary, Part
    >>> Part.of(summary)
    Part(id='summary', title='Summary', template='sections/summary.html.j2', open=True, note='')
    """

    id: str
    title: str
    template: str
    open: bool = True  # False: shown folded (FOLDED)
    note: str = ""  # beside the heading (NOTES)

    @classmethod
    def of(cls, section, view: dict[str, Any] | None = None) -> "Part":
        """The section's part; folded when FOLDED names it, unless its ``view`` shows nothing (EMPTY)."""
        empty = view is not None and section.ID in EMPTY and EMPTY[section.ID](view)
        note = NOTES[section.ID](view) if view is not None and section.ID in NOTES else ""
        return cls(section.ID, section.TITLE, f"sections/{section.__name__.rsplit('.', 1)[-1]}.html.j2",
                   section.ID not in FOLDED or empty, note)


def figure_defaults() -> dict[str, Any]:
    """{figure key: its value when not drawn} over every section (a missing figure reads "no data").

    >>> from reports.page import figure_defaults
    >>> figure_defaults()["time"], figure_defaults()["variants"]
    (None, {})
    """
    out: dict[str, Any] = {}
    for section in SECTIONS:
        out.update(copy.deepcopy(section.FIGURES))
    return out


def page_context(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """Everything the templates read: the page's header (mode, date, commit, source, the load
    warning, the table of contents) and every section's view. ``figures``: {key: file name or
    None} as reports.render.make_figures returns it (missing keys read as not drawn).

    Raises ValueError when two sections give the same template variable (one would hide the other).

    >>> from reports.page import page_context
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> ctx = page_context(PageInputs(Results({"mode": "quick"})), {})
    >>> ctx["mode"], ctx["toc"][0], len(ctx["parts"])
    ('quick', ('summary', 'Summary'), 16)
    """
    results = inputs.results
    env = results.environment or {}
    figures = {**figure_defaults(), **figures}
    load_warning = env.get("load_warning")
    ctx: dict[str, Any] = {
        "mode": env.get("mode", "?"), "date": env.get("date", ""), "commit": env.get("git_commit", ""),
        "load_warning": fmt.value_text(load_warning) if load_warning else "", "source": inputs.source,
        "mechanisms": results.mechanisms, "schema": results.schema, "figures": figures,
        "toc": [(s.ID, s.TITLE) for s in SECTIONS], "parts": []}
    for section in SECTIONS:
        view = section.view(inputs, figures)
        clash = sorted(set(view) & set(ctx))
        if clash:
            raise ValueError(f"section {section.ID!r} gives template variable(s) {clash} that another already gives")
        ctx.update(view)
        ctx["parts"].append(Part.of(section, view))
    return ctx


def environment() -> jinja2.Environment:
    """The Jinja2 environment: templates/ of this package, autoescaping for *.html(.j2), strict
    undefined names (a typo in a template fails the render instead of printing nothing).

    >>> from reports.page import environment
    >>> environment().get_template("macros.html.j2").name
    'macros.html.j2'
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(bytes=fmt.bytes_text, seconds=fmt.seconds_text, num=fmt.number, pow2=fmt.pow2_text,
                       fit=fmt.fit_text, ntext=fmt.n_text)
    return env


def render_page(results: Results, figures: dict[str, Any], history: AsvHistory | None = None,
                histories: list[MechanismHistory] | None = None, source: str = "results.json",
                peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> str:
    """index.html as a string. ``figures``: {key: file name or None} (reports.render.make_figures);
    ``histories`` default: mechanism_histories of ``history``; ``peers`` None reads as "no peer run
    found", ``gpu`` None as "no GPU run found".

    >>> from reports.page import render_page
    >>> from results.schema import Results
    >>> page = render_page(Results({"mode": "quick"}), {})
    >>> page.startswith("<!DOCTYPE html>"), '<h2>16. Environment</h2>' in page
    (True, True)
    >>> '<p class="allpass"' in page  # no checks in this results file: no verdict line either
    False
    """
    if histories is None:
        histories = mechanism_histories(history, [m.id for m in results.mechanisms]) if history is not None else []
    inputs = PageInputs(results, history, histories, peers, gpu, source)
    return environment().get_template("index.html.j2").render(**page_context(inputs, figures))
