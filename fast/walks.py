"""Random walks on a Graph, vectorised over all walkers ("walks are data"; docs/papers.md Sec. 3).

Walks (the shared layout, the same field names as reference/walks.py): walker w = i * n_walkers + r
is the r-th walker of start node i (node-major). A walk is the node sequence u_0 = i, u_1, ...,
u_L, L = length[w] hops, stored ragged:

    length (W,) int64, W = n_nodes * n_walkers
    offsets (W + 1,) int64      offsets[w] = sum_{w' < w} (length[w'] + 1), offsets[0] = 0
    nodes (offsets[-1],) int64  nodes[offsets[w] + t] = u_t, t = 0..length[w]
    p_halt                      the halting probability used (0.0 for fixed-length walks)

``sample_walks`` draws them (its docstring: the rules, which the reference sampler follows with
its own draws) from an explicit torch.Generator; global RNG state is never read or changed.
"""
from __future__ import annotations

import numbers
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fast.graphs import Graph, as_graph
from fast.validation import check_allocation, check_positive_int

__all__ = ["Walks", "sample_walks", "CHOICES", "MAX_WALK_STEPS"]

#: The neighbour-choice rules of sample_walks.
CHOICES = ("uniform", "weighted")

#: The most vectorised steps sample_walks expects to take (one per hop of its longest walk; each is a
#: few tensor operations, ~0.1 ms on a CPU): p_halt = 1e-12 without i_max would walk ~1e12 hops.
MAX_WALK_STEPS = 100_000


def _index_field(name: str, value: Any, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        return value.to(device=device if device is not None else value.device, dtype=torch.int64)
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64, copy=False), device=device)


