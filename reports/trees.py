"""Tree masks: time of one mask product vs N per tree family, and the separator recursion's depth.

The three tree operators of fast.masks.tree claim different classes (choromanski22 Sec. 3.3, 6):

    tree-exp   TreeExpMask, f(z) = exp(a z + b)      O(N)          (Lemma 3.5)
    tree-dc    TreeDCMask, any f, separator split    O(N log^2 N)  (Lemma 6.1)
    tree-diam  TreeDiamMask, any f, depth arrays     O(N diam)     (Lemma 6.2)

and the registry's sweeps time each on one (mixed) forest only. Here every operator is timed on
each tree family alone (path, star, caterpillar, complete binary, random recursive), N on a
power-of-two grid: one product ``op.matmul(x)``, x (N, 16) float32, torch threads pinned to 1,
inference mode, setup (Forest, operator plan) untimed. Each point is the minimum over up to
``rounds`` rounds after one warm-up call; a round is verify.timing.measure (calls repeated for at
least 20 ms, mean per call), and rounds stop early once a point has spent its time budget (slow
points: at least one round). tree-diam is O(N^2) on paths and caterpillars (diam ~ N), so it is
timed there only up to DIAM_CHAIN_MAX. Exponents are fitted per (operator, family) by
verify.timing.fit_exponent. TreeDCMask's recursion_depth and num_subproblems are recorded per
(family, N), against the bound log_{1.5} N.

An exception while building a family, an operator or a product is recorded on that (operator,
family) curve (``error``, ``error_n``; larger N are not tried) and never stops the stage.
results.json keeps every number (``tree_masks``), so a page re-rendered from it recomputes nothing.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from verify.timing import MIN_FIT_S, Fit, fit_exponent

FAMILIES = ("path", "star", "caterpillar", "complete binary", "random recursive")
OPERATORS = ("tree-exp", "tree-dc", "tree-diam")
#: The class each operator claims (the registry's complexity, typeset for the page and figures).
CLAIMED = {"tree-exp": "N", "tree-dc": "N log² N", "tree-diam": "N diam"}
#: N grids (powers of two); measured on 2 cores, the stage takes ~18 s quick and ~2 min full, of
#: which ~12 s (full) is TreeDCMask's untimed set-up on stars: scipy's depth_first_order is
#: quadratic in a node's degree (10 s for the 2^17-leaf star).
SIZES = {True: tuple(2**p for p in range(8, 15)), False: tuple(2**p for p in range(8, 18))}
#: tree-diam on paths and caterpillars (diam N - 1 and ~N/2: O(N^2)) is timed only up to here
#: (one product at N = 2^12 takes ~5 s on a path, at 2^13 it would take ~20 s).
DIAM_CHAIN_MAX = {True: 2**11, False: 2**12}
CHAIN_FAMILIES = ("path", "caterpillar")
#: Timed rounds of a point stop once they have used this much time (at least one round).
POINT_BUDGET_S = {True: 0.5, False: 1.5}
COLUMNS = 16
EXP_A, EXP_B = -0.3, 0.0  # tree-exp: f(z) = exp(a z + b), unit edge lengths
F_TEXT = "f(l) = (1 + l)^-1.5"  # tree-dc, tree-diam (verify.mechanisms.tree.tree_f)
SEED = 0
#: Fits use the points that took >= MIN_FIT_S when at least this many did, else every point.
FIT_MIN_POINTS = 4


def depth_bound(n: int) -> float:
    """log_{1.5} N: the balanced split's bound on the separator recursion depth."""
    return math.log(n) / math.log(1.5)


# ------------------------------------------------------------------------------- families


def family_parent(family: str, n: int, seed: int = SEED) -> np.ndarray:
    """Parent array (n,) of one unweighted tree of ``family`` (verify.mechanisms.tree.tree_parent)."""
    from verify.mechanisms.tree import tree_parent
    from verify.problems import rng_for

    if family not in FAMILIES:
        raise ValueError(f"unknown tree family {family!r}; known: {', '.join(FAMILIES)}")
    return tree_parent(family, n, rng_for(seed, 66, n))


