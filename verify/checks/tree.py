"""Claims of choromanski22 about tree masks (Sec. 3.3, 6; NOTES.md Sec. 2).

choromanski22/lemma-3.5   M x for M_ij = exp(a dist(i, j) + b) by the two-phase recursion, with
                          the erratum: as printed (Eqs. 11, 15, 16, the factor a missing from the
                          exponents) the recursion fails against the dense mask; corrected it is
                          exact. Both are run here, in a plain NumPy loop over the nodes written
                          from the paper (independent of fast/), plus fast.TreeExpMask.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from fast.masks.tree import Forest, TreeExpMask
from reference.masks import tree as ref_tree
from verify.problems import rng_for
from verify.result import Check, CheckResult, Context

LEMMA_35_A = (-0.5, -1.5, 0.3)  # a = 1 would make the printed and corrected forms agree
LEMMA_35_B = 0.2
EXACT_TOL = 1e-12  # relative Frobenius error of the corrected recursion (float64), for a <= 0
PRINTED_MUST_EXCEED = 1e-2  # the printed recursion must be off by more than this to call it wrong


def _trees(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(parent, edge lengths) of small weighted trees and a forest, parents before children."""
    rng = rng_for(seed, 61)
    out = {}
    for n in (40, 150):
        child = np.arange(1, n)
        parent = np.concatenate([[-1], np.floor(rng.random(n - 1) * child)]).astype(np.int64)
        out[f"random tree n={n}"] = (parent, rng.uniform(0.5, 1.5, n))
    out["path n=30"] = (np.arange(-1, 29), rng.uniform(0.5, 1.5, 30))
    out["star n=30"] = (np.concatenate([[-1], np.zeros(29, dtype=np.int64)]), rng.uniform(0.5, 1.5, 30))
    forest = np.concatenate([[-1], np.floor(rng.random(59) * np.arange(1, 60))]).astype(np.int64)
    forest[[20, 41]] = -1
    out["forest n=60 (3 trees)"] = (forest, rng.uniform(0.5, 1.5, 60))
    return out


def two_phase(parent: np.ndarray, weight: np.ndarray, x: np.ndarray, a: float, b: float, printed: bool) -> np.ndarray:
    """Lemma 3.5's recursion node by node (parents have smaller indices than children here).

    printed=False: s_i = e^b x_i + sum_c e^{a w} s_c;  w_i = e^{a w} w_p + (1 - e^{2 a w}) s_i.
    printed=True: the arXiv text's Eqs. 11, 15, 16 with e^{w} and e^{2 w} (no a).
    """
    scale = 1.0 if printed else a
    n = parent.size
    s = math.exp(b) * x.astype(np.float64)
    for i in range(n - 1, 0, -1):  # children before parents
        if parent[i] >= 0:
            s[parent[i]] += math.exp(scale * weight[i]) * s[i]
    out = s.copy()
    for i in range(1, n):  # parents before children
        p = parent[i]
        if p >= 0:
            e = math.exp(scale * weight[i])
            out[i] = e * out[p] + (1 - e * e) * s[i]
    return out


def _lemma_35(ctx: Context) -> CheckResult:
    start = time.perf_counter()
    rng = rng_for(ctx.seed, 62)
    rows, worst_correct, weakest_printed = [], 0.0, math.inf
    for name, (parent, weight) in _trees(ctx.seed).items():
        adj = ref_tree.forest_adjacency(parent, weights=weight)
        forest = Forest.from_parent(parent, weight)
        x = rng.standard_normal((parent.size, 3))
        for a in LEMMA_35_A:
            exact = ref_tree.exp_affine_mask(adj, a, LEMMA_35_B) @ x
            norm = np.linalg.norm(exact)
            errs = {"corrected": np.linalg.norm(two_phase(parent, weight, x, a, LEMMA_35_B, False) - exact) / norm,
                    "printed": np.linalg.norm(two_phase(parent, weight, x, a, LEMMA_35_B, True) - exact) / norm,
                    "fast": np.linalg.norm(TreeExpMask(forest, a, LEMMA_35_B).matmul(torch.as_tensor(x)).numpy() - exact)
                    / norm}
            # a > 0: the top-down subtraction amplifies round-off by up to exp(2 a H) (TreeExpMask)
            tol = EXACT_TOL * math.exp(2 * max(a, 0.0) * forest.weighted_height)
            worst_correct = max(worst_correct, max(errs["corrected"], errs["fast"]) / tol)
            weakest_printed = min(weakest_printed, errs["printed"])
            rows.append({"tree": name, "a": a, "tolerance": tol, **{f"{k}_relative_error": float(v) for k, v in errs.items()}})
    ok = worst_correct <= 1.0 and weakest_printed > PRINTED_MUST_EXCEED
    return CheckResult(
        id="choromanski22/lemma-3.5", title="tree mask exp(a dist + b): corrected two-phase recursion exact, printed one wrong",
        source="choromanski22 Lemma 3.5, Eqs. 11, 14-16", kind="erratum", status="pass" if ok else "fail",
        statistic=worst_correct, threshold=1.0, seconds=time.perf_counter() - start,
        details={"printed": "s_i = e^b x_i + sum_c e^{w(i,c)} s_c; w_i = e^{w(i,p)} w_p + (1 - e^{2 w(i,p)}) s_i",
                 "corrected": "s_i = e^b x_i + sum_c e^{a w(i,c)} s_c; w_i = e^{a w(i,p)} w_p + (1 - e^{2 a w(i,p)}) s_i",
                 "statistic": "max over cases of (relative Frobenius error of the corrected recursion, NumPy loop and "
                              "fast, vs dense) / tolerance; tolerance 1e-12 exp(2 max(a, 0) H), H the weighted height",
                 "weakest_printed_error": weakest_printed, "printed_must_exceed": PRINTED_MUST_EXCEED,
                 "b": LEMMA_35_B, "cases": rows})


def checks() -> list[Check]:
    return [Check("choromanski22/lemma-3.5", "tree exp recursion (with erratum)", "choromanski22 Lemma 3.5", "erratum",
                  _lemma_35)]
