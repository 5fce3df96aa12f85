"""reference/latent/simple_attention.py: the dense float64 DIFFormer / SGFormer against the formulas
written out node by node, per-graph independence, limits, and bad input. (NumPy only.)"""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import reference.latent.simple_attention as ref
from reference.errors import DenominatorError

SIZES = (4, 1, 6)
BATCH = np.repeat(np.array([0, 1, 3]), SIZES)  # label 2 is a gap; graph 1 has one node
N = int(sum(SIZES))


def inputs(seed: int, lead=(2, 2), n=N, d_qk=3, d=2, shift=1.5):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, n, d_qk)) + shift
    k = rng.standard_normal((*lead, n, d_qk)) + shift
    v = rng.standard_normal((*lead, n, d))
    return q, k, v


def formula(q, k, v, batch, joint_heads, own_value):
    """The two formulas, node by node and graph by graph, with explicit loops (q: (B, H, N, d_qk))."""
    out = np.zeros_like(v)
    for g in np.unique(batch):
        rows = np.flatnonzero(batch == g)
        for b in range(q.shape[0]):
            if joint_heads:
                nq, nk = np.sqrt((q[b][:, rows] ** 2).sum()), np.sqrt((k[b][:, rows] ** 2).sum())
            for h in range(q.shape[1]):
                if not joint_heads:
                    nq, nk = np.sqrt((q[b, h, rows] ** 2).sum()), np.sqrt((k[b, h, rows] ** 2).sum())
                kv = sum(np.outer(k[b, h, w] / nk, v[b, h, w]) for w in rows)
                ksum = sum(k[b, h, w] / nk for w in rows)
                vsum = sum(v[b, h, w] for w in rows)
                for u in rows:
                    qu = q[b, h, u] / nq
                    const = len(rows) * v[b, h, u] if own_value else vsum
                    out[b, h, u] = (const + qu @ kv) / (len(rows) + qu @ ksum)
    return out


