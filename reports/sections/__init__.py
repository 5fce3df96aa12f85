"""The sections of the report page, one module each; reports.page lists them in page order.

Every section module holds the same four things, so a reader finds a section's table, its
figure and its HTML in one place::

    ID, TITLE          the section's anchor and heading (the page numbers it by its place)
    FIGURES            {figure key: value when not drawn} of the figures it draws
    draw(inputs, out_dir, note) -> {figure key: PNG file name or None}
    view(inputs, figures) -> {template variable: value}

and its template partial, ``templates/sections/<module>.html.j2`` (the body between the heading
and the end of the section), fills in from ``view``. The shared look of the figures is in
reports.style, numbers as text in reports.format.

    summary       one row per mechanism: exponents, crossover, memory, verified?
    gallery       the dense masks as heatmaps
    time_vs_n     time per call vs N, fast path and dense twin
    crossover     the N from which the fast path wins, and the speed-up
    memory        peak extra memory vs N
    peers         maskbench beside other libraries (the peer suite's summary)
    roofline      the perf/<id> checks' fractions of this machine's roofline
    variants      every swept variant of a mechanism side by side
    verification  every check, and the curves checks record
    numerics      float32 and bfloat16 against float64 (numerics/<id>)
    favor         the FAVOR+ estimation error vs m, and its attention error vs exact softmax
    training      learned latent graphs trained end to end
    distributed   sharded attention on several ranks: checks, scaling, bytes per rank
    gpu           the one-command GPU run
    history       asv results across commits
    environment   where the run was measured
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the section modules import this package
    from reports.asv_history import AsvHistory, MechanismHistory
    from reports.sections.gpu import GpuRun
    from reports.sections.peers import PeersSummary
    from results.schema import Results


@dataclass
class PageInputs:
    """What the page is made from: the results JSON, asv's history (None: no asv folder given)
    and its per-mechanism histories, the peer suite's summary and the GPU run (None: not found),
    and how the page names its results file.

    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> inputs = PageInputs(Results({"mode": "quick"}))
    >>> inputs.source, inputs.history, inputs.histories
    ('results.json', None, [])
    """

    results: Results
    history: AsvHistory | None = None
    histories: list[MechanismHistory] = field(default_factory=list)
    peers: PeersSummary | None = None
    gpu: GpuRun | None = None
    source: str = "results.json"