@dataclass(frozen=True)
class Walks:
    """Ragged walks of n_walkers walkers per node (module docstring: layout). Tensors int64 on one device.

    Build with ``sample_walks`` or ``Walks.from_arrays`` (validated: ValueError / TypeError naming
    the field). O(W + total walk length) memory. Node 0 walks to 1, node 1 stays:

        >>> from fast.walks import Walks
        >>> w = Walks.from_arrays(n_nodes=2, n_walkers=1, p_halt=0.5, length=[1, 0], offsets=[0, 2, 3],
        ...                       nodes=[0, 1, 1])
        >>> w.num_walks, [t.tolist() for t in w.hops()]
        (2, [[0], [1]])
    """

    n_nodes: int
    n_walkers: int
    p_halt: float
    length: torch.Tensor
    offsets: torch.Tensor
    nodes: torch.Tensor

    @classmethod
    def from_arrays(cls, *, n_nodes: int, n_walkers: int, p_halt: float, length: Any, offsets: Any, nodes: Any,
                    device: Any = None) -> "Walks":
        """Validated Walks from NumPy arrays or tensors (e.g. ``reference.walks.Walks`` fields or
        ``to_numpy()``'s dict): shapes, offsets consistent with lengths, start nodes, indices in
        range. ``device``: where the tensors go (default: where ``nodes`` is, else CPU)."""
        n_nodes = check_positive_int("n_nodes", n_nodes, ">= 1", type_error=True)
        n_walkers = check_positive_int("n_walkers", n_walkers, ">= 1", type_error=True)
        if isinstance(p_halt, bool) or not isinstance(p_halt, numbers.Real) or not 0.0 <= float(p_halt) < 1.0:
            raise ValueError(f"p_halt must be a float in [0, 1) (0.0 for fixed-length walks), got {p_halt!r}")
        if device is None and isinstance(nodes, torch.Tensor):
            device = nodes.device
        walks = cls(n_nodes, n_walkers, float(p_halt), _index_field("length", length, device),
                    _index_field("offsets", offsets, device), _index_field("nodes", nodes, device))
        walks.validate()
        return walks

    def validate(self, graph: Graph | None = None) -> None:
        """ValueError unless the fields are consistent (shapes, offsets, starts, ranges); with
        ``graph``, also unless every hop u_t -> u_{t+1} follows a stored edge."""
        w = self.num_walks
        if self.length.dim() != 1 or self.length.numel() != w:
            raise ValueError(f"length must have shape (n_nodes * n_walkers,) = ({w},), got {tuple(self.length.shape)}")
        if self.offsets.dim() != 1 or self.offsets.numel() != w + 1:
            raise ValueError(f"offsets must have shape (W + 1,) = ({w + 1},), got {tuple(self.offsets.shape)}")
        if bool((self.length < 0).any()):
            raise ValueError(f"length must be >= 0, got {int(self.length.min())}")
        expected = torch.zeros(w + 1, dtype=torch.int64, device=self.length.device)
        torch.cumsum(self.length + 1, 0, out=expected[1:])
        if not torch.equal(self.offsets.to(expected.device), expected):
            k = int(torch.nonzero(self.offsets.to(expected.device) != expected)[0, 0])
            raise ValueError(f"offsets must be [0, cumsum(length + 1)]: offsets[{k}] = {int(self.offsets[k])}, "
                             f"expected {int(expected[k])}")
        if self.nodes.dim() != 1 or self.nodes.numel() != int(expected[-1]):
            raise ValueError(f"nodes must have shape (offsets[-1],) = ({int(expected[-1])},), got {tuple(self.nodes.shape)}")
        if self.nodes.numel():
            lo, hi = int(self.nodes.min()), int(self.nodes.max())
            if lo < 0 or hi >= self.n_nodes:
                raise ValueError(f"nodes must lie in [0, n_nodes={self.n_nodes}), got values in [{lo}, {hi}]")
        start = self.nodes[self.offsets[:-1].to(self.nodes.device)]
        want = torch.arange(w, device=start.device) // self.n_walkers
        if not torch.equal(start, want):
            k = int(torch.nonzero(start != want)[0, 0])
            raise ValueError(f"walker {k} must start at node {int(want[k])} (node-major: w = i * n_walkers + r), "
                             f"got nodes[offsets[{k}]] = {int(start[k])}")
        if graph is not None:
            g = as_graph(graph, device=self.nodes.device)
            if g.n != self.n_nodes:
                raise ValueError(f"graph has {g.n} nodes but the walks have n_nodes={self.n_nodes}")
            src, dst = self.hops()
            if src.numel():
                ok = g.edge_weight(src, dst) > 0
                if not bool(ok.all()):
                    k = int(torch.nonzero(~ok)[0, 0])
                    raise ValueError(f"hop {int(src[k])} -> {int(dst[k])} does not follow an edge of graph")

    @property
    def num_walks(self) -> int:
        """W = n_nodes * n_walkers."""
        return self.n_nodes * self.n_walkers

    @property
    def device(self) -> torch.device:
        return self.nodes.device

    @property
    def start(self) -> torch.Tensor:
        """Start node of each walker (W,) = w // n_walkers."""
        return torch.arange(self.num_walks, device=self.device) // self.n_walkers

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(walker (T,), t (T,)) of each entry of ``nodes``: nodes[k] = u_t of walk ``walker``."""
        walker = torch.repeat_interleave(torch.arange(self.num_walks, device=self.device), self.length + 1,
                                         output_size=self.nodes.numel())
        t = torch.arange(self.nodes.numel(), device=self.device) - self.offsets[:-1][walker]
        return walker, t

    def hops(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(u_t, u_{t+1}) of every hop of every walk, two (sum(length),) tensors."""
        is_last = torch.zeros(self.nodes.numel(), dtype=torch.bool, device=self.device)
        is_last[self.offsets[1:] - 1] = True
        src_idx = torch.nonzero(~is_last).flatten()
        return self.nodes[src_idx], self.nodes[src_idx + 1]

    def to(self, device: Any) -> "Walks":
        return Walks(self.n_nodes, self.n_walkers, self.p_halt, self.length.to(device), self.offsets.to(device),
                     self.nodes.to(device))

    def to_numpy(self) -> dict:
        """The fields as a dict of NumPy arrays / Python scalars (``reference.walks.Walks(**d)``)."""
        return {"n_nodes": self.n_nodes, "n_walkers": self.n_walkers, "p_halt": self.p_halt,
                "length": self.length.cpu().numpy(), "offsets": self.offsets.cpu().numpy(),
                "nodes": self.nodes.cpu().numpy()}


