"""fast.distributed on 2 and 4 gloo ranks against one process on the whole input (sequence and
node sharding: every mask kind, NodeFormer, its Gumbel form, SGFormer, DIFFormer): outputs and
input gradients (float64 <= 1e-12 relative; float32 within verify's equivalence bound, 1e-4), a
rank without rows, a rank that refuses its arguments, and the bytes sent per call flat in N."""
from __future__ import annotations

import pytest
import torch

import fast.distributed as fd
from verify.ranks import RankError, run_ranks

TOL = {torch.float64: 1e-12, torch.float32: 1e-4}  # float32: verify/checks/equivalence.py TOL["float32"]


def _ranks(case: str, world: int, args, timeout: float) -> list:
    """tests.fast.distributed.cases' ``case`` on ``world`` gloo ranks (verify.ranks: one process per
    rank; a rank that fails or hangs fails the launch and every rank is killed)."""
    return run_ranks("tests.fast.distributed.cases:on_rank", world, {"case": case, "args": args}, timeout=timeout)


def _check(results: list[dict[str, float]], tol: float) -> None:
    worst = {name: max(r[name] for r in results) for name in results[0]}
    bad = {name: e for name, e in worst.items() if not e <= tol}
    assert not bad, f"relative errors over {tol:g}: {bad}"


@pytest.mark.parametrize("world, n", [(2, 13), (4, 13), (4, 3)])
def test_sharded_equals_one_process(world, n):
    payload = {"n": n, "dtypes": (torch.float64, torch.float32)}
    results = _ranks("all_cases", world, payload, timeout=90)
    for dtype in payload["dtypes"]:
        _check([r[str(dtype)] for r in results], TOL[dtype])


def test_refused_argument_fails_every_rank_and_leaves_no_process():
    with pytest.raises(RankError, match="v must|refused their arguments"):
        _ranks("bad_shape_on_rank_one", 2, None, timeout=60)


def test_ranks_that_disagree_all_raise():
    with pytest.raises(RankError, match="disagree on their arguments"):
        _ranks("widths_differ", 2, None, timeout=60)


def test_without_process_group_says_what_to_call():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        fd.sharded_linear_attention(torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 2))


def test_hanging_rank_fails_within_timeout():
    with pytest.raises(RankError):
        _ranks("hang_on_rank_one", 2, None, timeout=10)


def test_bytes_per_call_do_not_grow_with_n():
    results = _ranks("bytes_per_call", 2, {"ns": (64, 1024)}, timeout=60)
    for per_n in results:
        assert len(set(per_n.values())) == 1, per_n
        assert all(b > 0 for b in per_n.values())