@pytest.mark.parametrize("joint_heads", [True, False])
@pytest.mark.parametrize("own_value", [False, True])
def test_dense_form_equals_the_formula(joint_heads, own_value):
    q, k, v = inputs(0)
    fn = ref.sgformer_attention if own_value else ref.difformer_attention
    got = fn(q, k, v, batch=BATCH, joint_heads=joint_heads)
    np.testing.assert_allclose(got, formula(q, k, v, BATCH, joint_heads, own_value), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fn", [ref.difformer_attention, ref.sgformer_attention])
def test_joint_heads_rule(fn):
    """joint_heads=None (default): 4-D (B, H, N, d) spans H (= True); 3-D (B, N, d) keeps the
    samples apart (= False: scaling sample 1 leaves sample 0 unchanged); True reads 3-D as
    (H, N, d) and equals the 4-D (1, H, N, d) default; anything but None/True/False: TypeError."""
    q, k, v = inputs(5)
    q = q * np.array([1.0, 7.0]).reshape(1, 2, 1, 1)  # heads of unequal size: joint != apart
    np.testing.assert_array_equal(fn(q, k, v, batch=BATCH), fn(q, k, v, batch=BATCH, joint_heads=True))
    assert not np.allclose(fn(q, k, v, batch=BATCH), fn(q, k, v, batch=BATCH, joint_heads=False))
    q3, k3, v3 = q[0], k[0], v[0]  # (2, N, d): a batch of two samples under the default
    np.testing.assert_array_equal(fn(q3, k3, v3, batch=BATCH), fn(q3, k3, v3, batch=BATCH, joint_heads=False))
    scaled = q3.copy()
    scaled[1] *= 100.0
    np.testing.assert_array_equal(fn(scaled, k3, v3, batch=BATCH)[0], fn(q3, k3, v3, batch=BATCH)[0])
    np.testing.assert_array_equal(fn(q3, k3, v3, batch=BATCH, joint_heads=True),
                                  fn(q3[None], k3[None], v3[None], batch=BATCH)[0])
    with pytest.raises(TypeError, match="joint_heads"):
        fn(q, k, v, joint_heads="yes")
    with pytest.raises(TypeError, match="joint_heads"):
        ref.frobenius_normalize(q, joint_heads=1)


@pytest.mark.parametrize("fn", [ref.difformer_attention, ref.sgformer_attention])
def test_each_graph_is_computed_alone(fn):
    """The batched output equals each graph run on its own (batch=None), and batch=None equals
    one graph label for every node."""
    q, k, v = inputs(1)
    got = fn(q, k, v, batch=BATCH)
    for g in (0, 1, 3):
        rows = BATCH == g
        np.testing.assert_allclose(got[..., rows, :], fn(q[..., rows, :], k[..., rows, :], v[..., rows, :]),
                                   rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(fn(q, k, v), fn(q, k, v, batch=np.zeros(N, dtype=np.int32)))


def test_one_node_graph_outputs_its_value_and_sgformer_differs():
    q, k, v = inputs(2)
    one = BATCH == 1
    for fn in (ref.difformer_attention, ref.sgformer_attention):
        np.testing.assert_allclose(fn(q, k, v, batch=BATCH)[..., one, :], v[..., one, :], rtol=1e-13)
    dif, sg = ref.difformer_attention(q, k, v, batch=BATCH), ref.sgformer_attention(q, k, v, batch=BATCH)
    assert np.linalg.norm(dif - sg) > 0.1 * np.linalg.norm(sg)


def test_frobenius_normalize_unit_norms_and_zero_graph():
    q, _, _ = inputs(3)
    q[..., BATCH == 3, :] = 0
    joint = ref.frobenius_normalize(q, batch=BATCH)
    apart = ref.frobenius_normalize(q, batch=BATCH, joint_heads=False)
    for g in (0, 1):
        rows = BATCH == g
        np.testing.assert_allclose((joint[..., rows, :] ** 2).sum((-3, -2, -1)), 1.0, rtol=1e-13)
        np.testing.assert_allclose((apart[..., rows, :] ** 2).sum((-2, -1)), 1.0, rtol=1e-13)
    assert (joint[..., BATCH == 3, :] == 0).all() and (apart[..., BATCH == 3, :] == 0).all()


def test_zero_q_gives_the_constant_term():
    q, k, v = inputs(4)
    rows = BATCH == 3
    q[..., rows, :] = 0
    dif = ref.difformer_attention(q, k, v, batch=BATCH)
    sg = ref.sgformer_attention(q, k, v, batch=BATCH)
    np.testing.assert_allclose(dif[..., rows, :], np.broadcast_to(v[..., rows, :].mean(-2, keepdims=True),
                                                                  v[..., rows, :].shape), rtol=1e-13)
    np.testing.assert_allclose(sg[..., rows, :], v[..., rows, :], rtol=1e-13)


def test_vanished_denominator_raises():
    q, k, v = inputs(5, lead=())
    k[4] = -2 * q[4]  # node 4 is the one-node graph 1
    with pytest.raises(DenominatorError, match="one-node graph"):
        ref.difformer_attention(q, k, v, batch=BATCH)


@pytest.mark.parametrize("fn", [ref.difformer_attention, ref.sgformer_attention])
def test_bad_inputs(fn):
    q, k, v = inputs(6)
    with pytest.raises(ValueError, match=r"batch must be sorted.*batch\[5\] = 0 follows batch\[4\] = 1"):
        fn(q, k, v, batch=np.array([0, 0, 0, 0, 1, 0] + [3] * (N - 6)))
    with pytest.raises(ValueError, match=f"batch has {N - 1} entries"):
        fn(q, k, v, batch=BATCH[1:])
    with pytest.raises(TypeError, match="batch must be an integer array"):
        fn(q, k, v, batch=BATCH.astype(float))
    with pytest.raises(ValueError, match="labels >= 0"):
        fn(q, k, v, batch=BATCH - 1)
    for name, idx in (("q", 0), ("k", 1), ("v", 2)):
        args = [q.copy(), k.copy(), v.copy()]
        args[idx][0, 1, 2, 0] = np.nan
        with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
            fn(*args, batch=BATCH)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        fn(q, k[..., :-1], v)
    with pytest.raises(ValueError, match="v must have shape"):
        fn(q, k, v[..., :-1, :])
    with pytest.raises(TypeError, match="complex"):
        fn(q + 0j, k, v)


def test_never_imports_torch():
    source = pathlib.Path(ref.__file__).read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names <= {"__future__", "numpy", "reference"}, names
