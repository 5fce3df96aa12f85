"""maskbench beside its peers, one operation at a time (benchmarks/ops.py says what each compares).

One benchmark per (operation, pass, size, dtype, library); maskbench's and its peer's are adjacent
and share a pytest-benchmark group "<op> <pass> B= H= N= d=m= <dtype>". Before either is timed,
both libraries run once on the same inputs and their outputs (and gradients) must agree to the
tolerance of ops.tolerance: a benchmark whose peer computes a different function fails and is
never timed. A peer that cannot run here (not installed, no CUDA device, an SDPA backend torch
refuses) skips the operation with a message saying why; torch SDPA with its own backend choice
(the softmax peer) always runs.

Each timed function is called once more before its rounds (the warm-up: Triton compiles and
autotunes fla-core's kernels on first use, cuBLAS and cuDNN pick their algorithms), and once to
measure its peak GPU memory (ops.peak_memory), all outside the timed rounds.
"""
from __future__ import annotations

import pytest

from benchmarks import ops


def test_peer_op(benchmark, case, peer_state) -> None:
    op, pass_, library, size, dtype = case.op, case.pass_, case.library, case.size, case.dtype
    why = peer_state.unavailable(op, dtype, size.d)
    if why is not None:
        peer_state.skipped.add(why)
        pytest.skip(why)

    check = peer_state.equivalence(op, pass_, size, dtype)
    assert check.same, "not the same function, so not timed: " + check.message()

    problem = peer_state.problem(size, dtype)
    prep = ops.prepare(op, library, problem, requires_grad=pass_ == "forward+backward")
    call = ops.timed_call(prep, pass_)
    call()  # the warm-up
    peak, extra = ops.peak_memory(call, peer_state.device)
    benchmark.group = case.group
    benchmark.extra_info.update(
        op=op, **{"pass": pass_}, impl=library, peer=ops.PEER_OF[op], B=size.B, H=size.H, N=size.N, d=size.d,
        m=size.m, device=peer_state.device, dtype=dtype, max_rel_diff=check.max_rel_diff,
        rel_diffs=check.diffs, tolerance=check.tolerance, peak_memory_bytes=peak, peak_memory_extra_bytes=extra)
    benchmark(call)
