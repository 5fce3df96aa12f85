"""The NumPy plan of the separator recursion of TreeDCMask (choromanski22 Lemma 6.1; docs/papers.md
Sec. 2).

Set-up only, once per forest (and dense_threshold), independent of f, the device and the dtype:
the depth-first preorder, the centroid splits, the Hankel rows of every split and the dense
blocks of the leaves, flattened into index arrays; O(n log n) time and memory. One plan can serve
masks with different f (one per head, say). Labels are preorder positions, so every subproblem
is a few contiguous ranges and the product's gathers stay local. This module imports no torch
(a test checks it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fast.fft import fast_fft_size

if TYPE_CHECKING:  # only for the annotation: forest.py imports torch
    from fast.masks.tree.forest import Forest

#: A cross-term row multiplies by its dense p_out x p_in Hankel block (a GEMM) while
#: p_out p_in <= HANKEL_DENSE_RATIO N (N the FFT size it would need), else correlates by FFT: an
#: FFT bin and column (with the transposes torch makes for an FFT along the token axis) costs about
#: a hundred GEMM multiply-adds (measured, one thread). This bounds the dense rows to p <= ~256, so
#: the asymptotic cost is unchanged.
HANKEL_DENSE_RATIO = 64

#: Subproblems of at most this many nodes become dense blocks (TreeDCMask's default).
DEFAULT_DENSE_THRESHOLD = 64

#: Row kinds in SeparatorPlan.row_key[r][0].
DENSE_ROW, FFT_ROW = 0, 1


@dataclass(frozen=True, eq=False)
class SeparatorPlan:
    """The separator recursion of Lemma 6.1 on one unweighted forest, as NumPy index arrays; build
    with ``SeparatorPlan.build(forest, dense_threshold)``. Fields (n nodes, R Hankel rows, S and T
    source and target entries over the rows; positions are preorder positions):

    - preorder: pre_node (n,) node id at each position, label (n,) its inverse, parent (n,) (-1 for
      roots), depth (n,), end (n,) (the subtree of p is [p, end[p])), splits (n,) how often p was
      the separator vertex v (the f(0) x_v fix);
    - Hankel rows, one per side of a split, sorted by row_key = (kind, z length, y length): kind
      DENSE_ROW multiplies y by H[a - 1, b - 1] = f(a + b), FFT_ROW correlates with f by FFTs of
      size z length = y length; y_start, z_start, w_start, src_off, tgt_off (R + 1,) offsets of each
      row's bins and entries; src_node, src_bin (S,) and tgt_node, tgt_bin (T,) positions and global
      bins; key_change the rows where the key changes;
    - blocks: per padded size s (a power of two), (s, nodes (count, s) int64, dists (count, s, s)
      int32), node n and distance n being padding (f_ext[n] = 0, as across trees);
    - recursion_depth, num_subproblems (splits plus dense blocks), num_dense_blocks, num_fft_rows.

    >>> from fast import Forest
    >>> from fast.masks.tree import SeparatorPlan
    >>> plan = SeparatorPlan.build(Forest.from_parent([-1] + list(range(15))), 4)   # a path of 16 nodes
    >>> plan.n, plan.recursion_depth, plan.num_dense_blocks, int(plan.splits.sum())
    (16, 3, 7, 6)
    """

    n: int
    dense_threshold: int
    pre_node: np.ndarray
    label: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    end: np.ndarray
    splits: np.ndarray
    row_key: tuple
    y_start: np.ndarray
    z_start: np.ndarray
    w_start: np.ndarray
    src_off: np.ndarray
    tgt_off: np.ndarray
    src_node: np.ndarray
    src_bin: np.ndarray
    tgt_node: np.ndarray
    tgt_bin: np.ndarray
    key_change: np.ndarray
    blocks: tuple
    recursion_depth: int
    num_subproblems: int
    num_dense_blocks: int
    num_fft_rows: int
    forest: object = field(default=None, repr=False)  # the Forest it was built from

    #: the flat index arrays a product copies to its device (blocks apart)
    INDEX_ARRAYS = ("src_node", "src_bin", "tgt_node", "tgt_bin", "splits", "pre_node", "label")

    @classmethod
    def build(cls, forest: "Forest", dense_threshold: int = DEFAULT_DENSE_THRESHOLD, *,
              hankel_dense_ratio: float | None = None) -> "SeparatorPlan":
        """Plan the recursion on an unweighted ``forest`` (checked by the caller, TreeDCMask).

        dense_threshold: a positive int; subproblems with at most max(dense_threshold, 2) nodes
        are dense blocks. hankel_dense_ratio: defaults to the module's HANKEL_DENSE_RATIO, read
        at call time. O(n log n) time and memory.
        """
        ratio = HANKEL_DENSE_RATIO if hankel_dense_ratio is None else hankel_dense_ratio
        return _Planner(forest, int(dense_threshold), ratio).plan()

    def index_arrays(self) -> dict[str, np.ndarray]:
        """The flat int64 index arrays of the product by name (``INDEX_ARRAYS``)."""
        return {k: getattr(self, k) for k in self.INDEX_ARRAYS}

    @property
    def nbytes(self) -> int:
        """Bytes held by the plan's arrays."""
        arrays = [v for v in vars(self).values() if isinstance(v, np.ndarray)]
        arrays += [a for _, nodes, dists in self.blocks for a in (nodes, dists)]
        return int(sum(a.nbytes for a in arrays))


