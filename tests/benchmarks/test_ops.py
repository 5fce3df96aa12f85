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


def _needs(op, dtype=torch.float32, d=SMALL.d):
    why = ops.op_unavailable(op, "cpu", dtype, d)
    if why is not None:
        pytest.skip(why)


#: (op, dtype) for every dtype of every op
OP_DTYPES = [(op, dtype) for op in ops.OPS for dtype in ops.DTYPES[op]]


@pytest.mark.parametrize("pass_", ops.PASSES)
@pytest.mark.parametrize("op,dtype", OP_DTYPES)
def test_peer_computes_maskbench_function(op, dtype, pass_):
    dtype = ops.DTYPE_OF_NAME[dtype]
    _needs(op, dtype)
    eq = ops.compare(op, pass_, ops.make_problem(SMALL, seed=3, dtype=dtype))
    assert eq.same, eq.message()
    assert set(eq.diffs) == ({"out"} if pass_ == "forward" else {"out", "dq", "dk", "dv"})
    assert eq.tolerance == ops.tolerance(SMALL, pass_, dtype) and eq.dtype == ops.dtype_name(dtype)
    if dtype == torch.float32:
        assert eq.max_rel_diff < 1e-5  # measured ~1e-7 to 1e-6; the tolerance is the stated bound
    else:
        # against maskbench in float32: the half type's roundings show (never bit-identical), at
        # ~0.5-1.5 u_h measured (torch's CPU flash kernel)
        assert 0 < eq.max_rel_diff < 4 * torch.finfo(dtype).eps / 2


def test_half_precision_check_still_refuses_a_different_function():
    # the half-precision tolerance (3.1e-2 forward in bfloat16) is wide, but not wide enough to
    # pass softmax with another logit scale (1/d instead of 1/sqrt(d)) as the same function
    _needs("softmax-flash", torch.bfloat16)
    p = ops.make_problem(ops.Size(1, 2, 256, 64, 64), seed=8, dtype=torch.bfloat16)
    prep = ops.prepare("softmax-flash", ops.SDPA_FLASH, p, requires_grad=False)
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(ops._sdpa_backend(ops.SDPA_FLASH)):
        wrong = torch.nn.functional.scaled_dot_product_attention(prep.q, prep.k, prep.v, scale=1 / 64)
    right = ops.results(prep, "forward")["out"]
    mine = ops.maskbench_softmax(p.q.float(), p.k.float(), p.v.float())
    tol = ops.tolerance(p.size, "forward", torch.bfloat16)
    assert ops.relative_difference(right, mine) <= tol < ops.relative_difference(wrong, mine)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_sdpa_backend_torch_refuses_is_skipped_with_torch_error(device):
    # the memory-efficient kernel has no CPU implementation; flash takes no float32 on CUDA
    op, dtype = ("softmax-efficient", torch.float32) if device == "cpu" else ("softmax-flash", torch.float32)
    why = ops.op_unavailable(op, device, dtype, 64)
    assert why is not None and why.startswith(f"{ops.PEER_OF[op]} cannot run on {device} in float32 at d = 64; "
                                              "torch says: ")
    assert "softmax-math" in ops.OPS and ops.op_unavailable("softmax-math", device, torch.float32, 64) is None


def test_fla_needs_cuda_and_says_how_to_install():
    why = ops.op_unavailable("linear-causal", "cpu", torch.float32, 16)
    assert why.startswith("fla-core runs Triton GPU kernels: it needs --device cuda, got cpu")
    assert 'pip install -e ".[gpu-peers]"' in why


def test_linear_causal_feeds_the_same_features_to_both():
    # fla-core's layout is (B, N, H, m) and its q, k are the features elu + 1, as maskbench's are
    p = ops.make_problem(SMALL, seed=9)
    mine = ops.prepare("linear-causal", ops.MASKBENCH, p, requires_grad=True)
    phi_q = torch.nn.functional.elu(p.q) + 1
    assert mine.layout == "BHNd" and torch.allclose(mine.q.detach(), phi_q)
    assert torch.all(mine.k.detach() > 0) and mine.q.requires_grad and mine.v.requires_grad
    out = mine.call(mine.q, mine.k, mine.v)
    num = torch.einsum("bhim,bhjm->bhij", phi_q.double(), mine.k.detach().double()).tril()
    want = (num @ p.v.double()) / num.sum(-1, keepdim=True)
    assert ops.relative_difference(out, want) < 1e-6
    with pytest.raises(ValueError, match="fla_kernel"):
        ops.prepare("linear-causal", ops.FLA, p, requires_grad=False, fla_kernel="naive")


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_peak_memory_is_gpu_only(device):
    p = ops.make_problem(ops.Size(1, 2, 256, 16, 16), device=device)
    call = ops.timed_call(ops.prepare("softmax", ops.MASKBENCH, p, requires_grad=True), "forward+backward")
    peak, extra = ops.peak_memory(call, device)
    if device == "cpu":
        assert (peak, extra) == (None, None)
    else:  # the three gradients at least, each (1, 2, 256, 16) float32
        assert peak >= extra >= 3 * 2 * 256 * 16 * 4


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


