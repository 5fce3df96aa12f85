"""verify/favor.py: the FAVOR+ record helpers every masked family builds on (one place for them)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import fast
from tests.helpers import EQUIV_TOL
from verify import favor as F
from verify.dense import dense_masked_attention
from verify.registry import relative_error

ROOT = Path(__file__).resolve().parents[2]


def test_favor_problem_shapes_and_norms():
    p = F.favor_problem(12, seed=0, tag=np.arange(3))
    assert p.q.shape == p.k.shape == (12, F.D_QK) and p.v.shape == (12, F.D_V)
    assert p.projection.shape == (F.M_FEATURES, F.D_QK)
    np.testing.assert_allclose(np.linalg.norm(p.q, axis=1), 1.0, rtol=1e-14)
    np.testing.assert_array_equal(p.extras["tag"], np.arange(3))
    again, other = F.favor_problem(12, seed=0), F.favor_problem(12, seed=1)
    assert np.array_equal(again.projection, p.projection) and not np.allclose(other.projection, p.projection)


def _causal_dense(p):
    return np.tril(np.ones((p.n, p.n)))


def _causal_fast(p, device):
    return fast.CausalMask(p.n, chunk=8)


def test_favor_mechanism_builds_a_consistent_record():
    mech = F.favor_mechanism("x-causal", "t", "s", "N", dense_mask=_causal_dense, fast_mask=_causal_fast)
    p = mech.make_problem(30, 2)
    ref = mech.reference(p)
    assert relative_error(ref, F.favor_reference(p, _causal_dense(p))) == 0.0
    for dtype in (torch.float64, torch.float32):
        assert relative_error(ref, mech.fast(p, dtype=dtype)) <= EQUIV_TOL[dtype]
    assert relative_error(ref, mech.dense(p, dtype=torch.float64)) <= EQUIV_TOL[torch.float64]
    unmasked = F.favor_mechanism("x-linear", "t", "s", "N", dense_mask=None, fast_mask=None)
    np.testing.assert_array_equal(unmasked.dense_mask(p), np.ones((30, 30)))
    assert relative_error(F.favor_reference(p, None), unmasked.fast(p, dtype=torch.float64)) <= 1e-10


def test_favor_mechanism_needs_both_masks_or_none():
    with pytest.raises(ValueError, match="dense_mask and fast_mask must both be given or both be None"):
        F.favor_mechanism("x", "t", "s", "N", dense_mask=_causal_dense, fast_mask=None)


@pytest.mark.parametrize("factory", [F.favor_fast_setup, F.favor_dense_setup])
def test_requires_grad_makes_q_k_v_leaves(factory):
    p = F.favor_problem(20, 0)
    make = _causal_fast if factory is F.favor_fast_setup else _causal_dense
    runner = factory(make)(p, "cpu", torch.float64, requires_grad=True)
    out = runner()
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    # the leaves are the ones the runner closes over: their grads are filled in
    leaves = ([runner.q, runner.k, runner.v, runner.w] if isinstance(runner, F.FavorRunner)
              else [c.cell_contents for c in runner.__closure__ if isinstance(c.cell_contents, torch.Tensor)])
    with_grad = [t for t in leaves if t.requires_grad]
    assert len(with_grad) == 3 and all(t.is_leaf and t.grad is not None for t in with_grad)
    assert all(t.grad.shape == (20, 16) for t in with_grad)
    # the problem's arrays are never aliased by the trained tensors
    assert not any(np.shares_memory(t.detach().numpy(), a) for t in with_grad for a in (p.q, p.k, p.v))
    plain = factory(make)(p, "cpu", torch.float64)()
    assert not plain.requires_grad
    torch.testing.assert_close(out.detach(), plain, rtol=0, atol=0)


def test_families_import_nothing_from_each_other():
    """verify/mechanisms/{sequence,positional,tree}.py share helpers through verify.favor and
    verify.problems only."""
    families = ("sequence", "positional", "tree")
    for name in families:
        tree = ast.parse((ROOT / "verify" / "mechanisms" / f"{name}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        bad = {m for m in imported if m.startswith("verify.mechanisms")}
        assert not bad, (name, bad)


def test_mask_tensor_holds_a_tensor_already_there_and_converts_the_rest():
    t = torch.rand(5, dtype=torch.float64).requires_grad_(True)
    assert F.mask_tensor(t, "cpu") is t and F.mask_tensor(t, torch.device("cpu"), torch.float64) is t
    other = F.mask_tensor(t, "cpu", torch.float32)
    assert other is not t and other.dtype == torch.float32
    a = np.arange(3.0)
    assert torch.equal(F.mask_tensor(a, "cpu"), torch.arange(3.0, dtype=torch.float64))


def test_numpy_values_of_arrays_and_tensors():
    t = torch.tensor([1.5, 2.0], dtype=torch.float32, requires_grad=True)
    got = F.numpy_values(t)
    assert got.dtype == np.float64 and np.array_equal(got, [1.5, 2.0])
    got[0] = 7.0  # a copy: the tensor is untouched
    assert t[0].item() == 1.5
    assert F.numpy_values(torch.tensor(0.25, dtype=torch.bfloat16)).item() == 0.25
    assert np.array_equal(F.numpy_values([1, 2]), np.array([1.0, 2.0]))


def test_dense_twin_uses_the_fast_paths_features():
    """Unmasked, the dense twin and fast.favor_attention form the same features (fast.favor_features)."""
    p = F.favor_problem(20, 3)
    dense = F.favor_dense_setup(None)(p, "cpu", torch.float64)()
    q, k, v, w = F.favor_tensors(p, "cpu", torch.float64)
    assert torch.equal(dense, dense_masked_attention(*fast.favor_features(q, k, w), v, None))
    assert relative_error(dense.numpy(), fast.favor_attention(q, k, v, w)) <= 1e-13
