"""Section "GPU": the one-command GPU run (``make gpu-check``), read from its results JSON.

``python -m measure.gpu`` writes ``reports/out/gpu.json`` (schema ``maskbench-gpu/1``): the
GPU and its software versions, every CUDA test's outcome, every ``verify --device cuda --quick``
check, the fast paths' time and peak GPU memory vs N, and the peer suite's summary on the GPU.
This module reads it (``load_gpu``: a missing or unreadable file becomes a run that says so,
never an exception), turns it into the page's rows (``gpu_view``) and draws time and memory vs N
(``plot_gpu_sweeps``); the peers reuse reports.sections.peers' view and figure. It measures
nothing.

>>> from reports.sections.gpu import ID, TITLE
>>> ID, TITLE
('gpu', 'GPU: tests, checks, time, memory and peers on CUDA')
"""
from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.lines import Line2D

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from reports.sections.peers import PeersSummary, PeersView, peers_view, plot_peers
from results.schema import Fit

ID = "gpu"
TITLE = "GPU: tests, checks, time, memory and peers on CUDA"
FIGURES: dict[str, Any] = {"gpu_sweeps": None, "gpu_peers": None}
SCHEMA = "maskbench-gpu/1"
COMMAND = "make gpu-check"
#: A real run of ``make gpu-check`` shipped with the sources: the section shows it, labelled as a
#: sample, when the user has no GPU run of their own (a clone without a GPU still sees what the
#: section holds).
SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "runs" / "gpu-h100-2026-11-27.json"
#: A later run of the causal stage alone (``python -m measure.gpu --skip-tests --skip-checks
#: --skip-sweeps --skip-peers``, after the kernels' changes of 2026-11-28, without fla-core): the
#: sample's page takes its causal tables from it (the sample's own causal stage reached 6 points,
#: on the code before those changes).
SAMPLE_CAUSAL = Path(__file__).resolve().parents[2] / "docs" / "runs" / "causal-h100-2026-11-28b.json"


@dataclass
class GpuRun:
    """The GPU results JSON as the page sees it: ``found`` False when there is no file at
    ``path``; ``error`` when it exists but cannot be read; ``data`` the JSON object."""

    path: str
    found: bool = False
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    #: set when this is the shipped sample shown in place of the user's missing run: the path of the run
    #: that was looked for
    sample_for: str = ""


def gpu_or_sample(run: GpuRun | None, sample: str | Path = SAMPLE) -> GpuRun | None:
    """``run`` when it was found (even unreadable: the page says why); else the shipped sample
    run (``sample_for`` naming where the user's run was looked for), or ``run`` when there is no
    readable sample either.

    >>> from reports.sections.gpu import GpuRun, gpu_or_sample
    >>> gpu_or_sample(GpuRun("reports/out/gpu.json")).sample_for
    'reports/out/gpu.json'
    >>> gpu_or_sample(GpuRun("x.json"), sample="no-such.json").sample_for
    ''
    """
    if run is not None and run.found:
        return run
    shipped = load_gpu(sample)
    if not shipped.found or shipped.error:
        return run
    shipped.sample_for = run.path if run is not None else ""
    return shipped


def load_gpu(path: str | Path) -> GpuRun:
    """The GPU run at ``path`` (missing: found=False; unreadable or another schema: ``error``)."""
    found, data, error = fmt.read_json(path)
    if not found or error:
        return GpuRun(str(path), found, error)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        return GpuRun(str(path), True, f"schema {got!r}; this report reads {SCHEMA!r} (re-run `{COMMAND}`)")
    return GpuRun(str(path), True, "", data)


# ------------------------------------------------------------------------------- view


@dataclass
class SweepRow:
    mechanism: str
    complexity: str
    exponent: str
    points: str  # "2^10 .. 2^17 (8 N)"
    time_last: str
    memory_last: str
    error: str


@dataclass
class CheckRow:
    id: str
    status: str
    statistic: str
    threshold: str
    seconds: str
    reason: str


