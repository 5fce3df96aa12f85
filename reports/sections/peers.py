"""Section "Peers": maskbench beside other attention libraries, read from the peers summary JSON.

``make bench-ops`` runs the pytest-benchmark peer suite (benchmarks/) and writes its summary,
``benchmarks/out/peers-summary.json`` (schema ``maskbench-peers/1``, written by
benchmarks/summary.py). One row per (op, pass, peer, B, H, N, d, m)::

    ratio = peer_s / maskbench_s        (medians over rounds, seconds per call; > 1: maskbench faster)
    [ratio_low, ratio_high]             95% bootstrap interval of that ratio of medians
    max_rel_diff                        the equivalence assertion's measured difference (same function)

This module reads that file (``load_peers``: a missing or unreadable file becomes a summary that
says so, never an exception), turns it into the page's rows (``peers_view``) and draws ratio vs N
per (op, pass) (``plot_peers``). It measures nothing: the numbers are the suite's. The GPU
section shows its run's peers with the same view and figure.

>>> from reports.sections.peers import ID, TITLE
>>> ID, TITLE
('peers', 'Peers: maskbench beside other libraries')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from reports import format as fmt
from reports import style
from reports.sections import PageInputs

ID = "peers"
TITLE = "Peers: maskbench beside other libraries"
FIGURES: dict[str, Any] = {"peers": None}
SCHEMA = "maskbench-peers/1"
COMMAND = "make bench-ops"
#: Panel order: the issue's operations, then any other op in first-seen order.
OPS = ("favor", "favor-causal", "elu", "elu-causal", "linear-causal", "softmax", "softmax-flash",
       "softmax-efficient", "softmax-math")
PASSES = ("forward", "forward+backward")
#: A fixed colour per known peer, the same in every panel; others get the next tab10 colours.
PEER_COLORS = {"performer-pytorch": "tab:orange", "pytorch-fast-transformers": "tab:green",
               "torch-sdpa": "tab:purple", "fla-core": "tab:brown", "torch-sdpa-flash": "tab:pink",
               "torch-sdpa-efficient": "tab:cyan", "torch-sdpa-math": "tab:olive"}
#: The dtype a row is taken in when it names none; a row in another dtype is its own op ("op (bfloat16)"),
#: so its own panel: a ratio in bfloat16 is not a point on the float32 line.
DEFAULT_DTYPE = "float32"
#: (line style, marker) per (d, m) in increasing order, the same in every panel.
DM_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (1, 3)), "v"))
#: Fields a row must carry (numbers unless named in _TEXT).
_REQUIRED = ("op", "pass", "peer", "N", "maskbench_s", "peer_s")
_TEXT = ("op", "pass", "peer")
_INTS = ("B", "H", "N", "d", "m")
_FLOATS = ("maskbench_s", "peer_s", "ratio", "ratio_low", "ratio_high", "max_rel_diff")
#: Ratio-axis ticks (log scale), the ones inside the data range are shown; the finer list where
#: the coarse one leaves fewer than four in a narrow range.
RATIO_TICKS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.4, 2.0, 3.0, 5.0, 10.0, 20.0)
FINE_RATIO_TICKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0)


# ------------------------------------------------------------------------------- data


@dataclass
class PeerRow:
    """One comparison of the summary: maskbench and one peer on the same work (Schema A)."""

    op: str
    phase: str  # the summary's "pass" (a Python keyword)
    peer: str
    N: int
    maskbench_s: float
    peer_s: float
    ratio: float
    ratio_low: float | None = None
    ratio_high: float | None = None
    B: int | None = None
    H: int | None = None
    d: int | None = None
    m: int | None = None
    rounds: list[int] = field(default_factory=list)
    max_rel_diff: float | None = None

    @property
    def slower(self) -> bool:
        """maskbench clearly slower: the whole 95% interval of peer / maskbench lies below 1."""
        return self.ratio_high is not None and self.ratio_high < 1.0

    @property
    def faster(self) -> bool:
        """maskbench clearly faster: the whole interval lies above 1."""
        return self.ratio_low is not None and self.ratio_low > 1.0

    @classmethod
    def from_dict(cls, d: dict) -> "PeerRow":
        """KeyError / TypeError / ValueError naming the field when a required one is missing or wrong."""
        if not isinstance(d, dict):
            raise TypeError(f"a row must be an object, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if d.get(k) is None]
        if missing:
            raise KeyError(f"missing {', '.join(missing)}")
        vals: dict[str, Any] = {k: str(d[k]) for k in _TEXT}
        for k in _INTS:
            v = fmt.as_float(d.get(k))
            if d.get(k) is not None and (v is None or not math.isfinite(v)):
                raise ValueError(f"{k} is not a number: {d.get(k)!r}")
            vals[k] = None if v is None else int(v)
        for k in _FLOATS:
            v = fmt.as_float(d.get(k))
            if d.get(k) is not None and v is None:
                raise ValueError(f"{k} is not a number: {d.get(k)!r}")
            vals[k] = v
        if vals["ratio"] is None:  # the summary's definition, where a writer left it out
            vals["ratio"] = vals["peer_s"] / vals["maskbench_s"] if vals["maskbench_s"] else math.inf
        rounds = d.get("rounds") or []
        vals["rounds"] = [int(r) for r in rounds] if isinstance(rounds, (list, tuple)) else [int(rounds)]
        vals["phase"] = vals.pop("pass")
        dtype = d.get("dtype")
        if dtype is not None and str(dtype) != DEFAULT_DTYPE:
            vals["op"] = f"{vals['op']} ({dtype})"
        return cls(**vals)


@dataclass
class PeersSummary:
    """The peers summary as the page sees it. ``found`` False: no file at ``path`` (the section
    says how to make one); ``error``: the file exists but could not be read (shown, not raised);
    ``row_errors``: rows left out, each with why."""

    path: str
    found: bool = False
    error: str = ""
    schema: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, str | None] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    rows: list[PeerRow] = field(default_factory=list)
    row_errors: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Any, path: str = "") -> "PeersSummary":
        if not isinstance(d, dict):
            return cls(path, True, f"expected a JSON object, got {type(d).__name__}")
        schema = str(d.get("schema", ""))
        if schema != SCHEMA:
            return cls(path, True, f"schema {schema or 'missing'!r}; this report reads {SCHEMA!r} "
                                   f"(re-run `{COMMAND}`)", schema)
        rows, errors = [], []
        for i, r in enumerate(d.get("rows") or []):
            try:
                rows.append(PeerRow.from_dict(r))
            except (KeyError, TypeError, ValueError) as exc:
                errors.append(f"row {i}: {exc.args[0] if exc.args else type(exc).__name__}")
        env = d.get("environment") if isinstance(d.get("environment"), dict) else {}
        peers = d.get("peers") if isinstance(d.get("peers"), dict) else {}
        skipped = d.get("skipped") or []
        skipped = [str(s) for s in skipped] if isinstance(skipped, (list, tuple)) else [str(skipped)]
        versions = {str(k): (None if v is None else str(v)) for k, v in peers.items()}
        return cls(path, True, "", schema, dict(env), versions, skipped, rows, errors)


def load_peers(path: str | Path) -> PeersSummary:
    """The summary at ``path``; a missing file gives found=False, an unreadable one ``error``."""
    found, data, error = fmt.read_json(path)
    if not found or error:
        return PeersSummary(str(path), found, error)
    return PeersSummary.from_dict(data, str(path))


def _ordered(values, first: tuple[str, ...]) -> list[str]:
    seen = list(dict.fromkeys(values))
    return [v for v in first if v in seen] + [v for v in seen if v not in first]


def op_order(rows: list[PeerRow]) -> list[str]:
    return _ordered([r.op for r in rows], OPS)


def pass_order(rows: list[PeerRow]) -> list[str]:
    return _ordered([r.phase for r in rows], PASSES)


def peer_order(rows: list[PeerRow]) -> list[str]:
    return _ordered([r.peer for r in rows], tuple(PEER_COLORS))


def dm_text(d: int | None, m: int | None) -> str:
    """"d = m = 64", "d = 64, m = 32", "d = 64"."""
    if d is not None and d == m:
        return f"d = m = {d}"
    return ", ".join(f"{k} = {v}" for k, v in (("d", d), ("m", m)) if v is not None) or "d, m not recorded"


def line_key(r: PeerRow, with_bh: bool) -> tuple:
    """What one line of a panel shares besides (op, pass): the peer, d, m (and B, H where they vary)."""
    return (r.peer, r.d if r.d is not None else -1, r.m if r.m is not None else -1) + \
        ((r.B if r.B is not None else -1, r.H if r.H is not None else -1) if with_bh else ())


def _varies_bh(rows: list[PeerRow]) -> bool:
    return len({(r.B, r.H) for r in rows}) > 1


def interval_text(r: PeerRow) -> str:
    """"1.22 [1.15, 1.30]" (ratio and its 95% interval), "1.22 [no interval]"."""
    ratio = fmt.number(r.ratio, ".2f") if fmt.finite(r.ratio) else fmt.number(r.ratio)
    if r.ratio_low is None or r.ratio_high is None:
        return f"{ratio} [no interval]"
    return f"{ratio} [{fmt.number(r.ratio_low, '.2f')}, {fmt.number(r.ratio_high, '.2f')}]"


# ------------------------------------------------------------------------------- view


@dataclass
class PeerTableRow:
    op: str
    phase: str
    peer: str
    shape: str  # "B = 1, H = 4"
    n: str
    dm: str
    maskbench: str
    peer_time: str
    ratio: str
    rounds: str
    max_rel_diff: str
    css: str  # "slower" (ratio_high < 1), "faster" (ratio_low > 1) or ""


@dataclass
class PivotRow:
    """One line of the figure as a table row: ratio [interval] per N."""

    op: str
    phase: str
    peer: str
    dm: str
    cells: list[tuple[str, str]]  # (text, css) per PeersView.sizes


@dataclass
class PeersView:
    path: str
    found: bool
    error: str
    skipped: list[str]
    row_errors: list[str]
    env_rows: list[tuple[str, str]]
    versions: list[tuple[str, str]]
    sizes: list[str]
    pivot: list[PivotRow]
    rows: list[PeerTableRow]
    slower: int
    faster: int
    command: str = COMMAND


#: Environment keys shown first, in this order (any others follow as recorded).
ENV_KEYS = ("torch", "threads", "device", "dtype", "machine", "commit", "datetime")


def peers_view(summary: PeersSummary | None) -> PeersView:
    """The section's rows: the per-N pivot (the figure as a table) and every comparison, sorted by
    op, pass, peer, d, m, N; ``summary`` None reads as "no peer run found"."""
    if summary is None:
        summary = PeersSummary("")
    env = summary.environment
    env_rows = [(k, fmt.value_text(env[k])) for k in ENV_KEYS if env.get(k) is not None]
    env_rows += [(k, fmt.value_text(v)) for k, v in env.items() if k not in ENV_KEYS and v is not None]
    versions = [(name, v if v else "not installed") for name, v in summary.peers.items()]
    rows = summary.rows
    ops, passes, peers = op_order(rows), pass_order(rows), peer_order(rows)
    bh = _varies_bh(rows)

    def sort_key(r: PeerRow):
        return (ops.index(r.op), passes.index(r.phase), peers.index(r.peer), r.d or 0, r.m or 0, r.B or 0,
                r.H or 0, r.N)

    ordered = sorted(rows, key=sort_key)
    table = [PeerTableRow(
        r.op, r.phase, r.peer, f"B = {fmt.number(r.B)}, H = {fmt.number(r.H)}", fmt.pow2_text(r.N), dm_text(r.d, r.m),
        fmt.seconds_text(r.maskbench_s), fmt.seconds_text(r.peer_s), interval_text(r),
        " / ".join(str(x) for x in r.rounds) or fmt.DASH,
        fmt.number(r.max_rel_diff, ".2g") if r.max_rel_diff is not None else fmt.DASH,
        "slower" if r.slower else ("faster" if r.faster else "")) for r in ordered]
    sizes = sorted({r.N for r in rows})
    pivot: dict[tuple, PivotRow] = {}
    for r in ordered:
        key = (r.op, r.phase) + line_key(r, bh)
        if key not in pivot:
            dm = dm_text(r.d, r.m) + (f", B = {fmt.number(r.B)}, H = {fmt.number(r.H)}" if bh else "")
            pivot[key] = PivotRow(r.op, r.phase, r.peer, dm, [(fmt.DASH, "") for _ in sizes])
        pivot[key].cells[sizes.index(r.N)] = (interval_text(r), "slower" if r.slower else
                                              ("faster" if r.faster else ""))
    return PeersView(summary.path, summary.found, summary.error, summary.skipped, summary.row_errors, env_rows,
                     versions, [fmt.pow2_text(n) for n in sizes], list(pivot.values()), table,
                     sum(r.slower for r in rows), sum(r.faster for r in rows))


# ------------------------------------------------------------------------------- figure


def peer_colors(peers: list[str]) -> dict[str, str]:
    """A fixed colour per known peer (PEER_COLORS), the next unused tab10 colours for others."""
    taken = {to_hex(c) for c in PEER_COLORS.values()}
    spare = [c for c, _ in style.line_styles(10) if c not in taken]
    out, i = {}, 0
    for p in peers:
        if p in PEER_COLORS:
            out[p] = PEER_COLORS[p]
        else:
            out[p] = spare[i % len(spare)]
            i += 1
    return out


def _ratio_axis(ax, lo: float, hi: float) -> None:
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in RATIO_TICKS if lo <= t <= hi]
    if len(ticks) < 4:
        ticks = sorted(set(ticks) | {t for t in FINE_RATIO_TICKS if lo <= t <= hi}) or [1.0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_peers(summary: PeersSummary | None, out_dir: Path, name: str = "peers.png") -> str | None:
    """Ratio peer time / maskbench time vs N (log2 x, log y), one panel per op (rows) and pass
    (columns), one line per (peer, d, m): colour = peer, line style and marker = (d, m), the same in
    every panel; error bars span the 95% interval [ratio_low, ratio_high]; black line at 1.0
    (parity: above it maskbench is faster, the shaded side below it is where maskbench is slower).
    Lines of one panel are nudged apart along N so their bars do not hide each other."""
    if summary is None or not summary.rows:
        return None
    rows = summary.rows
    ops, passes, peers = op_order(rows), pass_order(rows), peer_order(rows)
    bh = _varies_bh(rows)
    dms = sorted({(r.d if r.d is not None else -1, r.m if r.m is not None else -1) for r in rows})
    dm_style = {dm: DM_STYLES[i % len(DM_STYLES)] for i, dm in enumerate(dms)}
    colors = peer_colors(peers)
    values = [v for r in rows for v in (r.ratio, r.ratio_low, r.ratio_high)
              if v is not None and math.isfinite(v) and v > 0]
    lo = min(values + [1.0]) / 1.25
    hi = max(values + [1.0]) * 1.25
    sizes = sorted({r.N for r in rows})
    fig, axes = style.grid(len(ops) * len(passes), ncols=len(passes), w=5.2, h=3.1)
    for i, op in enumerate(ops):
        for j, phase in enumerate(passes):
            ax = axes[i * len(passes) + j]
            mine = [r for r in rows if r.op == op and r.phase == phase]
            ax.axhspan(lo, 1.0, color="tab:red", alpha=0.06, lw=0, zorder=0)
            ax.axhline(1.0, color="k", lw=1.2, zorder=1)
            style.log2_x(ax)
            ax.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
            _ratio_axis(ax, lo, hi)
            ax.set_title(f"{op} · {phase}", fontsize=9)
            ax.grid(True, which="major", alpha=0.3)
            ax.tick_params(labelsize=8)
            if j == 0:
                ax.set_ylabel("peer time / maskbench time", fontsize=8)
            if i == len(ops) - 1:
                ax.set_xlabel("N (sequence length)", fontsize=8)
            if not mine:
                style.no_data(ax, f"no comparison recorded for {op}, {phase}")
                continue
            keys = sorted({line_key(r, bh) for r in mine}, key=lambda k: (peers.index(k[0]),) + k[1:])
            for k, key in enumerate(keys):
                line = sorted((r for r in mine if line_key(r, bh) == key), key=lambda r: r.N)
                shift = 2 ** ((k - (len(keys) - 1) / 2) * 0.07)
                n = np.array([r.N * shift for r in line], float)
                y = np.array([r.ratio for r in line], float)
                low = np.array([r.ratio if r.ratio_low is None else r.ratio_low for r in line], float)
                high = np.array([r.ratio if r.ratio_high is None else r.ratio_high for r in line], float)
                ls, marker = dm_style[key[1:3]]
                ax.errorbar(n, y, yerr=np.vstack([np.maximum(y - low, 0), np.maximum(high - y, 0)]),
                            color=colors[key[0]], ls=ls, marker=marker, ms=4.5, lw=1.3, capsize=2.5,
                            elinewidth=1, zorder=3)
                slow = np.array([r.slower for r in line], bool)
                if slow.any():  # a hollow ring: the whole interval is below parity
                    ax.plot(n[slow], y[slow], "o", ms=9, mfc="none", mec="tab:red", mew=1.2, zorder=4)
    handles = [Line2D([], [], color=colors[p], lw=2.5, label=p) for p in peers]
    handles += [Line2D([], [], color="0.3", ls=dm_style[dm][0], marker=dm_style[dm][1], ms=4.5,
                       label=dm_text(None if dm[0] < 0 else dm[0], None if dm[1] < 0 else dm[1])) for dm in dms]
    handles += [Line2D([], [], color="k", lw=1.2, label="parity (1.0): above it, maskbench is faster"),
                Patch(color="tab:red", alpha=0.12, lw=0, label="below parity: the peer is faster"),
                Line2D([], [], color="tab:red", marker="o", ms=9, mfc="none", ls="none",
                       label="95% interval entirely below 1")]
    fig.legend(handles=handles, loc="outside upper center", ncol=min(4, len(handles)), frameon=False, fontsize=8)
    if bh:
        fig.suptitle("several (B, H) per (peer, d, m): lines drawn per (B, H) too, see the table", fontsize=8)
    return style.save(fig, out_dir, name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"peers": plot_peers of the peer suite's summary (None without rows)}.

    >>> from reports.sections.peers import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> draw(PageInputs(None), Path("."), print)
    {'peers': None}
    """
    return {"peers": plot_peers(inputs.peers, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"peers": peers_view of the summary (None reads as "no peer run found")}.

    >>> from reports.sections.peers import view
    >>> from reports.sections import PageInputs
    >>> view(PageInputs(None), {})["peers"].found
    False
    """
    return {"peers": peers_view(inputs.peers)}