def _build_exp(forest, n: int):
    from fast.masks.tree import TreeExpMask

    return TreeExpMask(forest, EXP_A, EXP_B)


def _f(n: int):
    import torch

    from verify.mechanisms.tree import tree_f

    return torch.as_tensor(tree_f(n), dtype=torch.float32)


def _build_dc(forest, n: int):
    from fast.masks.tree import TreeDCMask

    return TreeDCMask(forest, _f(n))


def _build_diam(forest, n: int):
    from fast.masks.tree import TreeDiamMask

    return TreeDiamMask(forest, _f(n))


#: operator id -> build(forest, n) -> object with matmul(x). Tests replace entries.
BUILDERS = {"tree-exp": _build_exp, "tree-dc": _build_dc, "tree-diam": _build_diam}


# ------------------------------------------------------------------------------- data


@dataclass
class TreeCurve:
    """One (operator, family): seconds per product at each timed N, and its exponent fit.

    rounds: timed rounds per N; setup_seconds: operator construction (untimed in ``seconds``).
    fitted: which points the fit used; fit_rule says why. diam_fit (tree-diam only): the fit of
    t / diam vs N, slope ~1 if the time is O(N diam). skipped: N deliberately not timed
    (skip_reason). error: the first exception ("N = n: Type: message"), error_n its N; larger N
    were not tried.
    """

    operator: str
    family: str
    sizes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    setup_seconds: list[float] = field(default_factory=list)
    fitted: list[bool] = field(default_factory=list)
    fit: Fit | None = None
    fit_rule: str = ""
    diam_fit: Fit | None = None
    skipped: list[int] = field(default_factory=list)
    skip_reason: str = ""
    error: str | None = None
    error_n: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fit"] = None if self.fit is None else self.fit.to_dict()
        d["diam_fit"] = None if self.diam_fit is None else self.diam_fit.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TreeCurve":
        fit = lambda x: None if x is None else Fit(**x)  # noqa: E731
        return cls(**{**d, "fit": fit(d.get("fit")), "diam_fit": fit(d.get("diam_fit"))})


@dataclass
class TreeDepths:
    """TreeDCMask's plan per N for one family: separator recursion depth, subproblems (splits plus
    dense blocks) and dense blocks. Sizes where the operator failed are absent."""

    family: str
    sizes: list[int] = field(default_factory=list)
    recursion_depth: list[int] = field(default_factory=list)
    num_subproblems: list[int] = field(default_factory=list)
    num_dense_blocks: list[int] = field(default_factory=list)

    @property
    def bound(self) -> list[float]:
        return [depth_bound(n) for n in self.sizes]

    def within_bound(self) -> bool:
        return all(d <= b for d, b in zip(self.recursion_depth, self.bound))

    def to_dict(self) -> dict:
        return {**asdict(self), "bound_log_1.5_n": self.bound}

    @classmethod
    def from_dict(cls, d: dict) -> "TreeDepths":
        return cls(d["family"], list(d["sizes"]), list(d["recursion_depth"]), list(d["num_subproblems"]),
                   list(d["num_dense_blocks"]))


