"""The mechanism registry: one record per mechanism; tests, verify, asv and reports iterate it.

This module holds the record types and the store, and imports no mechanism family. The families
register themselves when ``verify.mechanisms`` (the loader) imports them; code that wants the
full list calls ``verify.mechanisms.mechanisms()`` / ``verify.mechanisms.get(id)``. Ids are stable
(docs/design.md).

A record declares, besides its problem generator and implementations:

- variants: named input families (tree shapes, graph families, options). Every variant goes
  through equivalence; sweeps and the report's per-variant views time every variant whose
  ``sweep`` is True; complexity/<id> fits the default variant (the first).
- scale / scale_train: whether scale/<id> (forward at N = 2^20) and scale/<id>-train (forward +
  backward at N = 2^20) exist for it.
- protocols: a variant's ``protocol`` says how equivalence runs it: "plain" (build, call once),
  "update" (call, change the mask's parameters in place as an optimiser step does, call the same
  operator again: a cached derived quantity must follow), "learnable" (the parameters are leaves
  that require grad: forward through the learnable path, and the gradient against finite
  differences of the float64 reference), "backward" (q, k, v are leaves that require grad: the
  gradient of the attention against finite differences of the reference, and a linear record's
  operator, matmul and rmatmul, against the dense mask and its transpose). "update" and
  "learnable" need ``mask_params``.
- cost_factor: a per-problem cofactor of the class (the diameter for "N diam", (N + |E|) / N for
  "N + E", a sparse graph's nodes and stored edges): time / cost_factor is fitted against the
  class without it.
- metrics: structural numbers of a problem worth charting against N (e.g. a recursion depth and
  the bound it must stay under), recorded by the sweeps beside the times.
- roofline: what perf/<id> times and against which roofline (``Roofline``; measure.roofline,
  verify.checks.perf): the fp32 matmul rate with a FLOP count, or a bare primitive of the same
  size (the batched rfft/irfft of the same columns, one scatter over the tree), and the issue's
  benchmark target (reported, never judged).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

#: Complexity classes a fast path can claim (docs/design.md). "N diam" is "N" times a cost factor
#: (the diameter); "N + E" is "N" times the cost factor (N + |E|) / N (a graph's nodes plus its
#: stored edges |E|: work per sparse product with the graph, choromanski22 Thm. 4.1).
COMPLEXITY_CLASSES = ("N", "N log N", "N log^2 N", "N diam", "N + E", "N^2")
#: Classes whose claim carries a per-problem cofactor (Mechanism.cost_factor is required for them),
#: and the class time / cost_factor is tested against.
COST_FACTOR_CLASSES = {"N diam": "N", "N + E": "N"}
#: The implicit variant of a record that declares none.
DEFAULT_VARIANT = "default"
#: How equivalence runs a variant (module docstring): plain, update in place, learnable, backward.
PROTOCOLS = ("plain", "update", "learnable", "backward")
#: The protocols that change or differentiate the mask parameters (they need ``mask_params``).
PARAM_PROTOCOLS = ("update", "learnable")
#: Batch and head dims of equivalence problems: 4 slices whose magnitudes differ by orders of
#: magnitude (verify.favor.favor_problem), each compared with the reference on its own.
EQUIVALENCE_BATCH = (2, 2)

#: runner() -> Tensor: the timed part of one (problem, implementation); set-up happens before.
Runner = Callable[[], Any]
#: Rooflines a perf/<id> check compares with (measure.roofline): the measured fp32 matmul rate
#: (achieved GFLOP/s of the useful FLOPs), or a bare primitive of the same size timed beside it.
ROOFLINE_BASELINES = ("matmul", "fft", "scatter")


def _pow2_grid(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2**p for p in range(lo, hi + 1))


@dataclass(frozen=True)
class Variant:
    """A named input family of a mechanism.

    name: stable id within the mechanism ("path", "grid-2d", "cls-token"); title: for people.
    params: keyword arguments of the mechanism's make_problem for this variant.
    *_sizes: N grids overriding the mechanism's for this variant (None: the mechanism's), e.g.
        an O(N diam) operator timed on paths only up to where N^2 stays affordable.
    sweep: False for variants that only equivalence runs (an option that does not change cost).
    protocol: "plain", "update", "learnable" or "backward" (PROTOCOLS, module docstring); all but
        "plain" are equivalence-only (sweep must be False); "update" and "learnable" need the
        mechanism's ``mask_params``.
    """

    name: str
    title: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    fast_sizes: tuple[int, ...] | None = None
    dense_sizes: tuple[int, ...] | None = None
    quick_fast_sizes: tuple[int, ...] | None = None
    quick_dense_sizes: tuple[int, ...] | None = None
    sweep: bool = True
    protocol: str = "plain"

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"variant name must be a non-empty string, got {self.name!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"variant {self.name!r}: protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.protocol != "plain" and self.sweep:
            raise ValueError(f"variant {self.name!r}: a {self.protocol!r} variant is equivalence-only (sweep=False)")


def backward_variant(name: str = "backward", title: str = "", **params) -> Variant:
    """The "backward" variant of a record (equivalence-only): q, k, v leaves requiring grad, the
    gradient of the attention against finite differences of the reference and, for a linear record,
    the operator's matmul and rmatmul against the dense mask and its transpose. ``params``: the
    make_problem options it runs with (an asymmetric kind, a batch of many graphs).

        >>> from verify.registry import backward_variant
        >>> v = backward_variant(kind="random-walk")
        >>> v.name, v.protocol, v.sweep, dict(v.params)
        ('backward', 'backward', False, {'kind': 'random-walk'})
    """
    what = ", ".join(f"{k} = {v}" for k, v in params.items())
    return Variant(name, title or ("q, k, v leaves requiring grad: gradient, matmul and rmatmul vs the dense mask"
                                   + (f" ({what})" if what else "")), params=params, sweep=False, protocol="backward")


@dataclass(frozen=True)
class Roofline:
    """How perf/<id> measures a mechanism's speed against what the machine can do (measure.roofline).

    baseline: "matmul" (the fast path's useful FLOPs per second as a fraction of the fp32 GEMM
        rate measured in the same run), "fft" (the bare batched rfft/irfft of the same columns at
        the mask's n_fft and transform dtype, over the mask product's time) or "scatter" (one bare
        index_add_ of N x c rows into the tree's parents, over the mask product's time).
    case(mech, n, device, seed) -> measure.roofline.PerfCase: builds the timed kernel (and the bare
        primitive, or the FLOP counts) untimed; measure.roofline has the factories (favor_case,
        softmax_case, mask_product_case).
    target: the issue's benchmark target for the fraction (linear 0.70, causal 0.50, FFT masks
        1 / 1.5), or None (reported only). A benchmark target, never a pass/fail threshold.
    target_n: the N the target is stated at (the issue's 2^16), or None.
    quick_n / n: the N timed in --quick and in the full run (the mechanism's size_rule applies).
    """

    baseline: str
    case: Callable[..., Any]
    target: float | None = None
    target_n: int | None = None
    quick_n: int = 2**14
    n: int = 2**16

    def __post_init__(self):
        if self.baseline not in ROOFLINE_BASELINES:
            raise ValueError(f"roofline baseline must be one of {ROOFLINE_BASELINES}, got {self.baseline!r}")
        if not callable(self.case):
            raise ValueError(f"roofline case must be callable (mech, n, device, seed) -> PerfCase, got {self.case!r}")
        if self.target is not None and not (isinstance(self.target, (int, float)) and 0 < self.target <= 1):
            raise ValueError(f"roofline target must be a fraction in (0, 1] or None, got {self.target!r}")
        for name in ("quick_n", "n") + (("target_n",) if self.target_n is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"roofline {name} must be a positive int, got {value!r}")

    def size(self, quick: bool) -> int:
        """The N of the mode (before the mechanism's size_rule)."""
        return self.quick_n if quick else self.n


@dataclass(frozen=True)
class Mechanism:
    """One mechanism: how to make inputs, the dense truth, the fast path and its dense twin.

    make_problem(n, seed, *, batch=(), **variant.params) -> Problem: deterministic NumPy inputs;
        batch: leading (batch, head) dims of q, k, v (equivalence uses EQUIVALENCE_BATCH; sweeps
        and scale use ()), per-sample mask data (segment ids, key masks) shaped to broadcast.
    reference(problem) -> ndarray: float64, dense.
    fast_setup(problem, device, dtype, requires_grad=False) -> runner: converts inputs and builds
        the mask operator (untimed); runner() computes the output (timed), a Tensor of
        reference's shape. requires_grad=True makes the float inputs (q, k, v) leaves that require
        grad, so runner().sum().backward() trains through the fast path (scale/<id>-train).
    dense_setup: the same for the O(N^2) torch twin (None where the mechanism is dense itself).
    dense_mask(problem) -> (N, N) ndarray for the mask gallery, or None.
    fast_sizes / dense_sizes (and quick_*): N grids for sweeps (powers of two, docs/methods.md).
    size_rule(n) -> the largest admissible N <= n, for mechanisms defined only at some N (the
        hypercube needs 2^k); None: every N >= 1. Use ``admissible(n)`` before make_problem
        wherever N is not from the mechanism's own grids.
    variants: named input families (see the module docstring); empty: one implicit "default".
    scale, scale_train: scale/<id> and scale/<id>-train exist.
    cost_factor(problem) -> float, cost_factor_name: required for the classes in
        COST_FACTOR_CLASSES ("N diam": the diameter, "diam"; "N + E": (N + |E|) / N, "(N+E)/N").
    metrics(problem) -> {name: value}: structural numbers recorded by sweeps (may be None);
        a name "X bound" is drawn as the bound of metric "X".
    linear: the fast path is fast.masked_linear_attention with stabilised FAVOR+ features of
        problem.projection and the operator ``fast_mask(problem, device)`` (None: unmasked), so
        checks may drive the operator with features of their own (guard/denominator).
    fast_mask(problem, device) -> the fast/ mask operator of a linear mechanism, or None.
    mask_params: names of problem.extras entries that are continuous mask parameters (a
        Toeplitz table, a tree's f, a diffusion time). fast_mask must accept a torch.Tensor in
        their place and hold it without copying, so in-place updates and requires_grad reach
        the operator; reference and dense_mask read them with np.asarray. Needed by the
        "update" and "learnable" protocols.
    draw(problem, generator) -> the problem with its random parts (the FAVOR+ projection, an RPE
        projection, ...) drawn by fast/'s own samplers from the torch.Generator ``generator``
        (reproducibility/<id>); None for a deterministic mechanism.
    roofline: what perf/<id> times and against which roofline (``Roofline``); None: perf/<id>
        is skipped with that reason (every registered mechanism declares one).
    output_columns: the width of the output's last dim where it is not v's (edge-loss returns one
        number per node, (..., N, 1)); None: d_v, as every attention returns.
    """

    id: str
    title: str
    source: str
    complexity: str
    make_problem: Callable
    reference: Callable
    fast_setup: Callable[..., Runner]
    dense_setup: Callable[..., Runner] | None = None
    dense_mask: Callable | None = None
    exact: bool = True
    fast_sizes: tuple[int, ...] = _pow2_grid(7, 17)
    # the dense twins stop at 2^13 in full mode too: every crossover lies far below it, and at
    # 2^14 building the masks alone (the reference's all-pairs tree distances, Toeplitz and
    # hypercube blocks) took 30-140 s per twin, paid by every sweep and memory child
    dense_sizes: tuple[int, ...] = _pow2_grid(7, 13)
    quick_fast_sizes: tuple[int, ...] = _pow2_grid(7, 16)
    quick_dense_sizes: tuple[int, ...] = _pow2_grid(7, 13)
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    size_rule: Callable[[int], int] | None = None
    variants: tuple[Variant, ...] = ()
    scale: bool = False
    scale_train: bool = False
    cost_factor: Callable[[Any], float] | None = None
    cost_factor_name: str = ""
    metrics: Callable[[Any], Mapping[str, float]] | None = None
    linear: bool = False
    fast_mask: Callable | None = None
    mask_params: tuple[str, ...] = ()
    draw: Callable | None = None
    roofline: Roofline | None = None
    output_columns: int | None = None

    def __post_init__(self):
        if self.complexity not in COMPLEXITY_CLASSES:
            raise ValueError(f"complexity must be one of {COMPLEXITY_CLASSES}, got {self.complexity!r}")
        if (self.complexity in COST_FACTOR_CLASSES) != (self.cost_factor is not None):
            raise ValueError(f"complexity {self.complexity!r}: a cost_factor is required for the classes "
                             f"{sorted(COST_FACTOR_CLASSES)} and only for them")
        if self.cost_factor is not None and not self.cost_factor_name:
            raise ValueError("a cost_factor needs a cost_factor_name (e.g. 'diam')")
        names = [v.name for v in self.variants]
        if len(names) != len(set(names)):
            raise ValueError(f"variant names of {self.id!r} must be unique, got {names}")
        needs = [v.name for v in self.variants if v.protocol in PARAM_PROTOCOLS]
        if needs and not self.mask_params:
            raise ValueError(f"{self.id!r}: variants {needs} use the update/learnable protocol, which needs mask_params")
        if self.fast_mask is not None and not self.linear:
            raise ValueError(f"{self.id!r}: fast_mask is the operator of a linear mechanism (set linear=True)")
        if self.scale_train and not self.scale:
            raise ValueError("scale_train needs scale (scale/<id>-train sits beside scale/<id>)")
        if self.roofline is not None and not isinstance(self.roofline, Roofline):
            raise ValueError(f"{self.id!r}: roofline must be a verify.registry.Roofline or None, got {self.roofline!r}")

    # ------------------------------------------------------------------ variants and sizes

    @property
    def all_variants(self) -> tuple[Variant, ...]:
        """The declared variants, or the one implicit default variant."""
        return self.variants or (Variant(DEFAULT_VARIANT),)

    @property
    def default_variant(self) -> Variant:
        return self.all_variants[0]

    def variant(self, name: str | None = None) -> Variant:
        """The variant called ``name`` (None: the default), KeyError listing the known names."""
        if name is None:
            return self.default_variant
        for v in self.all_variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.all_variants)
        raise KeyError(f"mechanism {self.id!r} has no variant {name!r}; known: {known}")

    def problem(self, n: int, seed: int, variant: str | Variant | None = None, batch: tuple[int, ...] = ()):
        """make_problem(n, seed, **params of ``variant``) (default variant when None); batch:
        leading dims of q, k, v (passed on only when not empty, so older records still work)."""
        v = variant if isinstance(variant, Variant) else self.variant(variant)
        if batch:
            return self.make_problem(n, seed, batch=tuple(batch), **dict(v.params))
        return self.make_problem(n, seed, **dict(v.params))

    def sizes(self, impl: str, quick: bool, variant: str | Variant | None = None) -> tuple[int, ...]:
        """The sweep grid of ``impl`` ("fast" | "dense") in quick or full mode, for ``variant``."""
        if impl not in ("fast", "dense"):
            raise ValueError(f"impl must be 'fast' or 'dense', got {impl!r}")
        v = variant if isinstance(variant, Variant) else self.variant(variant)
        attr = f"{'quick_' if quick else ''}{impl}_sizes"
        own = getattr(v, attr)
        return tuple(own if own is not None else getattr(self, attr))

    def admissible(self, n: int) -> int:
        """The N to use for a requested n: n itself unless ``size_rule`` says otherwise."""
        return n if self.size_rule is None else self.size_rule(n)

    # ------------------------------------------------------------------ running

    def fast(self, problem, device="cpu", dtype=None):
        """Run the fast path once on ``problem`` (dtype default float32)."""
        return self.fast_setup(problem, device, _dtype(dtype))()

    def dense(self, problem, device="cpu", dtype=None):
        """Run the dense torch twin once (ValueError if there is none)."""
        if self.dense_setup is None:
            raise ValueError(f"mechanism {self.id!r} has no dense twin (it is dense itself)")
        return self.dense_setup(problem, device, _dtype(dtype))()


def _dtype(dtype):
    if dtype is None:
        import torch  # the records are torch-free to describe; running them needs torch

        return torch.float32
    return dtype


_REGISTRY: dict[str, Mechanism] = {}


def register(mech: Mechanism) -> Mechanism:
    """Add a mechanism; ids are unique."""
    if mech.id in _REGISTRY:
        raise ValueError(f"mechanism id {mech.id!r} is already registered")
    _REGISTRY[mech.id] = mech
    return mech


def unregister(mech_id: str) -> Mechanism:
    """Remove and return a record (tests that register a temporary mechanism clean up with it)."""
    try:
        return _REGISTRY.pop(mech_id)
    except KeyError:
        raise KeyError(f"mechanism {mech_id!r} is not registered") from None


def registered() -> list[Mechanism]:
    """The records registered so far, in registration order (no loading: see verify.mechanisms)."""
    return list(_REGISTRY.values())


def lookup(mech_id: str) -> Mechanism:
    """The registered record with this id (KeyError listing the known ids)."""
    try:
        return _REGISTRY[mech_id]
    except KeyError:
        raise KeyError(f"unknown mechanism {mech_id!r}; known: {', '.join(_REGISTRY)}") from None


def relative_error(reference: np.ndarray, candidate) -> float:
    """Relative Frobenius error |c - r|_F / |r|_F (never a per-entry max ratio, docs/papers.md Sec. 5)."""
    if hasattr(candidate, "detach"):
        candidate = candidate.detach().cpu().double().numpy()
    c = np.asarray(candidate, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if c.shape != r.shape:
        raise ValueError(f"shape mismatch: reference {r.shape} vs candidate {c.shape}")
    return float(np.linalg.norm(c - r) / max(np.linalg.norm(r), np.finfo(float).tiny))
