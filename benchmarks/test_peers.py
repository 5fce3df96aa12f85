"""maskbench beside its peers, one operation at a time (benchmarks/ops.py says what each compares).

One benchmark per (operation, pass, size, library); maskbench's and its peer's are adjacent and
share a pytest-benchmark group "<op> <pass> B= H= N= d=m=". Before either is timed, both
libraries run once on the same inputs and their outputs (and gradients) must agree to the
tolerance of ops.tolerance: a benchmark whose peer computes a different function fails and is
never timed. A peer that is not installed skips the operation with a message saying what to
install; torch SDPA (the softmax peer) always runs.
"""
from __future__ import annotations

import pytest

from benchmarks import ops


def test_peer_op(benchmark, case, peer_state) -> None:
    op, pass_, library, size = case.op, case.pass_, case.library, case.size
    why = peer_state.unavailable(op)
    if why is not None:
        peer_state.skipped.add(why)
        pytest.skip(why)

    check = peer_state.equivalence(op, pass_, size)
    assert check.same, "not the same function, so not timed: " + check.message()

    problem = peer_state.problem(size)
    prep = ops.prepare(op, library, problem, requires_grad=pass_ == "forward+backward")
    benchmark.group = case.group
    benchmark.extra_info.update(
        op=op, **{"pass": pass_}, impl=library, peer=ops.PEER_OF[op], B=size.B, H=size.H, N=size.N, d=size.d,
        m=size.m, device=peer_state.device, dtype="float32", max_rel_diff=check.max_rel_diff,
        rel_diffs=check.diffs, tolerance=check.tolerance)
    benchmark(ops.timed_call(prep, pass_))