@dataclass
class TreeMasks:
    """The stage's result. diameters[family]: forest_diameter at each of ``sizes`` (None where the
    family could not be built). seconds: the stage's wall time."""

    quick: bool
    sizes: list[int]
    rounds: int
    point_budget_s: float
    diam_chain_max: int
    curves: list[TreeCurve] = field(default_factory=list)
    depths: list[TreeDepths] = field(default_factory=list)
    diameters: dict[str, list[int | None]] = field(default_factory=dict)
    columns: int = COLUMNS
    threads: int = 1
    device: str = "cpu"
    exp_a: float = EXP_A
    exp_b: float = EXP_B
    f: str = F_TEXT
    dense_threshold: int | None = None
    seconds: float = 0.0

    def curve(self, operator: str, family: str) -> TreeCurve | None:
        return next((c for c in self.curves if c.operator == operator and c.family == family), None)

    @property
    def operators(self) -> list[str]:
        return list(dict.fromkeys(c.operator for c in self.curves))

    @property
    def families(self) -> list[str]:
        return list(dict.fromkeys(c.family for c in self.curves))

    @property
    def errors(self) -> list[TreeCurve]:
        return [c for c in self.curves if c.error is not None]

    def diameter(self, family: str, n: int) -> int | None:
        diams = self.diameters.get(family, [])
        return diams[self.sizes.index(n)] if n in self.sizes and self.sizes.index(n) < len(diams) else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["curves"] = [c.to_dict() for c in self.curves]
        d["depths"] = [x.to_dict() for x in self.depths]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TreeMasks":
        rest = {k: v for k, v in d.items() if k not in ("curves", "depths")}
        return cls(**rest, curves=[TreeCurve.from_dict(c) for c in d.get("curves", [])],
                   depths=[TreeDepths.from_dict(x) for x in d.get("depths", [])])


# ------------------------------------------------------------------------------- fits


def fit_curve(c: TreeCurve, diameters: list[int | None] | None = None) -> TreeCurve:
    """Fill ``fitted``, ``fit``, ``fit_rule`` (and ``diam_fit`` given the diameters at c.sizes).

    Points under MIN_FIT_S are overhead-dominated: the fit leaves them out when at least
    FIT_MIN_POINTS points remain, else it uses every point; no fit below 3 points.
    """
    n, s = np.asarray(c.sizes, float), np.asarray(c.seconds, float)
    c.fit, c.diam_fit = None, None
    if n.size < 3:
        c.fitted = [False] * n.size
        c.fit_rule = f"no fit: {n.size} timed N (3 needed)"
        return c
    slow = s >= MIN_FIT_S
    if slow.sum() >= FIT_MIN_POINTS:
        keep, floor = slow, MIN_FIT_S
        c.fit_rule = f"{int(slow.sum())} of {n.size} N (t ≥ {MIN_FIT_S * 1e3:g} ms)"
    else:
        keep, floor = np.ones(n.size, bool), 0.0
        c.fit_rule = f"all {n.size} N (fewer than {FIT_MIN_POINTS} took ≥ {MIN_FIT_S * 1e3:g} ms)"
    c.fitted = [bool(k) for k in keep]
    try:
        c.fit = fit_exponent(n, s, min_seconds=floor)
        if diameters is not None and len(diameters) == n.size and all(d for d in diameters):
            c.diam_fit = fit_exponent(n[keep], (s / np.asarray(diameters, float))[keep])
    except ValueError as exc:
        c.fit_rule = f"no fit: {exc}"
    return c


# ------------------------------------------------------------------------------- timing


def _time_product(op, x, rounds: int, budget_s: float, device: str) -> tuple[float, int]:
    """(min seconds per op.matmul(x) over the rounds, rounds done) after one warm-up call."""
    import torch

    from verify.timing import measure

    run = lambda: op.matmul(x)  # noqa: E731
    with torch.inference_mode():
        run()
        best, done, spent = math.inf, 0, 0.0
        while done < rounds and (done == 0 or spent < budget_s):
            t0 = time.perf_counter()
            best = min(best, measure(run, device))
            spent += time.perf_counter() - t0
            done += 1
    return best, done


