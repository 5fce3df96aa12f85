"""Run a function on W gloo ranks on 127.0.0.1 (spawned processes, a free port) for the tests of
fast.distributed; a rank that raises or hangs fails the call within ``timeout`` seconds, and every
child is ended (by its own handle) before the call returns."""
from __future__ import annotations

import datetime
import multiprocessing
import os
import queue as queues
import socket
import time
import traceback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(target, rank: int, world: int, port: int, payload, results, timeout: float) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=2 * timeout))  # the parent's deadline comes first
        try:
            results.put((rank, "ok", target(rank, world, payload)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(target, world: int, payload=None, timeout: float = 60.0) -> list:
    """target(rank, world, payload) on ``world`` gloo ranks -> the results in rank order.
    AssertionError with the ranks' tracebacks when one raises; TimeoutError when one has not
    answered within ``timeout`` seconds. The children are terminated (then killed) either way."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(target, r, world, port, payload, results, timeout), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    answers: dict[int, tuple[str, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(answers))} of {world} did not answer "
                                   f"within {timeout:g} s")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queues.Empty:
                continue
            answers[rank] = (status, value)
            if status == "error":  # the others may wait in a collective for ever: stop now
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = {r: v for r, (s, v) in answers.items() if s == "error"}
    if errors:
        raise AssertionError("\n".join(f"rank {r}:\n{v}" for r, v in sorted(errors.items())))
    return [answers[r][1] for r in range(world)]