def _check_args(n_walkers, p_halt, i_max, fixed_length, choice, antithetic, repelling):
    n_walkers = check_positive_int("n_walkers", n_walkers, ">= 1", type_error=True)
    if (p_halt is None) == (fixed_length is None):
        raise ValueError(f"give exactly one of p_halt (halting walks) and fixed_length, got p_halt={p_halt!r}, "
                         f"fixed_length={fixed_length!r}")
    if p_halt is not None:
        if isinstance(p_halt, bool) or not isinstance(p_halt, numbers.Real) or not 0.0 < float(p_halt) < 1.0:
            raise ValueError(f"p_halt must be a float in (0, 1), got {p_halt!r}")
        p_halt = float(p_halt)
    if fixed_length is not None:
        fixed_length = check_positive_int("fixed_length", fixed_length, ">= 0", minimum=0, type_error=True)
    if i_max is not None:
        i_max = check_positive_int("i_max", i_max, ">= 0", minimum=0, type_error=True)
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
    return n_walkers, p_halt, i_max, fixed_length


def _plan(n: int, n_walkers: int, p_halt: float | None, i_max: int | None, fixed_length: int | None,
          device) -> None:
    """Refuse, before walking, a call whose longest walk would take more than MAX_WALK_STEPS steps
    (ValueError naming p_halt, fixed_length and i_max) or whose walks would not fit in memory
    (MemoryError naming n_walkers, fast.validation.check_allocation)."""
    walkers = n * n_walkers
    if p_halt is not None:
        rate = -math.log1p(-p_halt)  # P(L >= k) = (1 - p)^k = e^(-rate k)
        # the longest of W geometric walks: about (ln W + 0.58) / rate hops (Euler's constant)
        longest = (math.log(walkers) + 0.58) / rate
        steps = longest if i_max is None else min(longest, i_max)
        mean = (1.0 - p_halt) / p_halt if i_max is None else \
            (1.0 - p_halt) * -math.expm1(i_max * math.log1p(-p_halt)) / p_halt  # E[min(L, i_max)]
        if steps > MAX_WALK_STEPS:
            cap = "" if i_max is None else f" with i_max = {i_max}"
            raise ValueError(f"p_halt = {p_halt!r}{cap} makes walks of {mean:.3g} hops on average; the longest of the "
                             f"{walkers} walks would take about {steps:.3g} steps, more than MAX_WALK_STEPS = "
                             f"{MAX_WALK_STEPS}. Pass i_max <= {MAX_WALK_STEPS} (every walk stops after that many "
                             f"hops) or p_halt >= {(math.log(walkers) + 0.58) / MAX_WALK_STEPS:.3g}")
    else:
        steps = mean = fixed_length if i_max is None else min(fixed_length, i_max)
        if steps > MAX_WALK_STEPS:
            raise ValueError(f"fixed_length = {fixed_length}" + ("" if i_max is None else f" with i_max = {i_max}")
                             + f" takes {steps} steps, more than MAX_WALK_STEPS = {MAX_WALK_STEPS}; pass a "
                             f"smaller fixed_length or i_max")
    # per walker: ~8 words of state and length/offsets, and per hop its node and the step's (walker, node)
    words = 8 + 3 * math.ceil(mean)
    check_allocation(f"n_walkers = {n_walkers} on {n} nodes", (walkers, words), torch.int64, device,
                     what=f"the walks (W = {walkers} walkers by 8 + 3 x {math.ceil(mean)} expected hops)")


