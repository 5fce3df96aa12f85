"""fast/masks/tree.py: Forest, TreeExpMask (Lemma 3.5), TreeDiamMask (Lemma 6.2), TreeDCMask
(Lemma 6.1) and tree_mask_operator against the dense reference (csgraph distances).

Dense ground truth: reference.masks.tree.tree_mask / exp_affine_mask on the same forest given
as a parent array, edge_index or scipy adjacency. Comparisons use the relative Frobenius error
with tests.helpers.EQUIV_TOL (float64 1e-10, float32 1e-4): the products sum at most a few hundred
terms, and the FFT rows add round-off of order u log N |f| |y|.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fast.masks.tree as tree_mod
from fast import (
    Forest,
    TreeDCMask,
    TreeDiamMask,
    TreeExpMask,
    forest_diameter,
    masked_linear_attention,
    tree_mask_operator,
)
from fast.masks.tree import _subtree_ends
from reference.attention import masked_kernel_attention
from reference.masks.tree import diameter, exp_affine_mask, forest_adjacency, tree_distances, tree_mask
from tests.helpers import EQUIV_TOL, gen, np_, positive, randn, rel_frobenius


# ------------------------------------------------------------------------------- forests

def path(n: int) -> np.ndarray:
    return np.arange(-1, n - 1)


def star(n: int) -> np.ndarray:
    return np.concatenate([[-1], np.zeros(n - 1, dtype=np.int64)])


def binary(n: int) -> np.ndarray:
    return np.concatenate([[-1], (np.arange(1, n) - 1) // 2])


def caterpillar(n: int) -> np.ndarray:
    """A spine of ceil(n / 3) nodes, each with legs: long diameter, many leaves."""
    spine = max(1, -(-n // 3))
    par = np.empty(n, dtype=np.int64)
    par[:spine] = np.arange(-1, spine - 1)
    par[spine:] = np.arange(n - spine) % spine
    return par


def random_tree(n: int, seed: int) -> np.ndarray:
    """Random recursive tree: node i joins a uniform earlier node (depth ~ e ln n)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[-1], np.floor(rng.random(n - 1) * np.arange(1, n))]).astype(np.int64)


def random_forest(n: int, seed: int, root_prob: float = 0.08) -> np.ndarray:
    """A random recursive tree with extra roots, relabelled by a random permutation."""
    rng = np.random.default_rng(seed + 1000)
    par = random_tree(n, seed)
    par[rng.random(n) < root_prob] = -1
    perm = rng.permutation(n)  # node i becomes perm[i]
    out = np.full(n, -1, dtype=np.int64)
    has = par >= 0
    out[perm[has]] = perm[par[has]]
    return out


SHAPES = {
    "path": path, "star": star, "binary": binary, "caterpillar": caterpillar,
    "random_tree": lambda n: random_tree(n, n), "random_forest": lambda n: random_forest(n, n),
}
SIZES = [1, 2, 3, 7, 40, 129, 300]


def f_table(kind: str, n: int) -> torch.Tensor:
    d = torch.arange(n, dtype=torch.float64)
    if kind == "random":
        return torch.randn(n, generator=gen(n + 7), dtype=torch.float64)
    if kind == "decay":
        return torch.exp(-0.3 * d)
    if kind == "alternating":
        return (-1.0) ** d / (1 + d)
    if kind == "ones":
        return torch.ones(n, dtype=torch.float64)
    raise ValueError(kind)


def dense(parent: np.ndarray, f: torch.Tensor) -> np.ndarray:
    return tree_mask(forest_adjacency(parent), np_(f))