def test_half_precision_tolerance_adds_the_half_roundings():
    size = ops.Size(1, 4, 2 ** 12, 64, 64)
    for dtype, u in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):  # unit round-offs
        assert ops.tolerance(size, "forward", dtype) == pytest.approx(ops.tolerance(size, "forward") + 8 * u)
        assert ops.tolerance(size, "forward+backward", dtype) == pytest.approx(
            ops.tolerance(size, "forward+backward") + 32 * u)
    assert ops.tolerance(size, "forward", torch.bfloat16) < 3.5e-2  # still far below an O(1) difference


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
    for op, lib, device in (("favor", "performer-pytorch", "cpu"), ("elu-causal", "pytorch-fast-transformers", "cpu"),
                            ("linear-causal", "fla-core", "cuda")):  # fla's import is tried on cuda only
        why = ops.op_unavailable(op, device)
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
                "bench_B": "1", "bench_H": "4", "quick": False, "bench_device": "cpu", "bench_dtype": None}
    defaults.update(options)
    return SimpleNamespace(getoption=lambda name: defaults[name])


def _pairs_adjacent(grid):
    for mine, peer in zip(grid[::2], grid[1::2]):  # maskbench, then its peer, same op, pass, size and dtype
        assert mine.library == "maskbench" and peer.library == ops.PEER_OF[mine.op]
        assert (mine.op, mine.pass_, mine.size, mine.dtype) == (peer.op, peer.pass_, peer.size, peer.dtype)
        assert mine.group == peer.group
    assert len({c.id for c in grid}) == len(grid)


def test_grid_default_quick_and_pairs(monkeypatch):
    monkeypatch.delenv("BENCH_QUICK", raising=False)
    full = bench_conftest.cases(_config())
    assert {c.op for c in full} == set(ops.OPS) - {"softmax-flash"}  # flash has no float32, the CPU default
    assert {c.size.N for c in full} == {2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16}
    for op in ("softmax", "softmax-efficient", "softmax-math"):
        assert {c.size.N for c in full if c.op == op} == {2 ** 10, 2 ** 12}  # quadratic: N <= 2^13 on a CPU
    assert {(c.size.d, c.size.m) for c in full} == {(16, 16), (64, 64)}
    assert {(c.size.B, c.size.H) for c in full} == {(1, 4)} and {c.dtype for c in full} == {"float32"}
    _pairs_adjacent(full)
    assert full[0].group == "favor forward B=1 H=4 N=1024 d=m=16 float32"
    assert full[0].id == "favor-fwd-B1-H4-N1024-d16-m16-float32-maskbench"
    quick = bench_conftest.cases(_config(quick=True))
    assert {c.size.N for c in quick} == {2 ** 10, 2 ** 12}
    monkeypatch.setenv("BENCH_QUICK", "1")
    assert {c.size.N for c in bench_conftest.cases(_config())} == {2 ** 10, 2 ** 12}


def test_grid_quick_on_cuda_spans_n_to_2_16_in_float32_and_bfloat16(monkeypatch):
    monkeypatch.delenv("BENCH_QUICK", raising=False)
    grid = bench_conftest.cases(_config(quick=True, bench_device="cuda"))
    _pairs_adjacent(grid)
    assert {c.size.N for c in grid} == {2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16} and {c.size.d for c in grid} == {64}
    dtypes = {(c.op, c.dtype) for c in grid}
    assert {dt for op, dt in dtypes if op == "linear-causal"} == {"float32", "bfloat16"}
    assert {dt for op, dt in dtypes if op == "softmax-flash"} == {"bfloat16"}  # float16 only when asked
    assert {dt for op, dt in dtypes if op == "favor"} == {"float32"}
    assert max(c.size.N for c in grid if c.op == "softmax-flash") == 2 ** 16  # O(N) memory on a GPU
    assert {c.size.N for c in grid if c.op == "softmax-math"} == {2 ** 10, 2 ** 12}  # N x N held: N <= 2^13
    asked = bench_conftest.cases(_config(quick=True, bench_device="cuda", bench_dtype="float16",
                                         bench_ops="softmax-flash,linear-causal"))
    assert {(c.op, c.dtype) for c in asked} == {("softmax-flash", "float16")}  # fla: no float16 (ops.DTYPES)


def test_grid_options():
    grid = bench_conftest.cases(_config(bench_ops="favor,elu", bench_N="256", bench_d="8", bench_m="8,32",
                                        bench_B="1,2", bench_H="2"))
    assert {c.op for c in grid} == {"favor", "elu"}
    assert {(c.size.d, c.size.m) for c in grid if c.op == "favor"} == {(8, 8), (8, 32)}
    assert {(c.size.d, c.size.m) for c in grid if c.op == "elu"} == {(8, 8)}  # ELU+1: m = d
    assert {c.size.B for c in grid} == {1, 2} and {c.size.H for c in grid} == {2}
    assert next(c for c in grid if c.size.m == 32).group.endswith("d=8 m=32 float32")
    for bad in ({"bench_ops": "favor,dense"}, {"bench_N": "0"}, {"bench_d": "x"}, {"bench_dtype": "float64"},
                {"bench_dtype": ","}):
        with pytest.raises(pytest.UsageError):
            bench_conftest.cases(_config(**bad))