def tree_masks(quick: bool = True, rounds: int | None = None, *, sizes=None, families=None, operators=None,
               device: str = "cpu", seed: int = SEED, progress: bool = False) -> TreeMasks:
    """Run the stage: every (operator, family, N), threads pinned to 1; never raises for one
    failing family or operator (recorded on its curve)."""
    import torch
    from tqdm.auto import tqdm

    from fast.masks.tree import Forest, forest_diameter
    from verify.timing import pinned_threads

    start = time.perf_counter()
    sizes = [int(n) for n in (sizes or SIZES[quick])]
    families = list(families or FAMILIES)
    operators = list(operators or OPERATORS)
    rounds = rounds or (3 if quick else 5)
    chain_max = DIAM_CHAIN_MAX[quick]
    res = TreeMasks(quick, sizes, rounds, POINT_BUDGET_S[quick], chain_max, device=str(device))
    curves = {(op, fam): TreeCurve(op, fam) for op in operators for fam in families}
    res.curves = list(curves.values())
    for fam in CHAIN_FAMILIES:
        if ("tree-diam", fam) in curves:
            curves["tree-diam", fam].skip_reason = (f"O(N²) on a {fam} (diam ~ N): timed only up to N = {chain_max:,}")
    with pinned_threads(1), tqdm(total=len(curves) * len(sizes), desc="tree masks", unit="pt",
                                 disable=not progress) as bar:
        for fam in families:
            depths = TreeDepths(fam)
            diams: list[int | None] = []
            for n in sizes:
                bar.set_postfix_str(f"{fam} N={n}")
                try:
                    forest = Forest.from_parent(family_parent(fam, n, seed))
                    diams.append(int(forest_diameter(forest)))
                except Exception as exc:  # noqa: BLE001 - recorded on every curve of the family
                    diams.append(None)
                    for op in operators:
                        _fail(curves[op, fam], n, f"building the {fam}: {type(exc).__name__}: {exc}")
                    bar.update(len(operators))
                    continue
                x = torch.randn(n, COLUMNS, generator=torch.Generator().manual_seed(seed * 1_000_003 + n)).to(device)
                for op_id in operators:
                    c = curves[op_id, fam]
                    bar.update(1)
                    if c.error is not None:
                        continue
                    if op_id == "tree-diam" and fam in CHAIN_FAMILIES and n > chain_max:
                        c.skipped.append(n)
                        continue
                    try:
                        t0 = time.perf_counter()
                        op = BUILDERS[op_id](forest, n)
                        setup = time.perf_counter() - t0
                        secs, done = _time_product(op, x, rounds, res.point_budget_s, str(device))
                        if not math.isfinite(secs) or secs <= 0:
                            raise ValueError(f"timing gave {secs} s")
                    except Exception as exc:  # noqa: BLE001 - one failing operator must not stop the stage
                        _fail(c, n, f"{type(exc).__name__}: {exc}")
                        continue
                    c.sizes.append(n), c.seconds.append(secs), c.rounds.append(done), c.setup_seconds.append(setup)
                    if op_id == "tree-dc":
                        plan = _plan_numbers(op)
                        if plan is not None:
                            depths.sizes.append(n)
                            depths.recursion_depth.append(plan[0])
                            depths.num_subproblems.append(plan[1])
                            depths.num_dense_blocks.append(plan[2])
                            res.dense_threshold = plan[3]
                    del op
            res.diameters[fam] = diams
            if "tree-dc" in operators:
                res.depths.append(depths)
    for c in res.curves:
        diam = [res.diameter(c.family, n) for n in c.sizes] if c.operator == "tree-diam" else None
        fit_curve(c, diam)
    res.seconds = time.perf_counter() - start
    return res


def _plan_numbers(op) -> tuple[int, int, int, int | None] | None:
    """(recursion_depth, num_subproblems, num_dense_blocks, dense_threshold) of a TreeDCMask, or
    None for an operator without them (a stand-in)."""
    try:
        return (int(op.recursion_depth), int(op.num_subproblems), int(op.num_dense_blocks),
                getattr(op, "dense_threshold", None))
    except (AttributeError, TypeError, ValueError):
        return None


def _fail(c: TreeCurve, n: int, message: str) -> None:
    if c.error is None:
        c.error, c.error_n = f"N = {n:,}: {message}", n
