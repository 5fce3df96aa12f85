"""benchmarks/ops.py: each peer adapter computes maskbench's function on the same inputs (small N;
the peer tests skip where the peer is not installed), the check can fail, and the grid of
benchmarks/conftest.py. Nothing is timed."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from benchmarks import conftest as bench_conftest
from benchmarks import ops

SMALL = ops.Size(B=2, H=3, N=96, d=16, m=16)


def _needs(op):
    why = ops.op_unavailable(op)
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize("pass_", ops.PASSES)
@pytest.mark.parametrize("op", ops.OPS)
def test_peer_computes_maskbench_function(op, pass_):
    _needs(op)
    eq = ops.compare(op, pass_, ops.make_problem(SMALL, seed=3))
    assert eq.same, eq.message()
    assert set(eq.diffs) == ({"out"} if pass_ == "forward" else {"out", "dq", "dk", "dv"})
    assert eq.max_rel_diff < 1e-5  # measured ~1e-7 to 1e-6; the tolerance is the stated bound
    assert eq.tolerance == ops.tolerance(SMALL, pass_)


def test_sdpa_adapter_with_other_widths():
    size = ops.Size(B=1, H=2, N=64, d=8, m=8)
    for pass_ in ops.PASSES:
        eq = ops.compare("softmax", pass_, ops.make_problem(size, seed=1))
        assert eq.same and eq.peer == "torch-sdpa", eq.message()


def test_favor_with_m_other_than_d():
    _needs("favor")
    eq = ops.compare("favor", "forward+backward", ops.make_problem(ops.Size(1, 2, 80, 16, 48), seed=2))
    assert eq.same, eq.message()


def test_performer_default_eps_is_a_different_function_and_the_check_says_so():
    # performer-pytorch's softmax_kernel adds eps = 1e-4 to every feature unless told not to: that
    # is not FAVOR+, and the comparison must refuse it (the check can be false)
    _needs("favor")
    from performer_pytorch.performer_pytorch import linear_attention, softmax_kernel

    p = ops.make_problem(ops.Size(1, 2, 128, 64, 64), seed=4)
    phi_q = softmax_kernel(p.q, projection_matrix=p.projection, is_query=True)
    phi_k = softmax_kernel(p.k, projection_matrix=p.projection, is_query=False)
    theirs = linear_attention(phi_q, phi_k, p.v)
    mine = ops.maskbench_favor(p.q, p.k, p.v, p.projection)
    diff = ops.relative_difference(theirs, mine)
    assert diff > 100 * ops.tolerance(p.size, "forward")
    bad = ops.Equivalence("favor", "forward", "performer-pytorch", p.size, {"out": diff},
                          ops.tolerance(p.size, "forward"))
    assert not bad.same and "EXCEEDS" in bad.message()


def test_fast_transformers_gets_its_own_layout():
    _needs("elu")
    p = ops.make_problem(SMALL, seed=5)
    prep = ops.prepare("elu", ops.FAST_TRANSFORMERS, p, requires_grad=True)
    assert prep.layout == "BNHd" and prep.q.shape == (SMALL.B, SMALL.N, SMALL.H, SMALL.d)
    assert prep.q.is_contiguous() and prep.q.requires_grad and not prep.cotangent.requires_grad
    assert torch.equal(prep.to_common(prep.q.detach()), p.q)
    out = prep.call(prep.q.detach(), prep.k.detach(), prep.v.detach())
    assert out.shape == (SMALL.B, SMALL.N, SMALL.H, SMALL.d)
    assert ops.relative_difference(prep.to_common(out), ops.maskbench_elu(p.q, p.k, p.v)) < 1e-5


@pytest.mark.parametrize("pass_", ops.PASSES)
def test_timed_call_returns_the_output_or_the_three_gradients(pass_):
    p = ops.make_problem(ops.Size(1, 2, 32, 8, 8), seed=6)
    prep = ops.prepare("softmax", ops.MASKBENCH, p, requires_grad=pass_ != "forward")
    got = ops.timed_call(prep, pass_)()
    if pass_ == "forward":
        assert torch.allclose(got, torch.nn.functional.scaled_dot_product_attention(p.q, p.k, p.v))
    else:
        want = ops.results(prep, pass_)
        assert [g.shape for g in got] == [p.q.shape] * 3
        for g, name in zip(got, ("dq", "dk", "dv")):
            assert torch.allclose(g, want[name])
    with pytest.raises(ValueError, match="pass_"):
        ops.timed_call(prep, "backward")


def test_tolerance_is_float32_roundoff_times_the_sizes():
    u = 2.0 ** -24
    big = ops.Size(1, 4, 2 ** 16, 64, 64)
    assert ops.tolerance(big, "forward") == pytest.approx(16 * u * (math.sqrt(2 ** 16 * 64) + 64))
    assert ops.tolerance(big, "forward+backward") == pytest.approx(4 * ops.tolerance(big, "forward"))
    assert ops.tolerance(big, "forward") < 2.5e-3
    assert ops.tolerance(SMALL, "forward") < ops.tolerance(big, "forward")
    assert ops.relative_difference(torch.tensor([1.0, float("nan")]), torch.ones(2)) == math.inf
    assert ops.relative_difference(torch.zeros(3), torch.zeros(3)) == 0.0


def test_missing_peer_says_what_to_install(monkeypatch):
    def no_module(name):
        top = name.split(".")[0]
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)

    monkeypatch.setattr(ops, "_quiet_import", no_module)
    for op, lib in (("favor", "performer-pytorch"), ("elu-causal", "pytorch-fast-transformers")):
        why = ops.op_unavailable(op)
        assert why.startswith(f"{lib} not installed:") and "pip install" in why and "docs/benchmarks.md" in why
    assert ops.op_unavailable("softmax") is None  # torch SDPA always runs

    def broken(name):  # installed, but one of its own imports fails (e.g. distutils on Python 3.12)
        raise ModuleNotFoundError("No module named 'distutils'", name="distutils")

    monkeypatch.setattr(ops, "_quiet_import", broken)
    assert "installed but cannot be imported (No module named 'distutils')" in ops.op_unavailable("favor")


def test_prepare_refuses_a_library_that_is_not_the_op_peer():
    p = ops.make_problem(ops.Size(1, 1, 8, 4, 4))
    with pytest.raises(ValueError, match="peer of 'softmax'"):
        ops.prepare("softmax", ops.PERFORMER, p, requires_grad=False)
    with pytest.raises(ValueError, match="op must be"):
        ops.prepare("dense", ops.MASKBENCH, p, requires_grad=False)


def _config(**options):
    defaults = {"bench_ops": ",".join(ops.OPS), "bench_N": None, "bench_d": None, "bench_m": None,
                "bench_B": "1", "bench_H": "4", "quick": False}
    defaults.update(options)
    return SimpleNamespace(getoption=lambda name: defaults[name])


def test_grid_default_quick_and_pairs(monkeypatch):
    monkeypatch.delenv("BENCH_QUICK", raising=False)
    full = bench_conftest.cases(_config())
    assert {c.size.N for c in full} == {2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16}
    assert {c.size.N for c in full if c.op == "softmax"} == {2 ** 10, 2 ** 12}  # quadratic: N <= 2^13
    assert {(c.size.d, c.size.m) for c in full} == {(16, 16), (64, 64)}
    assert {(c.size.B, c.size.H) for c in full} == {(1, 4)}
    for mine, peer in zip(full[::2], full[1::2]):  # maskbench, then its peer, same op, pass and size
        assert mine.library == "maskbench" and peer.library == ops.PEER_OF[mine.op]
        assert (mine.op, mine.pass_, mine.size) == (peer.op, peer.pass_, peer.size) and mine.group == peer.group
    assert len({c.id for c in full}) == len(full)
    assert full[0].group == "favor forward B=1 H=4 N=1024 d=m=16"
    quick = bench_conftest.cases(_config(quick=True))
    assert {c.size.N for c in quick} == {2 ** 10, 2 ** 12}
    monkeypatch.setenv("BENCH_QUICK", "1")
    assert {c.size.N for c in bench_conftest.cases(_config())} == {2 ** 10, 2 ** 12}


def test_grid_options():
    grid = bench_conftest.cases(_config(bench_ops="favor,elu", bench_N="256", bench_d="8", bench_m="8,32",
                                        bench_B="1,2", bench_H="2"))
    assert {c.op for c in grid} == {"favor", "elu"}
    assert {(c.size.d, c.size.m) for c in grid if c.op == "favor"} == {(8, 8), (8, 32)}
    assert {(c.size.d, c.size.m) for c in grid if c.op == "elu"} == {(8, 8)}  # ELU+1: m = d
    assert {c.size.B for c in grid} == {1, 2} and {c.size.H for c in grid} == {2}
    assert next(c for c in grid if c.size.m == 32).group.endswith("d=8 m=32")
    for bad in ({"bench_ops": "favor,dense"}, {"bench_N": "0"}, {"bench_d": "x"}):
        with pytest.raises(pytest.UsageError):
            bench_conftest.cases(_config(**bad))