@dataclass
class GpuView:
    found: bool
    path: str
    error: str = ""
    command: str = COMMAND
    sample_for: str = ""  # the shipped sample is shown: where the user's own run was looked for
    sample_label: str = ""  # "NVIDIA H200, 2026-11-27, commit 462e2e7"
    env_rows: list[tuple[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stage_rows: list[tuple[str, str, str]] = field(default_factory=list)  # stage, seconds, note
    tests_tally: dict[str, int] = field(default_factory=dict)
    tests_bad: list[dict] = field(default_factory=list)
    tests_all: list[dict] = field(default_factory=list)
    checks_tally: dict[str, int] = field(default_factory=dict)
    checks: list[CheckRow] = field(default_factory=list)
    checks_only: list[str] = field(default_factory=list)  # the run's --only prefixes (empty: every quick check)
    sweeps: list[SweepRow] = field(default_factory=list)
    sweep_note: str = ""
    peers: PeersView | None = None
    peers_note: str = ""
    causal_vs_fla: list[tuple[str, ...]] = field(default_factory=list)  # N, dtype, pass, fla, driver, ratio, attend ratio
    causal_favor: list[tuple[str, ...]] = field(default_factory=list)  # N, pass, FAVOR+, given, ratio
    causal_crossover: list[tuple[str, str, str]] = field(default_factory=list)  # pass, N, interval
    causal_note: str = ""
    #: where the causal tables come from when not from this run (the sample's later causal run)
    causal_source: str = ""


def _crossing_text(n: object) -> str:
    """measure.gpu.crossing's value as words: a number is an N, "below" FAVOR+ wins everywhere."""
    if n is None:
        return "no crossover on the grid"
    if n == "below":
        return "below the grid"
    return f"{float(n):,.0f}"


def _causal_rows(view: "GpuView", causal: dict) -> None:
    """The causal stage's summary (measure.gpu.causal_summary) as the section's three tables."""
    summary = causal.get("summary") or {}
    ratio = lambda x: fmt.DASH if x is None else f"{x:.2f}"  # noqa: E731
    for r in summary.get("vs_fla") or []:
        view.causal_vs_fla.append((fmt.pow2_text(r["n"]), r["dtype"], r["pass"], fmt.seconds_text(r.get("fla_s")),
                                   fmt.seconds_text(r.get("maskbench_s")), ratio(r.get("fla_over_maskbench")),
                                   ratio(r.get("fla_over_attend"))))
    for r in summary.get("favor_vs_given") or []:
        view.causal_favor.append((fmt.pow2_text(r["n"]), r["pass"], fmt.seconds_text(r.get("favor_s")),
                                  fmt.seconds_text(r.get("given_s")), ratio(r.get("favor_over_given"))))
    for pass_, c in (summary.get("crossover") or {}).items():
        lo, hi = (list(c.get("interval") or []) + [None, None])[:2]
        view.causal_crossover.append((pass_, _crossing_text(c.get("n")),
                                      f"[{_crossing_text(lo)}, {_crossing_text(hi)}]"))
    if not (view.causal_vs_fla or view.causal_favor or view.causal_crossover):
        view.causal_note = _stage_note(causal) if causal else "the causal stage was not run"


def _sample_causal(view: "GpuView", own: dict, path: Path | None = None) -> dict:
    """The causal stage of SAMPLE_CAUSAL (``path``) for the sample's page, its source named in
    ``view.causal_source``; ``own`` (the sample's own stage) where that file cannot be read."""
    path = SAMPLE_CAUSAL if path is None else path
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return own
    env = data.get("environment") or {}
    view.causal_source = ", ".join(str(x) for x in (
        str(Path("docs") / "runs" / Path(path).name), env.get("gpu"), str(env.get("date") or "")[:10],
        env.get("git_commit") and f"commit {env['git_commit']}") if x)
    return data.get("causal") or own


def _stage_note(stage: dict | None) -> str:
    if not stage:
        return "not run"
    if stage.get("skipped"):
        return f"skipped: {stage['skipped']}"
    parts = []
    if stage.get("timed_out"):
        parts.append("stopped at its time limit: the rows below are what finished")
    if stage.get("returncode") not in (None, 0):
        parts.append(f"exit status {stage['returncode']}")
    return "; ".join(parts) or "completed"


def _env_rows(env: dict) -> list[tuple[str, str]]:
    versions = env.get("versions") or {}
    rows = [("GPU", f"{env.get('gpu', '?')} (compute capability {env.get('capability', '?')}, "
                    f"{fmt.bytes_text(env.get('gpu_memory_bytes'))}, {env.get('multiprocessors', '?')} SMs)"),
            ("driver", str(env.get("driver") or fmt.DASH)),
            ("CUDA runtime (torch's)", str(env.get("cuda_runtime") or fmt.DASH)),
            ("cuDNN", str(env.get("cudnn") or fmt.DASH)),
            ("TF32 matmul", str(env.get("tf32_matmul"))),
            ("versions", ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items()) or fmt.DASH),
            ("host", f"{env.get('host', '?')}, {env.get('cpus', '?')} CPUs, Python {env.get('python', '?')}"),
            ("commit, date", f"{env.get('git_commit') or '?'}, {env.get('date') or '?'}")]
    return rows


def _sweep_row(c: dict) -> SweepRow:
    sizes = c.get("sizes") or []
    fit = Fit.from_dict(c.get("fit"))
    return SweepRow(
        mechanism=c.get("mechanism", "?"), complexity=fmt.class_text(c.get("complexity", "?")),
        exponent=fmt.fit_text(fit) if fit is not None else fmt.DASH,
        points=(f"{fmt.pow2_text(sizes[0])} .. {fmt.pow2_text(sizes[-1])} ({len(sizes)} N)" if sizes else fmt.DASH),
        time_last=(f"{fmt.seconds_text(c['seconds'][-1])} at N = {fmt.pow2_text(sizes[-1])}" if sizes else fmt.DASH),
        memory_last=(f"{fmt.bytes_text(c['peak_bytes'][-1])}" if sizes and c.get("peak_bytes") else fmt.DASH),
        error=c.get("error") or "")


def _check_row(r: dict) -> CheckRow:
    unit = r.get("unit")
    stat, thr = fmt.as_float(r.get("statistic")), fmt.as_float(r.get("threshold"))
    reasons = (r.get("details") or {}).get("reasons") or []
    error = (r.get("details") or {}).get("error")
    sign = fmt.compare_sign(r.get("compare"))
    return CheckRow(id=r.get("id", "?"), status=r.get("status", "?"), statistic=fmt.with_unit(stat, unit),
                    threshold=(f"{sign} " if sign else "") + fmt.with_unit(thr, unit),
                    seconds=f"{float(r.get('seconds') or 0):.1f}",
                    reason=str(reasons[0]) if r.get("status") == "fail" and reasons else (error or ""))


def gpu_view(run: GpuRun | None) -> GpuView:
    """The page's view of a GPU run (None: no run)."""
    if run is None or not run.found or run.error:
        return GpuView(found=bool(run and run.found), path=run.path if run else "", error=run.error if run else "")
    d = run.data
    view = GpuView(found=True, path=run.path, env_rows=_env_rows(d.get("environment") or {}),
                   failures=[str(x) for x in d.get("failures") or []])
    if run.sample_for or run.path == str(SAMPLE):
        env = d.get("environment") or {}
        view.sample_for = run.sample_for or "reports/out/gpu.json"
        view.sample_label = ", ".join(str(x) for x in (env.get("gpu"), str(env.get("date") or "")[:10],
                                                      env.get("git_commit") and f"commit {env['git_commit']}") if x)
        view.path = str(Path("docs") / "runs" / Path(run.path).name)  # as a reader of the repository finds it
    seconds = d.get("stage_seconds") or {}
    for stage in ("tests", "checks", "sweeps", "causal", "peers"):
        view.stage_rows.append((stage, fmt.seconds_text(seconds.get(stage)), _stage_note(d.get(stage))))
    if "seconds" not in d:
        view.failures.insert(0, "the run did not finish: this file holds the stages that did")
    tests = d.get("tests") or {}
    cases = tests.get("cases") or []
    view.tests_tally = {o: sum(c.get("outcome") == o for c in cases) for o in ("passed", "failed", "error", "skipped")}
    view.tests_bad = [c for c in cases if c.get("outcome") in ("failed", "error")]
    view.tests_all = cases
    checks = (d.get("checks") or {}).get("results") or []
    view.checks = [_check_row(r) for r in checks]
    view.checks_only = [str(x) for x in d.get("checks_only") or []]
    view.checks_tally = {s: sum(c.status == s for c in view.checks) for s in ("pass", "fail", "inconclusive", "skip")}
    sweeps = d.get("sweeps") or {}
    view.sweeps = [_sweep_row(c) for c in sweeps.get("curves") or []]
    if sweeps.get("curves"):
        view.sweep_note = (f"median of {sweeps.get('rounds', '?')} synchronised measurements per point, "
                           f"{fmt.seconds_text(sweeps.get('seconds'))} for the stage")
    causal = d.get("causal") or {}
    if view.sample_for:
        causal = _sample_causal(view, causal)
    _causal_rows(view, causal)
    peers = d.get("peers") or {}
    if peers.get("summary"):
        view.peers = peers_view(PeersSummary.from_dict(peers["summary"], f"{run.path} (peers)"))
        view.peers.command = COMMAND  # the text says which command ran the suite
    else:
        view.peers_note = peers.get("summary_error") or peers.get("skipped") or "the peer suite was not run"
    return view


# ------------------------------------------------------------------------------- figures


def plot_gpu_sweeps(run: GpuRun | None, out_dir: Path, name: str = "gpu_sweeps.png") -> str | None:
    """Two panels: seconds per call and peak extra GPU memory vs N, one line per mechanism (fast
    path, default variant, float32), legend at the right; grey guides ∝ N and ∝ N² through the
    median curve's last point."""
    if run is None or not run.data:
        return None
    curves = [c for c in (run.data.get("sweeps") or {}).get("curves") or [] if c.get("sizes")]
    if not curves:
        return None
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12.5, 5.2), layout="constrained")
    styles = style.line_styles(len(curves))
    for c, (color, marker), dash in zip(curves, styles, style.dashes(len(curves))):
        n = np.asarray(c["sizes"], float)
        ax_t.plot(n, np.asarray(c["seconds"], float) * 1e3, dash, color=color, marker=marker, ms=4, lw=1)
        peaks = np.maximum(np.asarray(c.get("peak_bytes") or [np.nan] * len(n), float), 4096.0) / 2**20
        ax_m.plot(n, peaks, dash, color=color, marker=marker, ms=4, lw=1, label=c["mechanism"])
    all_n = [n for c in curves for n in c["sizes"]]
    g = np.geomspace(min(all_n), max(all_n), 50)
    for ax, values in ((ax_t, [c["seconds"][-1] * 1e3 for c in curves]),
                       (ax_m, [max(c["peak_bytes"][-1], 4096) / 2**20 for c in curves if c.get("peak_bytes")])):
        ax.set(yscale="log", xlabel="N")
        if values:
            ref = float(np.median(values))
            ylim = ax.get_ylim()  # the data's range: a guide must not stretch the axis
            for label, f, ls in (style.GUIDES[0], style.GUIDES[2]):
                ax.plot(g, ref * f(g) / f(max(all_n)), ls, color=style.GUIDE_COLOR, lw=1, zorder=1)
            ax.set_ylim(ylim)
        style.log2_x(ax)
        ax.grid(True, alpha=0.3)
    ax_t.set(ylabel="milliseconds per call (median)", title="time vs N")
    ax_m.set(ylabel="peak extra GPU memory (MiB)", title="memory vs N")
    handles = ax_m.get_legend_handles_labels()[0] + [
        Line2D([], [], color=style.GUIDE_COLOR, ls=style.GUIDES[0][2], label="∝ N"),
        Line2D([], [], color=style.GUIDE_COLOR, ls=style.GUIDES[2][2], label="∝ N²")]
    ax_m.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=7)
    return style.save(fig, out_dir, name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"gpu_sweeps": plot_gpu_sweeps, "gpu_peers": the run's peers drawn as the Peers section
    draws them} (None where the run has no such data).

    >>> from reports.sections.gpu import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> draw(PageInputs(None), Path("."), print)
    {'gpu_sweeps': None, 'gpu_peers': None}
    """
    gpu, gpu_peers = inputs.gpu, None
    if gpu is not None and (gpu.data.get("peers") or {}).get("summary"):
        gpu_peers = PeersSummary.from_dict(gpu.data["peers"]["summary"], gpu.path)
    return {"gpu_sweeps": plot_gpu_sweeps(gpu, out_dir), "gpu_peers": plot_peers(gpu_peers, out_dir, "gpu_peers.png")}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"gpu": gpu_view of the run (None reads as "no GPU run found")}.

    >>> from reports.sections.gpu import view
    >>> from reports.sections import PageInputs
    >>> view(PageInputs(None), {})["gpu"].found
    False
    """
    return {"gpu": gpu_view(inputs.gpu)}
