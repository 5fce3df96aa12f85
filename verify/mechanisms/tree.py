"""Registry records: tree-exp, tree-dc, tree-diam (choromanski22 Lemma 3.5, 6.1, 6.2; docs/papers.md Sec. 2).

Problems are FAVOR+ attention (verify.favor) with a tree-distance mask on a forest whose parent
array (and edge lengths) live in problem.extras, so reference/ (dense csgraph distances) and
fast/ (the tree recursions) build the same mask. The forests come from verify.problems (the one
place for tree generators); each record declares the tree families as variants, the default
first: its historical problem (a mixed or random forest), then one tree of each family in
verify.problems.TREE_FAMILIES. q, k, v have shape (*batch, N, 16); one forest serves every
(batch, head) slice.

tree-dc and tree-diam declare f (N,) as their mask parameter (Mechanism.mask_params): the fast
masks take it through ``verify.favor.mask_tensor`` (a torch.Tensor is held, not copied), so the
"update" and "learnable" protocol variants reach the operator. Equivalence-only variants
(sweep=False) set the operators' options: TreeDCMask's dense_threshold (a small one forces the
separator recursion at small N, where the default's dense blocks would do everything) and
max_chunk_bytes (several product steps). tree-exp's a, b are plain floats: no mask parameters.
"""
from __future__ import annotations

import math

import numpy as np

from fast.masks.tree import Forest, TreeDCMask, TreeDiamMask, TreeExpMask, forest_diameter
from measure import roofline
from reference.masks import tree as ref_tree
from verify import problems  # the tree generators, used as problems.<name>: one import path for them
from verify.favor import favor_mechanism, favor_problem, mask_tensor, numpy_values
from verify.problems import TREE_FAMILIES, Problem, rng_for
from verify.registry import Roofline, Variant, register

#: perf/<id> of the tree masks: the mask product on (N, 64) columns of the default variant's forest
#: against one bare scatter of those rows into their parents (reported only: no target).
SCATTER_ROOFLINE = Roofline("scatter", roofline.mask_product_case("scatter"))

TREE_A = -0.3  # f(z) = exp(a z + b): decay with distance (the stable sign, Lemma 3.5)
TREE_B = 0.2
#: tree-exp on one tree of a family: unit edge lengths, f(z) = exp(-0.3 z).
FAMILY_A, FAMILY_B = -0.3, 0.0
#: Quick sweeps of the default variants stop at 2^15 (fast) and 2^12 (dense): three tree
#: mechanisms must fit verify --quick.
QUICK = dict(quick_fast_sizes=tuple(2**p for p in range(8, 16)), quick_dense_sizes=tuple(2**p for p in range(7, 13)))
#: Fast grids of the one-family variants: each is a whole extra sweep, so they stop earlier.
FAMILY_SIZES = dict(quick_fast_sizes=tuple(2**p for p in range(8, 15)), fast_sizes=tuple(2**p for p in range(8, 17)))
#: tree-diam on a path or a caterpillar costs O(N^2) (diam ~ N): an attention call pushes
#: m d + m = 272 columns through the mask, ~12 s at N = 2^11 on one thread, so the fast grids stop
#: at 2^11 (quick 2^10) and the dense twin at 2^12 (quick 2^11).
LONG_DIAM_SIZES = dict(quick_fast_sizes=tuple(2**p for p in range(7, 11)),
                       fast_sizes=tuple(2**p for p in range(7, 12)),
                       quick_dense_sizes=tuple(2**p for p in range(7, 12)),
                       dense_sizes=tuple(2**p for p in range(7, 13)))
#: Salt of the generator of the one-family trees (only "random recursive" draws from it).
FAMILY_SALT = 67

#: dense_threshold of tree-dc's "dense-threshold" variant: every subproblem of more than 2 nodes is split.
DC_SMALL_THRESHOLD = 2
#: tree-dc's "chunked" variant: dense_threshold 4 (so that even N = 37, whose mixed forest has trees
#: of 6 and 7 nodes, has separator rows) and 16 KiB steps: with (2, 2) batch dims a float64 step
#: holds one bin of a Hankel row and one dense block for the 256 numerator columns (5 bins and 2
#: blocks for the 16 denominator columns), so every product runs in many steps (~8x the unchunked
#: scatters at N = 300).
DC_CHUNK = dict(dense_threshold=4, max_chunk_bytes=16 * 2**10)
#: tree-diam's "chunked" variant: max_chunk_bytes holds this many columns (float64, at the
#: problem's batch dims): odd, so that the column counts (multiples of 16) end on a ragged chunk.
DIAM_CHUNK_COLUMNS = 5

MIXED = "mixed forest"
RANDOM = "random forest"


