"""Random walks on an adjacency, one readable loop (NumPy; the twin of fast/walks.py).

``Walks`` holds a sampled ensemble as plain arrays ("walks are data", docs/papers.md Sec. 3; the
same fields as fast.walks.Walks); ``sample_walks`` draws one from every node, for reid25 Eq. 10
(GRF, with its variance reduction) and choromanski22 Eq. 5 (RWGNK): O(N n_walkers L) for walks
of L hops. The draws differ from fast/'s (another generator, another order): the two samplers
agree in distribution, and verify/ feeds the SAME walks to both sides where equality is tested
exactly.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from reference.graphs import adjacency

__all__ = ["Walks", "sample_walks", "CHOICES"]

CHOICES = ("uniform", "weighted")


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def _int_array(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


@dataclass
class Walks:
    """n_walkers walks from each of n_nodes nodes, validated on creation.

    Layout: walker w = i * n_walkers + r is the r-th walker of start node i; its walk u_0 = i,
    u_1, ..., u_L (L = length[w] hops) is stored at nodes[offsets[w] : offsets[w] + L + 1], with
    offsets = [0, cumsum(length + 1)]. Fields: n_nodes, n_walkers ints >= 1; p_halt in [0, 1)
    (0.0 for fixed-length walks); length (W,), offsets (W + 1,), nodes (offsets[-1],) int64 arrays,
    W = n_nodes * n_walkers.

    Raises TypeError for non-int counts or non-integer arrays, ValueError for a p_halt outside
    [0, 1) and whatever ``validate`` refuses. Validation is O(W + len(nodes)).

        >>> from reference.walks import Walks
        >>> walks = Walks(2, 1, 0.0, length=[1, 0], offsets=[0, 2, 3], nodes=[0, 1, 1])
        >>> walks.num_walks, walks.walk(0).tolist(), walks.walk(1).tolist()
        (2, [0, 1], [1])
    """

    n_nodes: int
    n_walkers: int
    p_halt: float
    length: np.ndarray
    offsets: np.ndarray
    nodes: np.ndarray

    def __post_init__(self) -> None:
        self.n_nodes = _int("n_nodes", self.n_nodes, 1)
        self.n_walkers = _int("n_walkers", self.n_walkers, 1)
        p = self.p_halt
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) < 1.0:
            raise ValueError(f"p_halt must be a float in [0, 1) (0.0 for fixed-length walks), got {p!r}")
        self.p_halt = float(p)
        self.length = _int_array("length", self.length)
        self.offsets = _int_array("offsets", self.offsets)
        self.nodes = _int_array("nodes", self.nodes)
        self.validate()

    @property
    def num_walks(self) -> int:
        return self.n_nodes * self.n_walkers

    def validate(self, adj: sp.spmatrix | None = None) -> None:
        """ValueError unless shapes, offsets, start nodes and ranges are consistent; with ``adj``,
        also unless every hop follows a stored edge."""
        w = self.num_walks
        if self.length.shape != (w,):
            raise ValueError(f"length must have shape (n_nodes * n_walkers,) = ({w},), got {self.length.shape}")
        if self.offsets.shape != (w + 1,):
            raise ValueError(f"offsets must have shape (W + 1,) = ({w + 1},), got {self.offsets.shape}")
        if (self.length < 0).any():
            raise ValueError(f"length must be >= 0, got {int(self.length.min())}")
        expected = np.concatenate([[0], np.cumsum(self.length + 1)])
        if not np.array_equal(self.offsets, expected):
            k = int(np.flatnonzero(self.offsets != expected)[0])
            raise ValueError(f"offsets must be [0, cumsum(length + 1)]: offsets[{k}] = {int(self.offsets[k])}, "
                             f"expected {int(expected[k])}")
        if self.nodes.shape != (int(expected[-1]),):
            raise ValueError(f"nodes must have shape (offsets[-1],) = ({int(expected[-1])},), got {self.nodes.shape}")
        if self.nodes.size and (self.nodes.min() < 0 or self.nodes.max() >= self.n_nodes):
            raise ValueError(f"nodes must lie in [0, n_nodes={self.n_nodes}), got values in "
                             f"[{int(self.nodes.min())}, {int(self.nodes.max())}]")
        start = self.nodes[self.offsets[:-1]]
        want = np.arange(w) // self.n_walkers
        if not np.array_equal(start, want):
            k = int(np.flatnonzero(start != want)[0])
            raise ValueError(f"walker {k} must start at node {int(want[k])} (node-major: w = i * n_walkers + r), "
                             f"got nodes[offsets[{k}]] = {int(start[k])}")
        if adj is not None:
            a = sp.csr_matrix(adj)
            if a.shape != (self.n_nodes, self.n_nodes):
                raise ValueError(f"adj has shape {a.shape} but the walks have n_nodes={self.n_nodes}")
            walker = np.repeat(np.arange(w), self.length + 1)
            is_last = np.zeros(self.nodes.size, dtype=bool)
            is_last[self.offsets[1:] - 1] = True
            src = np.flatnonzero(~is_last)  # entries u_t with t < L: the hop u_t -> u_{t+1}
            weights = np.asarray(a[self.nodes[src], self.nodes[src + 1]]).ravel() if src.size else np.ones(0)
            bad = np.flatnonzero(weights == 0)
            if bad.size:
                k = src[bad[0]]
                raise ValueError(f"hop {int(self.nodes[k])} -> {int(self.nodes[k + 1])} of walker {int(walker[k])} "
                                 "does not follow an edge of adj")

    def walk(self, w: int) -> np.ndarray:
        """The node sequence u_0..u_L of walker w."""
        return self.nodes[self.offsets[w]:self.offsets[w + 1]]

    def as_dict(self) -> dict:
        """The fields as a dict (``fast.walks.Walks.from_arrays(**d)``; verify's problems hold this)."""
        return {"n_nodes": self.n_nodes, "n_walkers": self.n_walkers, "p_halt": self.p_halt,
                "length": self.length, "offsets": self.offsets, "nodes": self.nodes}


def sample_walks(adj: Any, n_walkers: int, rng: np.random.Generator, *, p_halt: float | None = None,
                 i_max: int | None = None, fixed_length: int | None = None, choice: str = "uniform",
                 antithetic: bool = False, repelling: bool = False) -> Walks:
    """n_walkers walks from every node of ``adj`` (anything reference.graphs.adjacency accepts),
    drawn from ``rng`` (a numpy.random.Generator); returns them as ``Walks``. Semantics
    (docs/papers.md Sec. 3, reid25 Eq. 10 and its variance reduction):

    - exactly one of ``p_halt`` in (0, 1) and ``fixed_length`` >= 0. With p_halt, before each hop a
      walker halts with probability p_halt; ``i_max`` (>= 0 or None) caps the hops, and caps
      fixed_length too when both are given.
    - a walker on a node without neighbours stops (an isolated start node gives length 0).
    - choice "uniform": next node uniform over the stored neighbours; "weighted": with probability
      W_uv / d_u (the RWGNK transition matrix P = D^-1 W).
    - antithetic (p_halt mode, even n_walkers): walkers 2r and 2r + 1 draw one uniform u per step
      and halt when u < p_halt and (u + 1/2) mod 1 < p_halt respectively.
    - repelling (uniform only): the walkers of one start node standing on node v at one step take
      neighbours (o + k) mod deg(v), k their rank (by walker index) among them, o uniform on
      {0, ..., deg(v) - 1}, one o per such group.

    Raises TypeError for a non-Generator rng, non-int counts or non-bool flags; ValueError for
    both or neither of p_halt and fixed_length, values out of range, an unknown choice, antithetic
    without p_halt or with odd n_walkers, repelling with choice="weighted", and as
    reference.graphs.adjacency. O(N n_walkers L) Python steps, L the hops per walk.

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=3)
        >>> walks.length.tolist(), walks.walk(0).tolist()  # one edge: the walk goes back and forth
        ([3, 3, 3, 3], [0, 1, 0, 1])
        >>> halting = sample_walks(edge, 4, np.random.default_rng(0), p_halt=0.5, antithetic=True)
        >>> halting.num_walks, bool((halting.length >= 0).all())
        (8, True)
    """
    n_walkers = _int("n_walkers", n_walkers, 1)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    if (p_halt is None) == (fixed_length is None):
        raise ValueError(f"give exactly one of p_halt (halting walks) and fixed_length, got p_halt={p_halt!r}, "
                         f"fixed_length={fixed_length!r}")
    if p_halt is not None and (isinstance(p_halt, bool) or not isinstance(p_halt, numbers.Real)
                               or not 0.0 < float(p_halt) < 1.0):
        raise ValueError(f"p_halt must be a float in (0, 1), got {p_halt!r}")
    if fixed_length is not None:
        fixed_length = _int("fixed_length", fixed_length, 0)
    if i_max is not None:
        i_max = _int("i_max", i_max, 0)
    if choice not in CHOICES:
        raise ValueError(f"choice must be one of {CHOICES}, got {choice!r}")
    for flag, value in (("antithetic", antithetic), ("repelling", repelling)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
    if antithetic and p_halt is None:
        raise ValueError("antithetic termination needs halting walks (p_halt), got fixed_length")
    if antithetic and n_walkers % 2:
        raise ValueError(f"antithetic termination pairs walkers 2r, 2r+1: n_walkers must be even, got {n_walkers}")
    if repelling and choice != "uniform":
        raise ValueError(f'repelling walks need choice="uniform", got choice={choice!r}')

    a = adjacency(adj, name="adj")
    n = a.shape[0]
    caps = [c for c in (fixed_length, i_max) if c is not None]
    cap = min(caps) if caps else None

    paths: list[list[int]] = []
    for i in range(n):
        walks = [[i] for _ in range(n_walkers)]
        active = list(range(n_walkers))  # walkers of node i still walking, in increasing order
        while active and (cap is None or len(walks[active[0]]) - 1 < cap):  # all active made the same hops
            # 1. halting, before the hop
            if p_halt is not None:
                pair_u: dict[int, float] = {}
                still = []
                for r in active:
                    if r // 2 not in pair_u or not antithetic:
                        pair_u[r // 2] = rng.random()
                    u = pair_u[r // 2]
                    if antithetic and r % 2 == 1:
                        u = (u + 0.5) % 1.0
                    if u >= p_halt:
                        still.append(r)
                active = still
            # 2. a walker with nowhere to go stops
            active = [r for r in active if a.indptr[walks[r][-1] + 1] > a.indptr[walks[r][-1]]]
            # 3. the hop
            if repelling:
                groups: dict[int, list[int]] = {}
                for r in active:
                    groups.setdefault(walks[r][-1], []).append(r)
                for v, members in groups.items():
                    nbrs = a.indices[a.indptr[v]:a.indptr[v + 1]]
                    offset = int(rng.integers(len(nbrs)))
                    for rank, r in enumerate(members):
                        walks[r].append(int(nbrs[(offset + rank) % len(nbrs)]))
            else:
                for r in active:
                    v = walks[r][-1]
                    nbrs = a.indices[a.indptr[v]:a.indptr[v + 1]]
                    if choice == "weighted":
                        cum = np.cumsum(a.data[a.indptr[v]:a.indptr[v + 1]])  # P(j) = W_vj / d_v
                        k = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(nbrs) - 1)
                        walks[r].append(int(nbrs[k]))
                    else:
                        walks[r].append(int(nbrs[rng.integers(len(nbrs))]))
        paths.extend(walks)

    length = np.array([len(p) - 1 for p in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(length + 1)]).astype(np.int64)
    nodes = np.array([v for p in paths for v in p], dtype=np.int64)
    return Walks(n, n_walkers, 0.0 if p_halt is None else float(p_halt), length, offsets, nodes)