class _Planner:
    """One planning pass: the preorder of the forest, then the recursion by an explicit stack."""

    def __init__(self, forest: "Forest", dense_threshold: int, ratio: float):
        self.forest, self.n = forest, forest.n
        self.dense_threshold, self.ratio = dense_threshold, ratio

    def plan(self) -> SeparatorPlan:
        fo, n = self.forest, self.n
        limit = max(self.dense_threshold, 2)  # two nodes cannot be split in two smaller trees
        # preorder labels: every subtree is a contiguous range [p, p + size)
        child, parent = fo.edges()
        pre_node = _preorder(n, child, parent, fo.roots())
        label = np.empty(n, dtype=np.int64)
        label[pre_node] = np.arange(n)
        parent_node = np.full(n, -1, dtype=np.int64)
        parent_node[child] = parent
        par = np.where(parent_node[pre_node] >= 0, label[np.maximum(parent_node[pre_node], 0)], -1)
        depth = fo.node_depths()[pre_node]
        end = _subtree_ends(depth)
        has = np.flatnonzero(par >= 0)
        if not (np.all(par[has] < has) and np.all(has < end[par[has]])):  # a preorder, as built
            raise RuntimeError("depth-first order is not a preorder; cannot plan the separator recursion")
        self._end, self._depth, self._par = end, depth, par

        cross: list = []  # (N, src labels, src dists, tgt labels, tgt dists) per Hankel product
        leaves: list = []  # (labels, dist matrix with -1 across trees) per dense block
        splits = np.zeros(n, dtype=np.int64)
        max_depth, count = 0, 0
        # trees of a forest small enough for a dense block: packed consecutively (preorder ranges)
        root_pos = np.flatnonzero(par < 0)
        sizes = end[root_pos] - root_pos
        stack: list = []
        run: list = []  # preorder ranges of small trees going into one dense block
        run_size = 0
        for r, s in zip(root_pos.tolist(), sizes.tolist()):
            if s > limit:
                stack.append((np.arange(r, r + s), 0))
                continue
            if run and run_size + s > limit:
                leaves.append(self._dense_block(np.concatenate(run)))
                run, run_size = [], 0
            run.append(np.arange(r, r + s))
            run_size += s
        if run:
            leaves.append(self._dense_block(np.concatenate(run)))
        count += len(leaves)
        while stack:
            s_lab, level = stack.pop()
            count += 1
            max_depth = max(max_depth, level)
            if s_lab.size <= limit:
                leaves.append(self._dense_block(s_lab))
                continue
            v, t1, t2, side1, side2 = self._split(s_lab)
            splits[v] += 1
            cross.extend(self._hankel_rows(side1, side2))
            stack.append((t1, level + 1))
            stack.append((t2, level + 1))
        stats = {"recursion_depth": max_depth, "num_subproblems": count, "num_dense_blocks": len(leaves)}
        return self._assemble(pre_node, label, cross, leaves, splits, stats)

    def _split(self, s_lab: np.ndarray) -> tuple:
        """Centroid split of the connected subset s_lab (sorted preorder labels) of one tree."""
        m = s_lab.size
        hi = np.searchsorted(s_lab, self._end[s_lab])  # the local subtree of s_lab[i] is [i, hi[i])
        size = hi - np.arange(m)
        heavy = np.flatnonzero(2 * size > m)  # a chain from the top; its lowest node is a centroid
        ci = int(heavy[np.argmin(size[heavy])])
        v = int(s_lab[ci])
        ce = int(hi[ci])
        kids = ci + 1 + np.flatnonzero(self._par[s_lab[ci + 1:ce]] == v)
        part = np.full(m, kids.size, dtype=np.int64)  # part kids.size: the component above v
        part[ci + 1:ce] = np.repeat(np.arange(kids.size), size[kids])
        part_size = np.append(size[kids], m - size[ci])
        # distances to v: below v by depth; above v through the lowest common ancestor on v's chain
        dist = self._depth[s_lab] - self._depth[v]
        chain = np.flatnonzero((s_lab <= v) & (self._end[s_lab] > v))  # top .. v, by depth
        outside = np.concatenate([np.arange(ci), np.arange(ce, m)])
        if outside.size:
            p = s_lab[outside]
            i1 = np.searchsorted(s_lab[chain], p, side="right") - 1
            i2 = np.searchsorted(-self._end[s_lab[chain]], -p, side="left") - 1
            lca_depth = self._depth[s_lab[0]] + np.minimum(i1, i2)
            dist[outside] = self._depth[p] + self._depth[v] - 2 * lca_depth
        # two groups: a prefix of the components by decreasing size, the one whose total is closest
        # to (m - 1) / 2. Each component has <= m / 2 nodes, so the largest prefix totalling
        # <= 2 (m - 1) / 3 leaves both groups in [(m - 1) / 3, 2 (m - 1) / 3]; the closest is as good.
        by_size = np.argsort(-part_size, kind="stable")
        total = np.cumsum(part_size[by_size])[:-1]  # prefixes of 1 .. parts - 1 components
        k = int(np.argmin(np.abs(2 * total - (m - 1)))) + 1
        group_of = np.ones(part_size.size, dtype=np.int64)
        group_of[by_size[:k]] = 0
        grp = group_of[part]
        grp[ci] = -1
        in1, in2 = grp == 0, grp == 1
        t1, t2 = s_lab[in1 | (grp < 0)], s_lab[in2 | (grp < 0)]
        return v, t1, t2, (s_lab[in1], dist[in1]), (s_lab[in2], dist[in2])

    def _hankel_rows(self, side1: tuple, side2: tuple) -> list:
        """The two cross-term rows of a split: (key, src labels, y bins, tgt labels, z bins).

        Row "T_2 into T_1" sums x over T_2 - {v} by distance b into y, and node i of T_1 - {v}
        reads z[a] = sum_b f(a + b) y[b] at a = dist(i, v); "T_1 into T_2" likewise. A key
        (kind, z length, y length) says how: kind 0 multiplies by the Hankel matrix
        H[a - 1, b - 1] = f(a + b) (a <= p_out, b <= p_in, powers of two) as a dense GEMM, used
        while p_out p_in <= HANKEL_DENSE_RATIO N; kind 1 correlates with f by FFTs of size N
        (y at bin b, z[a] at bin N - a, see TreeDCMask._cross_terms).
        """
        (lab1, d1), (lab2, d2) = side1, side2
        m1, m2 = int(d1.max()), int(d2.max())
        n_fft = fast_fft_size(m1 + m2 + 1)
        p1, p2 = 1 << (m1 - 1).bit_length(), 1 << (m2 - 1).bit_length()
        if p1 * p2 <= self.ratio * n_fft:
            return [((DENSE_ROW, p1, p2), lab2, d2 - 1, lab1, d1 - 1),
                    ((DENSE_ROW, p2, p1), lab1, d1 - 1, lab2, d2 - 1)]
        key = (FFT_ROW, n_fft, n_fft)
        return [(key, lab2, d2, lab1, n_fft - d1), (key, lab1, d1, lab2, n_fft - d2)]

    def _dense_block(self, s_lab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances within the block (labels sorted in preorder; -1 across trees).

        anc[a, u]: s_lab[a] is an ancestor-or-self of s_lab[u]; the block holds every ancestor
        of its nodes up to each tree's top, so dist(u, w) = |anc(u)| + |anc(w)| - 2 |anc(u) n anc(w)|.
        """
        anc = ((s_lab[:, None] <= s_lab[None, :]) & (s_lab[None, :] < self._end[s_lab][:, None])).astype(np.float64)
        common = anc.T @ anc
        depth = anc.sum(0)
        dist = np.rint(depth[:, None] + depth[None, :] - 2 * common).astype(np.int64)
        dist[common == 0] = -1
        return s_lab, dist

    def _assemble(self, pre_node: np.ndarray, label: np.ndarray, cross: list, leaves: list,
                  splits: np.ndarray, stats: dict) -> SeparatorPlan:
        """Flatten the plan into index arrays (preorder labels): Hankel rows by key, dense blocks by size."""
        n = self.n
        cross.sort(key=lambda r: r[0])
        row_key = tuple(r[0] for r in cross)
        z_len = np.array([k[1] for k in row_key], dtype=np.int64)
        y_len = np.array([k[2] for k in row_key], dtype=np.int64)
        y_start = np.concatenate([[0], np.cumsum(y_len)]).astype(np.int64)
        z_start = np.concatenate([[0], np.cumsum(z_len)]).astype(np.int64)
        w_start = np.concatenate([[0], np.cumsum(np.maximum(y_len, z_len))]).astype(np.int64)
        src_len = np.array([r[1].size for r in cross], dtype=np.int64)
        tgt_len = np.array([r[3].size for r in cross], dtype=np.int64)
        src_off = np.concatenate([[0], np.cumsum(src_len)]).astype(np.int64)
        tgt_off = np.concatenate([[0], np.cumsum(tgt_len)]).astype(np.int64)
        cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if cross else (lambda parts: np.zeros(0, np.int64))
        # steps never mix keys: the first row of each key
        key_change = np.array([i for i in range(1, len(cross)) if cross[i][0] != cross[i - 1][0]], dtype=np.int64)
        # dense blocks, bucketed by padded size (a power of two): node n and index n of f are padding
        buckets: dict = {}
        for s_lab, dist in leaves:
            buckets.setdefault(1 << (s_lab.size - 1).bit_length(), []).append((s_lab, dist))
        blocks = []
        for size, items in sorted(buckets.items()):
            nodes = np.full((len(items), size), n, dtype=np.int64)
            dists = np.full((len(items), size, size), n, dtype=np.int32)  # int32: half the memory
            for b, (s_lab, dist) in enumerate(items):
                m = s_lab.size
                nodes[b, :m] = s_lab
                dists[b, :m, :m] = np.where(dist >= 0, dist, n)
            blocks.append((size, nodes, dists))
        return SeparatorPlan(
            n=n, dense_threshold=self.dense_threshold, pre_node=pre_node, label=label, parent=self._par,
            depth=self._depth, end=self._end, splits=splits, row_key=row_key,
            y_start=y_start, z_start=z_start, w_start=w_start, src_off=src_off, tgt_off=tgt_off,
            src_node=cat([r[1] for r in cross]),
            src_bin=cat([r[2] for r in cross]) + np.repeat(y_start[:-1], src_len),
            tgt_node=cat([r[3] for r in cross]),
            tgt_bin=cat([r[4] for r in cross]) + np.repeat(z_start[:-1], tgt_len),
            key_change=key_change, blocks=tuple(blocks),
            num_fft_rows=sum(k[0] == FFT_ROW for k in row_key), forest=self.forest, **stats)


def _preorder(n: int, child: np.ndarray, parent: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Node ids in depth-first preorder (each tree after the previous one), O(n).

    An explicit stack over children grouped by parent (one argsort). scipy's
    csgraph.depth_first_order is O(degree^2) on high-degree nodes (a star).
    """
    by_parent = np.argsort(parent, kind="stable")
    kids = child[by_parent].tolist()
    starts = np.searchsorted(parent[by_parent], np.arange(n + 1)).tolist()
    out: list = []
    stack = roots[::-1].tolist()
    while stack:
        u = stack.pop()
        out.append(u)
        stack.extend(reversed(kids[starts[u]:starts[u + 1]]))
    return np.asarray(out, dtype=np.int64)


def _subtree_ends(depth: np.ndarray) -> np.ndarray:
    """For a preorder depth sequence: end[p] = first q > p with depth[q] <= depth[p] (or n).

    The subtree of the node at p is positions [p, end[p]). Range minima in a sparse table and
    binary lifting: O(n log n), vectorised.
    """
    n = depth.size
    d = np.concatenate([depth, [-1]])  # sentinel: every subtree ends by n
    tables = [d]
    span = 1
    while span < n + 1:
        prev = tables[-1]
        tables.append(np.minimum(prev, prev[np.minimum(np.arange(n + 1) + span, n)]))
        span *= 2
    q = np.arange(1, n + 1)
    for j in range(len(tables) - 1, -1, -1):
        ok = tables[j][np.minimum(q, n)] > depth  # all of [q, q + 2^j) is deeper: skip it
        q = np.where(ok & (q < n), np.minimum(q + (1 << j), n), q)
    return q
