"""What qualifies a run's numbers: machine, versions, mode, and the machine's load per stage.

Load. ``os.getloadavg()`` is sampled at the start and at the end of every stage. The 1-minute
load average counts runnable processes, this run's own threads included, so

    other load = max(0, 1-minute load average - threads this stage ran)

is the CPU demand of everything else (at a stage's start it still reflects the minute before,
so it is an approximation). ``other_busy``: some sample had other load >= BUSY_OTHER (another
process used at least half a core on average). ``cpu_s``: CPU seconds this run (and its child
processes) used in the stage; far below wall time x threads means the run waited for cores.

The rule for ``load_warning``: a stage that times things (TIMING_STAGES: the sweeps, and the
checks, whose complexity checks time) had other load >= BUSY_OTHER, i.e. other processes used at
least half a core beside this run's own threads; they competed with the timing thread for cores
(and caches, memory bandwidth), which inflates and scatters the times and bends fits. The run's
own threads never trigger it (the checks stage runs the 2-thread scale workers, which load a
2-core machine fully by themselves). The warning names the stage, the load and the CPU count.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

#: An other load of at least this many cores counts as "another process was busy".
BUSY_OTHER = 0.5
#: Stages whose numbers are times (the warning looks only at these).
TIMING_STAGES = ("sweeps", "checks")
LOAD_RULE = (f"warn when, at the start or end of a timing stage ({', '.join(TIMING_STAGES)}), the other load "
             f"(1-minute load average - threads the stage ran) was >= {BUSY_OTHER} core")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def loadavg() -> list[float] | None:
    """(1, 5, 15)-minute load averages, None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


class LoadLog:
    """Load samples per stage: ``start(stage, threads)`` and ``end(stage)``; ``summary()`` is
    the environment's "load" entry and ``warning()`` the load_warning string (or None)."""

    def __init__(self, cpus: int | None = None):
        self.cpus = cpus or os.cpu_count() or 1
        self.stages: dict[str, dict] = {}

    def start(self, stage: str, threads: int) -> None:
        self.stages[stage] = {"threads": int(threads), "start": loadavg(), "end": None, "cpu_s": None}
        self._cpu0 = _cpu_seconds()

    def end(self, stage: str) -> None:
        if stage in self.stages:
            self.stages[stage]["end"] = loadavg()
            self.stages[stage]["cpu_s"] = round(_cpu_seconds() - getattr(self, "_cpu0", 0.0), 2)

    def _loads(self, stage: str) -> list[float]:
        s = self.stages[stage]
        return [x[0] for x in (s["start"], s["end"]) if x is not None]

    def other_load(self, stage: str) -> float | None:
        loads = self._loads(stage)
        return None if not loads else round(max(0.0, max(loads) - self.stages[stage]["threads"]), 2)

    def summary(self) -> dict:
        stages = {name: {**s, "other_load": self.other_load(name)} for name, s in self.stages.items()}
        others = [s["other_load"] for s in stages.values() if s["other_load"] is not None]
        return {"cpus": self.cpus, "rule": LOAD_RULE, "stages": stages,
                "max_other_load": max(others) if others else None,
                "other_busy": bool(others) and max(others) >= BUSY_OTHER}

    def warning(self) -> str | None:
        over = []  # (stage, worst 1-minute load) of the timing stages where other processes were busy
        for name in TIMING_STAGES:
            other = self.other_load(name) if name in self.stages else None
            if other is not None and other >= BUSY_OTHER:
                over.append((name, max(self._loads(name))))
        if not over:
            return None
        where = " and ".join(f"the {name} stage (load {load:.2f}, this run {self.stages[name]['threads']} thread(s))"
                             for name, load in over)
        return (f"machine busy while timing: other processes used >= {BUSY_OTHER:g} core beside this run on "
                f"{self.cpus} CPUs during {where}; they competed for the cores, so times are inflated and "
                "scattered and fitted exponents may be off. Re-run on an idle machine to trust them.")


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


def environment(quick: bool, device: str, rounds: int, sweep_threads: int, argv: list[str] | None = None) -> dict:
    """measure.timing.environment() plus what qualifies this run's numbers (load added later)."""
    from measure.timing import environment as timing_environment

    env = timing_environment()
    env.update({
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "mode": "quick" if quick else "full",
        "device": device,
        "sweep_threads": sweep_threads,
        "sweep_rounds": rounds,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "load_average_1_5_15": loadavg(),
        "git_commit": _git_commit(Path(__file__).resolve().parents[1]),
        "command": " ".join(["python", "-m", "measure", *(sys.argv[1:] if argv is None else argv)]),
    })
    return env
