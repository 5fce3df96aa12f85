"""verify.ranks: a real gloo group on 127.0.0.1, and a rank that fails or hangs fails the launch
within its timeout, with every rank's process group (their children too) killed."""
from __future__ import annotations

import os
import time

import pytest

from verify.ranks import RankError, run_ranks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone once its parent reaped it (or it is a zombie of init)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_ranks_answer_in_rank_order():
    assert run_ranks("tests.verify.rank_targets:all_reduce_rank", 3, timeout=60) == [3.0, 3.0, 3.0]


def test_a_failing_rank_fails_the_launch_at_once():
    start = time.monotonic()
    with pytest.raises(RankError, match="(?s)rank 1 exited with status 1.*planted failure on rank 1"):
        run_ranks("tests.verify.rank_targets:fail_on_rank_one", 2, timeout=60)
    assert time.monotonic() - start < 30  # not the timeout: the failure is seen as it happens


def test_a_hanging_rank_is_killed_with_its_children(tmp_path):
    timeout = 8.0
    start = time.monotonic()
    with pytest.raises(RankError, match=r"ranks \[1\] still running after 8 s"):
        run_ranks("tests.verify.rank_targets:hang_on_rank_one", 2, str(tmp_path), timeout=timeout)
    assert time.monotonic() - start < timeout + 10
    pids = [int(p) for p in (tmp_path / "pid").read_text().split()]
    deadline = time.monotonic() + 5  # init reaps the orphaned child shortly after the kill
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("kwargs, text", [({"world": 0}, "world"), ({"world": 2, "threads": 0}, "threads"),
                                          ({"world": 2, "timeout": 0}, "timeout")])
def test_bad_arguments(kwargs, text):
    with pytest.raises(ValueError, match=text):
        run_ranks("tests.verify.rank_targets:all_reduce_rank", **kwargs)
