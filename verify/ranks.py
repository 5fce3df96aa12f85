"""Run a function on K torch.distributed ranks of this machine (gloo on 127.0.0.1; NCCL on its
GPUs), collect what each rank returns, and leave no process behind.

``run_ranks("pkg.mod:fn", world, payload)`` starts ``world`` Python processes (``python -m
verify.ranks``, one per rank, each in a session of its own), the way torchrun would: each joins a
gloo process group through a TCPStore that this process serves on a free port (the port is the
kernel's, bound before any rank starts, so two launches never race for one), calls
``fn(payload)`` with the group initialised, and pickles its answer to a file. This process waits
until every rank has exited; a rank that exits non-zero, or a launch that is still running after
``timeout`` seconds (a rank hung in a collective whose peer died), ends every rank's process group
with SIGKILL at once and raises RankError naming the rank, its exit status and its last stderr
lines. Nothing home-made stands in for the process group or the collectives: only the launcher.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

#: seconds a launch may take by default (start-up of K Python processes importing torch included)
DEFAULT_TIMEOUT = 120.0
#: the host every rank and the store listen on
HOST = "127.0.0.1"
_POLL = 0.02
#: seconds the other ranks get to exit once one has failed (so that every failed rank is named)
_GRACE = 1.0


class RankError(RuntimeError):
    """A rank exited non-zero, or the launch ran past its timeout; the message says which and why."""


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every rank's whole process group (a rank's own children too), then reap them."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def run_ranks(target: str, world: int, payload: Any = None, *, timeout: float = DEFAULT_TIMEOUT,
              threads: int = 1, backend: str = "gloo") -> list[Any]:
    """Call ``target`` ("module:function", importable from the repository root) on ``world`` gloo
    ranks; returns the list of the ranks' answers, rank 0 first.

    Each rank runs ``function(payload)`` after ``torch.distributed.init_process_group(backend)``
    with torch.set_num_threads(threads), and its answer must pickle. backend "gloo" (CPU) or
    "nccl" (rank r then uses cuda:r, so world must not exceed the GPUs here). Costs one Python process per
    rank (start-up ~1-2 s each, importing torch).

    Raises ValueError for world < 1, threads < 1, timeout <= 0 or another backend; RankError when a rank fails or
    the launch runs past ``timeout`` seconds (every rank is killed first).

        >>> from verify.ranks import run_ranks
        >>> run_ranks("torch.distributed:get_rank", 2, timeout=60)  # doctest: +SKIP
        [0, 1]
    """
    import torch.distributed as dist

    for name, value, low in (("world", world, 1), ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    store = dist.TCPStore(HOST, 0, world + 1, is_master=True, timeout=timedelta(seconds=timeout),
                          wait_for_workers=False)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    with tempfile.TemporaryDirectory(prefix="maskbench-ranks-") as tmp:
        work = Path(tmp)
        (work / "payload.pkl").write_bytes(pickle.dumps(payload))
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(world):
                with open(work / f"{rank}.err", "wb") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "verify.ranks", target, "--rank", str(rank), "--world", str(world),
                         "--port", str(store.port), "--work", str(work), "--threads", str(threads),
                         "--timeout", str(timeout), "--backend", backend],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=root,
                        start_new_session=True))  # its own process group: killpg reaches what it starts
            deadline = time.monotonic() + timeout
            while True:
                codes = [p.poll() for p in procs]
                bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    # the rank that raised first may still be writing its traceback while a peer it
                    # left in a collective has already failed: a moment for both, so both are named
                    grace = time.monotonic() + _GRACE
                    while any(p.poll() is None for p in procs) and time.monotonic() < grace:
                        time.sleep(_POLL)
                    codes = [p.poll() for p in procs]
                    bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                    _kill(procs)  # a peer of a failed rank would wait in a collective until its own timeout
                    raise RankError(f"{target} on {world} ranks: " + "\n".join(
                        f"rank {r} exited with status {codes[r]}:\n{_tail(work / f'{r}.err', 6)}" for r in bad))
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    hung = [r for r, c in enumerate(codes) if c is None]
                    _kill(procs)
                    raise RankError(f"{target} on {world} ranks: ranks {hung} still running after {timeout:g} s "
                                    f"(killed):\n{_tail(work / f'{hung[0]}.err')}")
                time.sleep(_POLL)
            return [pickle.loads((work / f"{rank}.out").read_bytes()) for rank in range(world)]
        finally:
            _kill(procs)  # an exception here (KeyboardInterrupt too) leaves no rank behind


def _rank_main(argv: list[str] | None = None) -> int:
    """One rank: join the group, run the target on the payload, write the answer."""
    ap = argparse.ArgumentParser(prog="python -m verify.ranks")
    ap.add_argument("target")
    for name in ("--rank", "--world", "--port", "--threads"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    module, _, name = args.target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    payload = pickle.loads((work / "payload.pkl").read_bytes())
    timeout = timedelta(seconds=args.timeout)
    store = dist.TCPStore(HOST, args.port, args.world + 1, is_master=False, timeout=timeout)
    if args.backend == "nccl":
        torch.cuda.set_device(args.rank)
    dist.init_process_group(args.backend, store=store, rank=args.rank, world_size=args.world, timeout=timeout)
    try:
        answer = fn(payload)
    finally:
        dist.destroy_process_group()
    tmp = work / f"{args.rank}.out.tmp"
    tmp.write_bytes(pickle.dumps(answer))
    os.replace(tmp, work / f"{args.rank}.out")
    return 0


if __name__ == "__main__":
    try:
        code = _rank_main()
    except Exception:  # the parent reads the traceback from this rank's stderr
        traceback.print_exc()
        code = 1
    sys.exit(code)