def family_parent(family: str, n: int, seed: int) -> np.ndarray:
    """Parent array (n,) of one unweighted tree of ``family`` (verify.problems.tree_parent)."""
    return problems.tree_parent(family, n, rng_for(seed, FAMILY_SALT))


def _family_variants(**sizes) -> tuple[Variant, ...]:
    return tuple(Variant(f, f"one {f} tree", params={"family": f}, **sizes) for f in TREE_FAMILIES)


# ---------------------------------------------------------------------------------- tree-exp


def tree_exp_problem(n: int, seed: int, family: str = RANDOM, a: float = TREE_A, b: float = TREE_B, *,
                     batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs and a forest for M_ij = exp(a dist(i, j) + b) (0 between trees).

    family "random forest": random recursive trees with a few extra roots and edge lengths
    uniform on [0.5, 1.5] (verify.problems.random_forest); a tree family: one tree, unit lengths.
    """
    if family == RANDOM:
        parent, weights = problems.random_forest(n, seed)
    else:
        parent, weights = family_parent(family, n, seed), np.ones(n)
    return favor_problem(n, seed, batch=batch, parent=parent, weights=weights, a=np.float64(a), b=np.float64(b))


def _tree_exp_dense(p: Problem) -> np.ndarray:
    adj = ref_tree.forest_adjacency(p.extras["parent"], weights=p.extras["weights"])
    return ref_tree.exp_affine_mask(adj, float(p.extras["a"]), float(p.extras["b"]))


def _tree_exp_fast(p: Problem, device) -> TreeExpMask:
    forest = Forest.from_parent(p.extras["parent"], p.extras["weights"])
    return TreeExpMask(forest, float(p.extras["a"]), float(p.extras["b"]))


register(favor_mechanism(
    "tree-exp", "Tree mask exp(a dist + b), two-phase recursion", "choromanski22 Lemma 3.5", "N",
    problem=tree_exp_problem, dense_mask=_tree_exp_dense, fast_mask=_tree_exp_fast, **QUICK,
    variants=(Variant(RANDOM, f"weighted random recursive forest, a = {TREE_A}, b = {TREE_B}",
                      params={"family": RANDOM}),
              *(Variant(f, f"one {f} tree, unit edges, a = {FAMILY_A}, b = {FAMILY_B}",
                        params={"family": f, "a": FAMILY_A, "b": FAMILY_B}, **FAMILY_SIZES) for f in TREE_FAMILIES)),
    scale=True, roofline=SCATTER_ROOFLINE,
    notes=f"Weighted random recursive forest, a = {TREE_A}, b = {TREE_B}; corrected Eqs. 11, 15, 16.",
))


# ------------------------------------------------------------------ any f: tree-dc, tree-diam


def tree_f(n: int) -> np.ndarray:
    """f(l) = (1 + l)^-1.5: positive, and not exp-affine (so only Lemma 6.1/6.2 apply)."""
    return (1.0 + np.arange(n)) ** -1.5


#: tree-diam's path and caterpillar components are capped so the forest's diameter is O(log N)
#: (binary and random trees): its default sweep then measures O(N log N); the "path" and
#: "caterpillar" variants show the diam factor.
DIAM_CHAIN = 16


def _any_f_problem(n: int, seed: int, family: str, max_chain: int | None, batch: tuple[int, ...],
                   options: dict) -> Problem:
    parent = problems.mixed_forest(n, seed, max_chain) if family == MIXED else family_parent(family, n, seed)
    return favor_problem(n, seed, batch=batch, parent=parent, f=tree_f(n), **options)


def tree_dc_problem(n: int, seed: int, family: str = MIXED, *, batch: tuple[int, ...] = (),
                    dense_threshold: int | None = None, max_chunk_bytes: int | None = None) -> Problem:
    """FAVOR+ inputs, f(l) = (1 + l)^-1.5 and a forest: the mixed forest (every family at once,
    verify.problems.mixed_forest) or one unweighted tree of ``family``. dense_threshold and
    max_chunk_bytes: TreeDCMask's options, kept in extras when given (None: its defaults)."""
    options = {k: int(v) for k, v in (("dense_threshold", dense_threshold), ("max_chunk_bytes", max_chunk_bytes))
               if v is not None}
    return _any_f_problem(n, seed, family, None, batch, options)


def tree_diam_problem(n: int, seed: int, family: str = MIXED, *, batch: tuple[int, ...] = (),
                      chunked: bool = False) -> Problem:
    """As tree_dc_problem, but the mixed forest's path and caterpillar hold at most DIAM_CHAIN nodes.

    chunked: extras max_chunk_bytes of TreeDiamMask holds DIAM_CHUNK_COLUMNS columns of its
    product at this forest and batch (float64), so every product runs in several column chunks.
    """
    p = _any_f_problem(n, seed, family, DIAM_CHAIN, batch, {})
    if chunked:
        per_column = TreeDiamMask(Forest.from_parent(p.extras["parent"]), p.extras["f"]).elems_per_column
        p.extras["max_chunk_bytes"] = DIAM_CHUNK_COLUMNS * int(np.prod(batch, dtype=np.int64)) * per_column * 8
    return p


def _any_f_dense(p: Problem) -> np.ndarray:
    return ref_tree.tree_mask(ref_tree.forest_adjacency(p.extras["parent"]), numpy_values(p.extras["f"]))


#: extras that are options of the tree operators (passed on as keywords when present)
_OPTIONS = {TreeDCMask: ("dense_threshold", "max_chunk_bytes"), TreeDiamMask: ("max_chunk_bytes",)}


def _any_f_fast(cls):
    def make(p: Problem, device):
        kw = {k: int(p.extras[k]) for k in _OPTIONS[cls] if k in p.extras}
        return cls(Forest.from_parent(p.extras["parent"]), mask_tensor(p.extras["f"], device), **kw)
    return make


def _protocol_variants() -> tuple[Variant, ...]:
    """The "update" (f changed in place between two calls of one operator) and "learnable" (f a
    leaf that requires grad) variants of the mixed forest; equivalence-only."""
    return (Variant("update", "mixed forest, f changed in place between two calls of one operator",
                    sweep=False, protocol="update"),
            Variant("learnable", "mixed forest, f a leaf that requires grad: forward and gradient",
                    sweep=False, protocol="learnable"))


def tree_diameter(p: Problem) -> float:
    """diam of the problem's forest (edges, at least 1), tree-diam's cost factor ("N diam")."""
    return float(max(1, forest_diameter(Forest.from_parent(p.extras["parent"]))))


def tree_dc_metrics(p: Problem) -> dict[str, float]:
    """TreeDCMask's plan at the problem's forest: recursion depth with its bound log_1.5 N
    (Lemma 6.1's balanced split), and the number of subproblems."""
    op = _any_f_fast(TreeDCMask)(p, "cpu")  # the variant's dense_threshold, if any
    return {"recursion_depth": float(op.recursion_depth), "recursion_depth bound": math.log(p.n, 1.5),
            "num_subproblems": float(op.num_subproblems)}


register(favor_mechanism(
    "tree-dc", "Tree mask f(dist), separator divide and conquer + FFT Hankel", "choromanski22 Lemma 6.1", "N log^2 N",
    problem=tree_dc_problem, dense_mask=_any_f_dense, fast_mask=_any_f_fast(TreeDCMask), **QUICK,
    variants=(Variant(MIXED, "mixed forest: path, star, caterpillar, complete binary, 2 random recursive",
                      params={"family": MIXED}),
              *_family_variants(**FAMILY_SIZES),
              Variant("dense-threshold", f"mixed forest, dense_threshold={DC_SMALL_THRESHOLD}: the deepest recursion",
                      params={"dense_threshold": DC_SMALL_THRESHOLD}, sweep=False),
              Variant("chunked", "mixed forest, dense_threshold=4, max_chunk_bytes=16 KiB: many product steps",
                      params=DC_CHUNK, sweep=False),
              *_protocol_variants()),
    metrics=tree_dc_metrics, mask_params=("f",), roofline=SCATTER_ROOFLINE,
    notes="Mixed forest (path, star, caterpillar, binary, random trees), f(l) = (1 + l)^-1.5.",
))
register(favor_mechanism(
    "tree-diam", "Tree mask f(dist), depth arrays", "choromanski22 Lemma 6.2", "N diam",
    problem=tree_diam_problem, dense_mask=_any_f_dense, fast_mask=_any_f_fast(TreeDiamMask), **QUICK,
    variants=(Variant(MIXED, f"mixed forest, path and caterpillar capped at {DIAM_CHAIN} nodes (diam O(log N))",
                      params={"family": MIXED}),
              *(Variant(f, f"one {f} tree", params={"family": f},
                        **(LONG_DIAM_SIZES if f in ("path", "caterpillar") else FAMILY_SIZES)) for f in TREE_FAMILIES),
              Variant("chunked", f"mixed forest, max_chunk_bytes of {DIAM_CHUNK_COLUMNS} columns: several chunks",
                      params={"chunked": True}, sweep=False),
              *_protocol_variants()),
    mask_params=("f",),
    cost_factor=tree_diameter, cost_factor_name="diam", roofline=SCATTER_ROOFLINE,
    notes=f"Mixed forest with path and caterpillar capped at {DIAM_CHAIN} nodes (diam O(log N)), f(l) = (1 + l)^-1.5.",
))
