"""What a report is made of: one ReportData, filled by the CLI or injected by tests.

The figure and HTML builders read only this object, so they can be exercised on synthetic
numbers without running a sweep. ``to_dict`` is the schema of results.json.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reports.asv_history import AsvHistory
from reports.favor import FavorError
from reports.gallery import MaskGallery
from reports.memory import MemoryCurve
from reports.sweeps import SWEEP_THREADS, MechanismTiming
from reports.trees import TreeMasks
from verify.result import CheckResult


@dataclass
class MechanismInfo:
    """The registry facts the report shows about one mechanism."""

    id: str
    title: str
    source: str
    complexity: str
    exact: bool = True
    has_dense: bool = True
    notes: str = ""

    @classmethod
    def from_mechanism(cls, mech) -> "MechanismInfo":
        return cls(mech.id, mech.title, mech.source, mech.complexity, mech.exact,
                   mech.dense_setup is not None, mech.notes)


@dataclass
class ReportData:
    """Every input of the page. Missing parts (skipped stages) are None or empty."""

    environment: dict
    mechanisms: list[MechanismInfo]
    timings: dict[str, MechanismTiming] = field(default_factory=dict)
    memory: dict[str, dict[str, MemoryCurve]] = field(default_factory=dict)
    favor: FavorError | None = None
    verify: list[CheckResult] | None = None  # None: verification was not run
    verify_note: str = ""  # why verify is missing, or where its results came from
    asv: AsvHistory | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    gallery: MaskGallery | None = None  # dense masks of small instances (summaries only in JSON)
    trees: TreeMasks | None = None  # tree masks: time vs N per family, TreeDCMask's recursion depth

    def checks_for(self, mech_id: str) -> list[CheckResult]:
        """Checks about one mechanism: ids "<family>/<mech_id>" (equivalence/, complexity/, ...)."""
        return [r for r in self.verify or [] if r.id.split("/", 1)[-1] == mech_id]

    def to_dict(self) -> dict:
        return {
            "environment": self.environment,
            "mechanisms": [asdict(m) for m in self.mechanisms],
            "timings": {k: v.to_dict() for k, v in self.timings.items()},
            "memory": {k: {impl: c.to_dict() for impl, c in v.items()} for k, v in self.memory.items()},
            "favor_error": None if self.favor is None else self.favor.to_dict(),
            "verify": None if self.verify is None else [r.to_dict() for r in self.verify],
            "verify_note": self.verify_note,
            "asv": None if self.asv is None else self.asv.to_dict(),
            "stage_seconds": self.stage_seconds,
            "mask_gallery": None if self.gallery is None else self.gallery.to_dict(),
            "tree_masks": None if self.trees is None else self.trees.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ReportData":
        """Inverse of ``to_dict`` (re-render a page from results.json, e.g. one made on a GPU box)."""
        from reports.asv_history import AsvSeries
        from reports.favor import FavorErrorCurve
        from reports.memory import MemoryPoint
        from reports.sweeps import ImplTiming
        from verify.timing import Fit, Sweep

        def impl(x):
            if x is None:
                return None
            return ImplTiming(Sweep(**x["sweep"]), None if x["fit"] is None else Fit(**x["fit"]))

        def num(v):
            return float(v) if isinstance(v, str) else v  # inf/nan were written as strings

        timings = {k: MechanismTiming(v["mechanism"], impl(v["fast"]), impl(v["dense"]), v["crossover"],
                                      v.get("measured_crossover")) for k, v in d.get("timings", {}).items()}
        memory = {k: {i: MemoryCurve(**{**c, "points": [MemoryPoint(**p) for p in c["points"]]})
                      for i, c in v.items()} for k, v in d.get("memory", {}).items()}
        f = d.get("favor_error")
        favor = None if f is None else FavorError(**{**f, "curves": [FavorErrorCurve(**c) for c in f["curves"]]})
        verify = None if d.get("verify") is None else [
            CheckResult(**{**r, "statistic": num(r.get("statistic")), "threshold": num(r.get("threshold"))})
            for r in d["verify"]]
        a = d.get("asv")
        asv = None if a is None else AsvHistory(
            **{**a, "series": [AsvSeries(**{**x, "params": tuple(x["params"])}) for x in a["series"]]})
        g = d.get("mask_gallery")
        gallery = None if g is None else MaskGallery.from_dict(g)
        tr = d.get("tree_masks")
        trees = None if tr is None else TreeMasks.from_dict(tr)
        return cls(d["environment"], [MechanismInfo(**m) for m in d["mechanisms"]], timings, memory, favor, verify,
                   d.get("verify_note", ""), asv, d.get("stage_seconds", {}), gallery, trees)

    def write_json(self, path: str | Path, **extra) -> None:
        """results.json: every number on the page, so it can be quoted (plus ``extra`` keys)."""
        Path(path).write_text(json.dumps({**self.to_dict(), **extra}, indent=1, default=_json_default))


def _json_default(obj):
    # numpy scalars sneak in through the sweeps; everything else is a bug worth seeing.
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit(root: Path) -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment(quick: bool, device: str, rounds: int) -> dict:
    """verify.timing.environment() plus what qualifies this report's numbers."""
    from verify.timing import environment as timing_environment

    env = timing_environment()
    env.update({
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "mode": "quick" if quick else "full",
        "device": device,
        "sweep_threads": SWEEP_THREADS,
        "sweep_rounds": rounds,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        # Other processes inflate and scatter timings; the load qualifies every number here.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "git_commit": _git_commit(Path(__file__).resolve().parent.parent),
        "command": " ".join([os.path.basename(sys.executable), "-m", "reports", *sys.argv[1:]]),
    })
    return env
