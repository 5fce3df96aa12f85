"""The two benchmark suites that live beside the package, run by ``python -m measure`` so that the
report's Peers and History sections are filled by ``make report`` alone.

- peers: the pytest-benchmark peer suite of ``benchmarks/`` (docs/benchmarks.md, "Peer
  benchmarks") on its quick grid (N in {2^10, 2^12} on the CPU; measure --quick: at d = 64 only),
  each benchmark given
  PEER_MAX_TIME_S of rounds (pytest-benchmark's --benchmark-max-time) and at least PEER_MIN_ROUNDS,
  then ``benchmarks/summary.py`` into ``benchmarks/out/peers-summary.json``, the file the Peers
  section reads. torch SDPA (the exact-softmax peer) is always installed; performer-pytorch and
  pytorch-fast-transformers join when installed and skip with a message otherwise. ``make
  bench-ops`` is the full suite.
- history: asv's ``complexity.*.track_exponent`` benchmarks (each mechanism's fitted exponent from a
  4-point in-process sweep, asv_bench/complexity.py) for the current commit, on the installed
  project (``asv run --python=same --set-commit-hash HEAD``, machine ``maskbench-local``, as ``make
  bench``), into ``.asv/results``, the folder the History section reads; with results of earlier
  commits there the section draws a line across them. ``make bench`` runs the whole asv suite
  (times and accuracy too).

Both run as child processes from the repository root (``repo_root``), with the interpreter running
measure; neither raises: ``run_peers`` and ``run_history`` return a SuiteRun whose ``note`` says what
happened (a missing suite, asv outside a git checkout, a child's failure and the tail of its
output). Time on 2 cores: see measure's docstring.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

#: pytest-benchmark's time per benchmark (seconds) and its least number of rounds in the report's
#: peer run: the suite's equivalence check still runs before each pair; the ratio's bootstrap
#: interval needs rounds, not long ones.
PEER_MAX_TIME_S = 0.1
PEER_MIN_ROUNDS = 5
#: Torch threads of the peer run (the suite's default, passed explicitly so the load log can
#: subtract them) and of asv's exponent sweeps (asv_bench pins one).
PEER_THREADS = 2
HISTORY_THREADS = 1
#: Widths d of the report's peer run in quick mode (the suite's quick CPU grid has d in {16, 64}:
#: 70 s on 2 cores; one width halves it). Full mode runs the quick grid whole.
QUICK_PEER_D = "64"
#: The peer summary the report reads (relative to the repository root).
PEERS_SUMMARY = Path("benchmarks") / "out" / "peers-summary.json"
PEERS_JSON = Path("benchmarks") / "out" / "peers.json"
#: asv: the machine name every make target records under, and the benchmarks the history runs.
ASV_MACHINE = "maskbench-local"
ASV_BENCHMARKS = r"^complexity\."
#: A child that runs longer than this is stopped (its stage reports it).
CHILD_TIMEOUT_S = 900.0

Status = Callable[[str], None]


@dataclass
class SuiteRun:
    """What one suite run did: ``ok``, the wall ``seconds``, the ``command`` (as a user would type
    it), the file it wrote (``output``, None on failure) and a one-line ``note``.

    >>> from measure.suites import SuiteRun
    >>> SuiteRun(ok=False, seconds=0.0, command="", output=None, note="not run").to_dict()["note"]
    'not run'
    """

    ok: bool
    seconds: float
    command: str
    output: str | None
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


def repo_root() -> Path | None:
    """The checkout measure runs from (the folder holding benchmarks/ and asv.conf.json), or None
    when measure is installed without it.

    >>> from measure.suites import repo_root
    >>> root = repo_root()
    >>> root is None or (root / "asv.conf.json").is_file()
    True
    """
    root = Path(__file__).resolve().parents[1]
    return root if (root / "asv.conf.json").is_file() and (root / "benchmarks").is_dir() else None


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def run_child(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = CHILD_TIMEOUT_S
              ) -> subprocess.CompletedProcess:
    """``argv`` in ``cwd`` with os.environ plus ``env``, output captured as text; raises
    FileNotFoundError (no such program) and subprocess.TimeoutExpired like subprocess.run.

    >>> import sys
    >>> from pathlib import Path
    >>> from measure.suites import run_child
    >>> run_child([sys.executable, "-c", "print(6 * 7)"], Path(".")).stdout
    '42\\n'
    """
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def run_peers(device: str = "cpu", status: Status = lambda msg: None, root: Path | None = None,
              quick: bool = False) -> SuiteRun:
    """The peer suite's quick grid on ``device`` (``quick``: at d = QUICK_PEER_D only) and its
    summary (module docstring); never raises."""
    root = root or repo_root()
    command = "make bench-ops ARGS=--quick"
    start = time.perf_counter()
    if root is None:
        return SuiteRun(False, 0.0, command, None, "no benchmarks/ folder beside the installed package")
    (root / PEERS_JSON).parent.mkdir(parents=True, exist_ok=True)
    pytest_argv = [sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                   "--benchmark-enable", "--quick", "--device", str(device), "--threads", str(PEER_THREADS),
                   f"--benchmark-max-time={PEER_MAX_TIME_S}", f"--benchmark-min-rounds={PEER_MIN_ROUNDS}",
                   "--benchmark-json", str(PEERS_JSON)] + (["--bench-d", QUICK_PEER_D] if quick else [])
    summary_argv = [sys.executable, "benchmarks/summary.py", str(PEERS_JSON), "--out", str(PEERS_SUMMARY)]
    try:
        tests = run_child(pytest_argv, root)
        # pytest: 0 all passed, 1 some failed (a peer computing another function); either way
        # the JSON holds what was timed, and the summary says which pairs are missing
        if tests.returncode not in (0, 1) or not (root / PEERS_JSON).is_file():
            return SuiteRun(False, time.perf_counter() - start, command, None,
                            f"the peer suite stopped (exit {tests.returncode}): {_tail(tests.stdout + tests.stderr)}")
        summary = run_child(summary_argv, root)
    except subprocess.TimeoutExpired:
        return SuiteRun(False, time.perf_counter() - start, command, None,
                        f"the peer suite ran past {CHILD_TIMEOUT_S:.0f} s and was stopped")
    seconds = time.perf_counter() - start
    if summary.returncode != 0:
        return SuiteRun(False, seconds, command, None, f"benchmarks/summary.py failed: {_tail(summary.stderr)}")
    failed = "" if tests.returncode == 0 else f"; some benchmarks failed: {_tail(tests.stdout, 1)}"
    return SuiteRun(True, seconds, command, str(PEERS_SUMMARY),
                    f"quick peer grid on {device} in {seconds:.0f} s{failed}")


def _asv(root: Path) -> str:
    """The asv beside this interpreter (the venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("asv")
    return str(here) if here.is_file() else "asv"


def run_history(status: Status = lambda msg: None, root: Path | None = None) -> SuiteRun:
    """asv's exponent benchmarks for the current commit into .asv/results (module docstring);
    never raises."""
    root = root or repo_root()
    command = "make bench"
    start = time.perf_counter()
    if root is None:
        return SuiteRun(False, 0.0, command, None, "no asv.conf.json beside the installed package")
    try:
        head = run_child(["git", "rev-parse", "HEAD"], root, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SuiteRun(False, 0.0, command, None, f"git is not available: {exc}")
    if head.returncode != 0:
        return SuiteRun(False, 0.0, command, None, "not a git checkout: asv records results per commit")
    commit = head.stdout.strip()
    asv = _asv(root)
    env = {"OPENBLAS_NUM_THREADS": "1"}  # as make bench: NumPy's BLAS on one thread, like torch
    try:
        machine = run_child([asv, "machine", "--yes", "--machine", ASV_MACHINE], root, env, timeout=120)
        if machine.returncode != 0:
            return SuiteRun(False, time.perf_counter() - start, command, None,
                            f"asv machine failed: {_tail(machine.stdout + machine.stderr)}")
        run = run_child([asv, "run", "--python=same", "--machine", ASV_MACHINE, "--set-commit-hash", commit,
                    "-b", ASV_BENCHMARKS], root, env)
    except FileNotFoundError:
        return SuiteRun(False, time.perf_counter() - start, command, None,
                        "asv is not installed (pip install -e '.[dev]')")
    except subprocess.TimeoutExpired:
        return SuiteRun(False, time.perf_counter() - start, command, None,
                        f"asv ran past {CHILD_TIMEOUT_S:.0f} s and was stopped")
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        return SuiteRun(False, seconds, command, None, f"asv run failed (exit {run.returncode}): "
                                                       f"{_tail(run.stdout + run.stderr)}")
    return SuiteRun(True, seconds, command, str(Path(".asv") / "results" / ASV_MACHINE),
                    f"asv exponent benchmarks for {commit[:8]} in {seconds:.0f} s")
