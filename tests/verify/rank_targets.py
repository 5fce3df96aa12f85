"""Planted rank functions for tests/verify/test_ranks.py (run by verify.ranks in child processes)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def all_reduce_rank(payload) -> float:
    """Every rank's rank summed over the group (a real gloo collective)."""
    x = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(x)
    return float(x)


def fail_on_rank_one(payload) -> int:
    """Rank 1 raises; the others wait in a barrier that never completes."""
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()
    return dist.get_rank()


def hang_on_rank_one(payload) -> int:
    """Rank 1 starts a child process (its pid written to payload/pid) and then hangs forever."""
    if dist.get_rank() == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(payload, "pid").write_text(f"{os.getpid()} {child.pid}")
        while True:
            time.sleep(1)
    return dist.get_rank()