def check(op, parent, f, x, dtype=None):
    m = torch.as_tensor(dense(parent, f))
    out = op.matmul(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    err = rel_frobenius(out, m @ x.double())
    assert err < EQUIV_TOL[dtype or x.dtype], err


# ------------------------------------------------------------------------------- Forest

def test_from_parent_level_order():
    par = np.array([-1, 0, 0, 1, 1, -1, 5, 3])
    fo = Forest.from_parent(par)
    assert fo.n == 8 and fo.height == 3
    np.testing.assert_array_equal(fo.position[fo.order], np.arange(8))
    depth = np.repeat(np.arange(fo.height + 1), np.diff(fo.level_starts))
    # every non-root's parent sits one level up, and is its parent
    has = fo.parent_pos >= 0
    np.testing.assert_array_equal(depth[fo.parent_pos[has]] + 1, depth[has])
    np.testing.assert_array_equal(fo.order[fo.parent_pos[has]], par[fo.order[has]])
    assert set(fo.order[: fo.level_starts[1]]) == {0, 5}


def _edges_of(parent):
    child = np.flatnonzero(parent >= 0)
    return np.stack([child, parent[child]])


@pytest.mark.parametrize("how", ["parent", "edge_once", "edge_both", "edge_reversed", "scipy"])
def test_constructors_agree_with_reference(how):
    n = 60
    par = random_forest(n, 3)
    rng = np.random.default_rng(5)
    w_par = rng.uniform(0.5, 1.5, n)
    e = _edges_of(par)
    w_e = w_par[e[0]]
    if how == "parent":
        fo = Forest.from_parent(par, w_par)
    elif how == "edge_once":
        fo = Forest.from_edge_index(e, n=n, weights=w_e)
    elif how == "edge_reversed":
        fo = Forest.from_edge_index(e[::-1].copy(), n=n, weights=w_e)
    elif how == "edge_both":
        fo = Forest.from_edge_index(np.concatenate([e, e[::-1]], axis=1), n=n, weights=np.concatenate([w_e, w_e]))
    else:
        fo = Forest.from_scipy(forest_adjacency(par, weights=w_par))
    x = randn((n, 3), gen(1))
    m = exp_affine_mask(forest_adjacency(par, weights=w_par), -0.4, 0.1)
    assert rel_frobenius(TreeExpMask(fo, -0.4, 0.1).matmul(x), m @ np_(x)) < 1e-12


def test_from_edge_index_torch_and_isolated_nodes():
    e = torch.tensor([[0, 1], [1, 2]])
    fo = Forest.from_edge_index(e, n=5)
    assert fo.n == 5 and fo.height == 2 and fo.level_starts[1] == 3  # roots 0, 3, 4


@pytest.mark.parametrize("build, match", [
    (lambda: Forest.from_edge_index(np.array([[0, 1, 2], [1, 2, 0]])), "cycle"),
    (lambda: Forest.from_edge_index(np.array([[0, 1], [1, 1]])), "self-loop"),
    (lambda: Forest.from_parent(np.array([-1, 1])), "parent entries"),
    (lambda: Forest.from_parent(np.array([-1, 5])), "parent entries"),
    (lambda: Forest.from_parent(np.array([-1, -2])), "parent entries"),
    (lambda: Forest.from_parent(np.array([-1.0, 0.0])), "integer"),
    (lambda: Forest.from_parent(np.array([-1, 0]), weights=np.array([1.0, -1.0])), "non-negative"),
    (lambda: Forest.from_parent(np.array([-1, 0]), weights=np.array([1.0, np.inf])), "finite"),
    (lambda: Forest.from_parent(np.array([-1, 0]), weights=np.array([1.0, 1.0, 1.0])), "shape"),
    (lambda: Forest.from_edge_index(np.array([[0], [3]]), n=3), r"\[0, n=3\)"),
    (lambda: Forest.from_edge_index(np.array([[0], [1]]), weights=np.array([np.nan])), "finite"),
    (lambda: Forest.from_scipy(sp.csr_matrix(np.array([[0.0, 1.0], [2.0, 0.0]]))), "symmetric"),
    (lambda: Forest.from_scipy(sp.csr_matrix(np.array([[1.0, 1.0], [1.0, 0.0]]))), "self-loops"),
    (lambda: Forest.from_scipy(sp.csr_matrix(np.ones((3, 3)) - np.eye(3))), "cycle"),
])
def test_forest_rejects_bad_input(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_subtree_ends_are_preorder_subtree_sizes():
    for seed in range(5):
        par = random_forest(200, seed)
        fo = Forest.from_parent(par)
        op = TreeDCMask(fo, torch.ones(200))
        # brute force: a node's subtree in preorder is [p, p + size), in the Forest's own rooting
        # (each tree rooted at its smallest node, not necessarily the given parent array's roots)
        pre = op._plan_np["pre_node"]
        label = op._plan_np["label"]
        par = np.full(200, -1)
        has = fo.parent_pos >= 0
        par[fo.order[has]] = fo.order[fo.parent_pos[has]]
        size = np.ones(200, dtype=np.int64)
        for i in range(200):
            j = par[i]
            while j >= 0:
                size[j] += 1
                j = par[j]
        np.testing.assert_array_equal(op._end - np.arange(200), size[pre])
        np.testing.assert_array_equal(_subtree_ends(op._depth), op._end)
        assert np.all(label[pre] == np.arange(200))


# ------------------------------------------------------------------------------- TreeExpMask

@pytest.mark.parametrize("a", [-1.3, -0.2, 0.0, 0.05, 0.3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tree_exp_weighted_forests(a, dtype):
    n = 150
    par = random_forest(n, 11)
    w = np.random.default_rng(2).uniform(0.5, 1.5, n)
    x = randn((2, n, 4), gen(3), dtype=dtype)
    out = TreeExpMask(Forest.from_parent(par, w), a, -0.1).matmul(x)
    m = exp_affine_mask(forest_adjacency(par, weights=w), a, -0.1)
    assert out.dtype == dtype and rel_frobenius(out, m @ np_(x)) < EQUIV_TOL[dtype]


def test_tree_exp_refuses_positive_a_on_a_deep_tree():
    fo = Forest.from_parent(path(2000))
    with pytest.raises(ValueError, match="round-off"):
        TreeExpMask(fo, 1.0)
    TreeExpMask(fo, -1.0)  # decay is fine at any depth


# ------------------------------------------------------------------------------- any f

@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("n", SIZES)
def test_diam_and_dc_equal_dense(shape, n):
    par = SHAPES[shape](n)
    fo = Forest.from_parent(par)
    x = randn((2, n, 3), gen(n))
    for kind in ("random", "decay"):
        f = f_table(kind, n)
        check(TreeDiamMask(fo, f), par, f, x)
        check(TreeDCMask(fo, f, dense_threshold=2), par, f, x)


@pytest.mark.parametrize("threshold", [1, 2, 64])
@pytest.mark.parametrize("ratio", [0, tree_mod.HANKEL_DENSE_RATIO, 10**9])
def test_dc_thresholds_and_row_kinds(threshold, ratio, monkeypatch):
    """ratio 0: every cross row by FFT; 10^9: every row a dense Hankel GEMM; tiny chunks too."""
    monkeypatch.setattr(tree_mod, "HANKEL_DENSE_RATIO", ratio)
    for shape, n in (("path", 300), ("caterpillar", 200), ("random_forest", 250), ("star", 90)):
        par = SHAPES[shape](n)
        fo = Forest.from_parent(par)
        x = randn((n, 5), gen(n + threshold))
        for kind in ("random", "alternating") if threshold < 64 else ("random", "ones"):
            f = f_table(kind, n)
            op = TreeDCMask(fo, f, dense_threshold=threshold)
            check(op, par, f, x)
            if ratio == 0 and threshold <= 2 and shape == "path":
                assert op.num_fft_rows > 0
        check(TreeDCMask(fo, f, dense_threshold=threshold, max_chunk_bytes=1), par, f, x)


@pytest.mark.parametrize("ratio", [0, tree_mod.HANKEL_DENSE_RATIO])
@pytest.mark.parametrize("shape", ["path", "random_forest", "binary"])
def test_float32(shape, ratio, monkeypatch):
    monkeypatch.setattr(tree_mod, "HANKEL_DENSE_RATIO", ratio)
    n = 300
    par = SHAPES[shape](n)
    fo = Forest.from_parent(par)
    x = randn((2, n, 4), gen(5), dtype=torch.float32)
    for kind in ("random", "decay"):
        f = f_table(kind, n)
        check(TreeDiamMask(fo, f.float()), par, f, x)
        check(TreeDCMask(fo, f.float(), dense_threshold=2), par, f, x)
        check(TreeDCMask(fo, f, dense_threshold=8), par, f, x)  # float64 f, float32 x: computes in float32


@pytest.mark.parametrize("cls", [TreeDiamMask, TreeDCMask])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision(cls, dtype):
    n = 120
    par = random_forest(n, 4)
    f = f_table("decay", n)
    x = randn((n, 6), gen(2)).to(dtype)
    out = cls(Forest.from_parent(par), f.float()).matmul(x)
    assert out.dtype == dtype
    tol = EQUIV_TOL[torch.float32] if dtype == torch.float32 else 1e-2  # the output is rounded to 8 / 11 bits
    assert rel_frobenius(out, dense(par, f) @ np_(x)) < tol


@pytest.mark.parametrize("cls", [TreeDiamMask, TreeDCMask])
def test_batched_leading_dims_and_chunks(cls):
    n = 97
    par = caterpillar(n)
    f = f_table("random", n)
    x = randn((2, 3, n, 4), gen(9))
    op = cls(Forest.from_parent(par), f, max_chunk_bytes=1)  # one column / row per step
    out = op.matmul(x)
    m = torch.as_tensor(dense(par, f))
    assert rel_frobenius(out, m @ x) < 1e-10
    assert rel_frobenius(cls(Forest.from_parent(par), f).matmul(x), out) < 1e-12
    for i in range(2):  # each batch element alone
        assert rel_frobenius(op.matmul(x[i, 1]), m @ x[i, 1]) < 1e-10


@pytest.mark.parametrize("cls, kw, ratio", [(TreeDiamMask, {}, 0), (TreeDCMask, {"dense_threshold": 1}, 0),
                                            (TreeDCMask, {"dense_threshold": 1}, 10**9),
                                            (TreeDCMask, {"dense_threshold": 3}, 0)])
def test_gradcheck(cls, kw, ratio, monkeypatch):
    """ratio 0: the cross rows go through rfft / irfft; 10^9: through dense Hankel GEMMs."""
    monkeypatch.setattr(tree_mod, "HANKEL_DENSE_RATIO", ratio)
    n = 11
    par = random_forest(n, 2, root_prob=0.15)
    fo = Forest.from_parent(par)
    x = randn((n, 2), gen(1)).requires_grad_()
    f = randn((n,), gen(2)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, f: cls(fo, f, **kw).matmul(x), (x, f))


def test_grad_of_f_matches_dense():
    """d/df(k) sum(w * M x) = sum over pairs at distance k of w_i . x_j."""
    n = 70
    par = random_forest(n, 8)
    fo = Forest.from_parent(par)
    x, w = randn((n, 3), gen(3)), randn((n, 3), gen(4))
    dist = np.rint(np.nan_to_num(tree_distances(forest_adjacency(par)), posinf=-1)).astype(int)
    pair = np_(w) @ np_(x).T
    expected = np.array([pair[dist == k].sum() for k in range(n)])
    for op_cls in (TreeDiamMask, TreeDCMask):
        f = f_table("random", n).requires_grad_()
        (op_cls(fo, f).matmul(x) * w).sum().backward()
        np.testing.assert_allclose(np_(f.grad), expected, rtol=1e-10, atol=1e-10)


def test_attention_with_tree_mask_equals_dense():
    n, m, d = 80, 4, 3
    par = random_forest(n, 6)
    f = f_table("decay", n)
    g = gen(12)
    pq, pk, v = positive((n, m), g), positive((n, m), g), randn((n, d), g)
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), dense(par, f))
    for op in (TreeDiamMask(Forest.from_parent(par), f), TreeDCMask(Forest.from_parent(par), f, dense_threshold=4)):
        assert rel_frobenius(masked_linear_attention(pq, pk, v, op), expected) < 1e-10


# ------------------------------------------------------------------------------- plan, diameter, auto

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_forest_diameter(shape):
    for n in (1, 2, 5, 64, 201):
        par = SHAPES[shape](n)
        assert forest_diameter(Forest.from_parent(par)) == diameter(forest_adjacency(par))


def test_recursion_depth_and_subproblems():
    n = 1024
    op = TreeDCMask(Forest.from_parent(path(n)), torch.ones(n), dense_threshold=2)
    assert op.recursion_depth == math.ceil(math.log2(n - 1))  # halves
    assert op.num_subproblems == op.num_dense_blocks + int(op._plan_np["splits"].sum())
    for shape in ("star", "caterpillar", "random_tree", "binary"):
        op = TreeDCMask(Forest.from_parent(SHAPES[shape](n)), torch.ones(n), dense_threshold=1)
        assert op.recursion_depth <= math.log(n) / math.log(1.5) + 1, shape  # parts <= 2(m - 1)/3 + 1
    op = TreeDCMask(Forest.from_parent(np.full(n, -1)), torch.ones(n))  # isolated nodes: packed blocks
    assert op.recursion_depth == 0 and op.num_dense_blocks == n // 64


def test_auto_choice():
    n = 256
    f = torch.ones(n)
    assert isinstance(tree_mask_operator(Forest.from_parent(star(n)), f), TreeDiamMask)
    assert isinstance(tree_mask_operator(Forest.from_parent(binary(n - 1)), f[:-1]), TreeDiamMask)
    assert isinstance(tree_mask_operator(Forest.from_parent(path(n)), f), TreeDCMask)
    assert isinstance(tree_mask_operator(Forest.from_parent(path(n)), f, method="diam"), TreeDiamMask)
    assert isinstance(tree_mask_operator(Forest.from_parent(star(n)), f, method="dc"), TreeDCMask)
    with pytest.raises(ValueError, match="method"):
        tree_mask_operator(Forest.from_parent(star(n)), f, method="fft")


@pytest.mark.parametrize("make", [TreeDiamMask, TreeDCMask, tree_mask_operator])
def test_any_f_rejects_bad_input(make):
    n = 10
    fo = Forest.from_parent(random_tree(n, 1))
    with pytest.raises(ValueError, match="unweighted"):
        make(Forest.from_parent(random_tree(n, 1), np.full(n, 2.0)), torch.ones(n))
    with pytest.raises(ValueError, match=r"f must have shape \(10,\)"):
        make(fo, torch.ones(n + 1))
    with pytest.raises(ValueError, match=r"f must have shape"):
        make(fo, torch.ones(n, 1))
    for bad in (math.nan, math.inf):
        g = torch.ones(n)
        g[3] = bad
        with pytest.raises(ValueError, match="f contains non-finite"):
            make(fo, g)
    with pytest.raises(TypeError, match="Forest"):
        make(random_tree(n, 1), torch.ones(n))  # a parent array is not a Forest
    op = make(fo, np.ones(n))  # arrays are accepted
    with pytest.raises(ValueError, match="N=10"):
        op.matmul(torch.ones(n + 1, 2))
    with pytest.raises(TypeError, match="floating"):
        op.matmul(torch.ones(n, 2, dtype=torch.int64))


def test_dc_rejects_bad_options():
    fo = Forest.from_parent(path(5))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="dense_threshold"):
            TreeDCMask(fo, torch.ones(5), dense_threshold=bad)
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        TreeDiamMask(fo, torch.ones(5), max_chunk_bytes=0)