def _weighted_keys(g: Graph) -> torch.Tensor:
    """row + (cumulative weight within the row) / (row's weight), (E,) float64: non-decreasing,
    row i's entries in (i, i + 1] with the last exactly i + 1; searchsorted(keys, u + U, right=True)
    picks entry e of row u with probability W_ue / d_u (up to float64 round-off of the sums).

    The global cumulative sum runs over the per-row fractions w / d_row (each row adds ~1, so the
    running total at row i is ~ i + its fraction) and the row's start is subtracted: the error of a
    fraction is a few ulp(i) per entry of its row, whatever the weights elsewhere (a cumulative sum
    of raw weights would lose a row of weight 1 next to an edge of weight 1e17 entirely)."""
    frac_w = g.weight / g.weighted_degree[g.row]  # in (0, 1], rows sum to ~1
    cum = torch.cumsum(frac_w, 0)
    before = torch.cat([cum.new_zeros(1), cum])[g.crow[:-1]]  # the running total at each row's start
    frac = (cum - before[g.row]).clamp_(max=1.0)  # monotone within a row (a constant subtracted)
    last = g.crow[1:][g.degree > 0] - 1
    frac[last] = 1.0
    return g.row.to(torch.float64) + frac


def sample_walks(graph: Any, n_walkers: int, *, p_halt: float | None = None, i_max: int | None = None,
                 fixed_length: int | None = None, choice: str = "uniform", antithetic: bool = False,
                 repelling: bool = False, generator: torch.Generator | None = None) -> Walks:
    """n_walkers walks from every node of ``graph`` (a Graph or anything ``as_graph`` accepts):
    Walks with W = n * n_walkers walks, node-major, on the graph's device (choromanski22 Sec. 4.2;
    reid25 Eq. 10).

    - exactly one of ``p_halt`` in (0, 1) and ``fixed_length`` >= 0. With p_halt the walker halts
      with probability p_halt before each hop (uncapped, P(L = k) = (1 - p)^k p); ``i_max`` (int
      >= 0 or None) caps the hops. With fixed_length every walk makes that many hops (``i_max``
      caps it too). A walker on a node without neighbours stops.
    - the sampler takes one vectorised step per hop of its longest walk, about
      (ln W + 0.58) / -ln(1 - p_halt) with p_halt: a call that would take more than MAX_WALK_STEPS
      is refused before walking (a small p_halt needs ``i_max``), and one whose walks would not fit
      in memory (about 8 (8 + 3 E[L]) W bytes) too.
    - choice "uniform": the next node is uniform over the stored neighbours, what the GRF loads
      W_uv deg(u) / (1 - p_halt) assume (reid25 Eq. 10); "weighted": proportional to the edge
      weight (P = D^-1 W, RWGNK).
    - antithetic (p_halt, even n_walkers): walkers 2r and 2r + 1 of a node use halting uniforms u
      and (u + 1/2) mod 1 (each marginal unchanged). repelling (uniform choice): walkers of one
      start node meeting on a node take distinct neighbours (o + rank) mod deg, one uniform offset
      o per group (each marginal unchanged).
    - randomness only from ``generator`` (a torch.Generator on the graph's device; None: a fresh
      OS-seeded one, nondeterministic).

    O(W (E[L] + 1)) work in max L vectorised steps (plus O(E) for "weighted" and a sort of the
    active walkers per step for repelling). ValueError / TypeError naming the argument for a bad
    count, probability, length, choice, flag or generator (on another device), ValueError naming
    p_halt, fixed_length and i_max past MAX_WALK_STEPS, MemoryError naming n_walkers for walks
    that would not fit.

        >>> import torch
        >>> from fast.graphs import as_graph
        >>> from fast.walks import sample_walks
        >>> g = as_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]))
        >>> walks = sample_walks(g, 2, fixed_length=3, generator=torch.Generator().manual_seed(0))
        >>> walks.num_walks, walks.length.tolist()
        (6, [3, 3, 3, 3, 3, 3])
        >>> walks.validate(g) is None  # every hop follows an edge
        True
    """
    n_walkers, p_halt, i_max, fixed_length = _check_args(n_walkers, p_halt, i_max, fixed_length, choice,
                                                         antithetic, repelling)
    g = as_graph(graph)
    dev = g.device
    _plan(g.n, n_walkers, p_halt, i_max, fixed_length, dev)
    if generator is None:
        generator = torch.Generator(device=dev)
        generator.seed()  # fresh OS entropy: nondeterministic, and the global generator is untouched
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    elif torch.device(generator.device).type != dev.type:
        raise ValueError(f"generator must be on the graph's device ({dev}), got a generator on {generator.device}")

    n = g.n
    w_total = n * n_walkers
    cap = fixed_length if fixed_length is not None else None
    if i_max is not None:
        cap = i_max if cap is None else min(cap, i_max)
    keys = _weighted_keys(g) if choice == "weighted" else None

    def rand(k: int) -> torch.Tensor:
        return torch.rand(k, generator=generator, dtype=torch.float64, device=dev)

    start_of = torch.arange(n, device=dev).unsqueeze(1).expand(n, n_walkers).reshape(-1)  # w // n_walkers
    walker = torch.arange(w_total, device=dev)  # the active walkers, kept in increasing order
    cur = start_of                              # where each active walker stands
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (walkers, node reached) of hop t = 1, 2, ...
    while walker.numel() and (cap is None or len(steps) < cap):
        deg = g.degree[cur]
        keep = deg > 0  # a node without neighbours ends the walk
        if p_halt is not None:
            u = rand(walker.numel())
            if antithetic:
                # an odd walker whose even partner is also walking uses (u_partner + 1/2) mod 1
                # (roll wraps around, but walker[-1] >= walker[0], so position 0 is never paired)
                paired = ((walker & 1) == 1) & (torch.roll(walker, 1) == walker - 1)
                u = torch.where(paired, torch.remainder(torch.roll(u, 1) + 0.5, 1.0), u)
            keep &= u >= p_halt
        sel = torch.nonzero(keep).squeeze(1)
        if not sel.numel():
            break
        walker, cur, deg = walker[sel], cur[sel], deg[sel]
        if choice == "weighted":
            target = cur.to(torch.float64) + rand(walker.numel())
            idx = torch.searchsorted(keys, target, right=True)
            idx = torch.minimum(torch.maximum(idx, g.crow[cur]), g.crow[cur + 1] - 1)
        elif repelling:
            # groups = (start node, current node); a stable sort keeps walker order inside a group
            group_key, order = torch.sort(start_of[walker] * n + cur, stable=True)
            pos = torch.arange(order.numel(), device=dev)
            is_first = torch.ones_like(group_key, dtype=torch.bool)
            is_first[1:] = group_key[1:] != group_key[:-1]
            group_id = torch.cumsum(is_first, 0) - 1
            rank_sorted = pos - torch.cummax(torch.where(is_first, pos, torch.zeros_like(pos)), 0).values
            offset_sorted = rand(int(is_first.sum()))[group_id]  # one uniform per group
            rank, offset_u = torch.empty_like(pos), torch.empty_like(offset_sorted)
            rank[order], offset_u[order] = rank_sorted, offset_sorted
            offset = torch.minimum((offset_u * deg).long(), deg - 1)
            idx = g.crow[cur] + torch.remainder(offset + rank, deg)
        else:
            idx = g.crow[cur] + torch.minimum((rand(walker.numel()) * deg).long(), deg - 1)
        cur = g.col[idx]
        steps.append((walker, cur))

    # walker sets shrink along the steps, so a walker's length is the last step it appears in
    length = torch.zeros(w_total, dtype=torch.int64, device=dev)
    for hop, (who, _) in enumerate(steps, start=1):
        length[who] = hop
    offsets = torch.zeros(w_total + 1, dtype=torch.int64, device=dev)
    torch.cumsum(length + 1, 0, out=offsets[1:])
    nodes = torch.empty(int(offsets[-1]), dtype=torch.int64, device=dev)
    nodes[offsets[:-1]] = start_of
    for hop, (who, where) in enumerate(steps, start=1):
        nodes[offsets[who] + hop] = where
    return Walks(n, n_walkers, 0.0 if p_halt is None else p_halt, length, offsets, nodes)
