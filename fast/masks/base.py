"""The mask contract: ``MaskOperator``, a base class with documented defaults (after Scenic's
Performer ``Mask.act`` and scipy's ``LinearOperator``).

A mask operator stands for an N x N matrix M that is never built. It offers

required
    n: int                        the number of tokens N (an instance attribute is enough)
    matmul(x) -> M @ x            x: (..., N, c) -> (..., N, c), the leading dims of x
                                  broadcast against the operator's own (a batched mask), computed
                                  sub-quadratically in N; c is arbitrary. The drivers check the
                                  shape of what comes back (ValueError naming mask.matmul).

optional, with these defaults
    attend = None                 or a method attend(phi_q, phi_k, v) -> (num, den):
                                      num (..., N, d) = sum_j M_ij (phi_q_i . phi_k_j) v_j
                                      den (..., N)    = sum_j M_ij (phi_q_i . phi_k_j)
                                  a specialised form of Algorithm 1 (the chunked causal scan, the
                                  two GEMMs of padding, the FFT path of Toeplitz). The driver
                                  (fast.masked_linear_attention) calls it when
                                  ``getattr(mask, "attend", None)`` is not None, and otherwise runs
                                  the generic blocked Algorithm 1 through ``matmul``. It returns
                                  numerator and denominator apart so the driver guards the division
                                  in one place. An ``attend`` is responsible for its own memory
                                  under autograd (the ones here save O(N (m + d)) numbers).
    rmatmul = None                or a method rmatmul(x) -> M^T @ x, same shapes as matmul (scipy's
                                  rmatvec). With it, and no parameter requiring grad, the generic
                                  path's backward is two plain passes per block (M @ cols for
                                  d phi_q, M^T @ (phi_q g^T) for d phi_k and d v) with no autograd
                                  graph; without it (or with learnable parameters, or for double
                                  backward) backward differentiates matmul with autograd, one
                                  recomputed block at a time. Symmetric masks set rmatmul = matmul.
    key_stabilizer(z) -> c        z: (..., N, m) FAVOR+ key exponents -> constants broadcastable
                                  to z, subtracted before exp by fast.favor_attention (for every
                                  operator). They cancel in the output only if every query sees
                                  keys with one common constant, or if the operator's ``attend``
                                  undoes them (``rescales_keys`` below). Default: the max over all keys
                                  and features of each (batch, head) slice,
                                  ``z.amax(dim=(-2, -1), keepdim=True)`` (what FavorPlus does
                                  without a mask). Padding and packing override it so that a key
                                  the mask hides never sets the scale of the visible ones.
    nonnegative: bool = False     True when every entry M_ij >= 0 is guaranteed (causal, packing,
                                  padding; Toeplitz, hypercube, tree masks, DenseMask, SparseMask,
                                  LowRankMask compute it from their tables, weights or entries). A
                                  class or an instance attribute (a property is fine); absent or
                                  False means "sign unknown". Read it through ``nonnegative_of``.
                                  The driver's guard relies on it: with M >= 0 and features >= 0
                                  no term of a denominator can cancel another, so the guard costs
                                  no extra mask product; and the rows that see no key are those
                                  with (M 1)_i == 0 (fast.masked_linear_attention, ``no_key``).
    abs_matmul = None             or a method abs_matmul(x) -> B @ x for some matrix B >= |M|
                                  entrywise (e.g. LowRankMask: |A| (|B|^T x); DenseMask: |M| x), same
                                  shapes as matmul. Only read for a mask that is not nonnegative
                                  (for a nonnegative one B = M and the driver uses matmul): it gives
                                  the guard the scale sum_j B_ij |phi_q_i . phi_k_j| of the terms a
                                  denominator sums, and ``no_key`` its rows. Read it through
                                  ``abs_matmul_of``.
    roundoff_bound = None         or a method roundoff_bound(x) -> (..., c): a per-column bound on
                                  |fl(M x) - M x| (entrywise) for x (..., N, c), in x's compute
                                  dtype (fast.validation.compute_dtype), for products whose error
                                  is not a few units of round-off of each summed term (an FFT's
                                  error is relative to norms, not to the terms: ToeplitzMask). The
                                  driver adds |phi_q_i| . roundoff_bound(phi_k) to the guard's floor.
                                  Read it through ``roundoff_bound_of``.
    rescales_keys: bool = False   True when ``attend`` accepts a keyword argument ``key_log_scale``
                                  (a detached tensor (..., N, 1), or None) and ``key_stabilizer``
                                  returns per-key constants that need it (CausalMask: the running
                                  max c_j = max_{j' <= j} max_a z_j'a). Meaning: the key features
                                  passed in are phi_k_j = phi_true_k_j * exp(-key_log_scale_j), with
                                  key_log_scale what key_stabilizer returned, expanded to (..., N, 1).
                                  attend must then return (num, den) of the TRUE features up to one
                                  positive factor per query row (it may multiply num_i and den_i by
                                  the same exp(-r_i): that cancels in the division). With
                                  key_log_scale=None attend behaves as without the keyword (the
                                  constants are equal for all keys). Only fast.favor_attention
                                  passes it (to such operators only); fast.favor_features, which
                                  feeds the public masked_linear_attention (which never passes
                                  it), uses the default per-slice max for them instead. Read it
                                  through ``rescales_keys_of``.
    parameters() -> tensors       the tensors M depends on that may require grad (a learnable
                                  Toeplitz table, a diffusion time, low-rank factors). The memory-
                                  saving autograd Function of the generic path (fast.algebra)
                                  recomputes M @ x in backward and returns gradients for exactly
                                  these. Default: the attributes of the operator that are tensors
                                  requiring grad (also inside lists, tuples and dicts, and the
                                  parameters() of attributes that are operators themselves). An
                                  ``nn.Module``'s own ``parameters()`` satisfies the contract.

``isinstance(x, MaskOperator)`` is True for subclasses and, structurally, for any object with an
``n`` attribute and a callable ``matmul`` (so users need not subclass); for those the defaults
above are supplied by the module functions ``attend_of``, ``rmatmul_of``, ``key_stabilizer_of``,
``parameters_of``, ``nonnegative_of``, ``abs_matmul_of``, ``roundoff_bound_of`` and
``rescales_keys_of``, which the drivers use for every operator.
"""
from __future__ import annotations

import abc
from typing import Callable, Iterable

import torch


def default_key_stabilizer(z: torch.Tensor) -> torch.Tensor:
    """Max of z (..., N, m) over keys and features of each (batch, head) slice -> (..., 1, 1).

    Never a max across the batch: one sample's underflow would then depend on another's inputs.
    """
    return z.amax(dim=(-2, -1), keepdim=True)


def _collect(value: object, out: dict[int, torch.Tensor], seen: set[int], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            out.setdefault(id(value), value)
    elif isinstance(value, (list, tuple)) and depth < 2:
        for item in value:
            _collect(item, out, seen, depth + 1)
    elif isinstance(value, dict) and depth < 2:
        for item in value.values():
            _collect(item, out, seen, depth + 1)
    elif isinstance(value, MaskOperator) and id(value) not in seen:  # a nested operator
        seen.add(id(value))
        own = getattr(value, "parameters", None)
        if callable(own) and getattr(own, "__func__", None) is not MaskOperator.parameters:
            items = own()
        else:  # the default scan, carrying ``seen`` so that cycles terminate
            items = _scan(value, seen)
        for t in items:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                out.setdefault(id(t), t)


def _scan(op: object, seen: set[int]) -> list[torch.Tensor]:
    found: dict[int, torch.Tensor] = {}
    seen.add(id(op))
    for value in getattr(op, "__dict__", {}).values():
        _collect(value, found, seen)
    return list(found.values())


def default_parameters(op: object) -> list[torch.Tensor]:
    """Tensor attributes of ``op`` that require grad (in lists, tuples, dicts and nested operators too)."""
    return _scan(op, set())


class _MaskOperatorMeta(abc.ABCMeta):
    def __instancecheck__(cls, obj: object) -> bool:
        if super().__instancecheck__(obj):
            return True
        # structural for the base class only: any object with n and a callable matmul
        return cls is MaskOperator and hasattr(obj, "n") and callable(getattr(obj, "matmul", None))


class MaskOperator(metaclass=_MaskOperatorMeta):
    """Base class of mask operators: see the module docstring for the contract and its defaults.

    Subclasses set ``self.n`` and implement ``matmul``; they may define ``attend`` and ``rmatmul``
    and override ``key_stabilizer`` and ``parameters``.
    """

    n: int

    #: None: no specialised Algorithm 1; the driver uses the generic blocked path via matmul.
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None

    #: None: M^T @ x is not offered; backward of the generic path differentiates matmul instead.
    rmatmul: Callable[[torch.Tensor], torch.Tensor] | None = None

    #: False: the sign of the entries is unknown (subclasses set True, or compute it, when M >= 0).
    nonnegative: bool = False

    #: None: no product with an entrywise bound B >= |M| (only read for masks not nonnegative).
    abs_matmul: Callable[[torch.Tensor], torch.Tensor] | None = None

    #: None: the product's round-off is a few units per summed term (no extra floor for the guard).
    roundoff_bound: Callable[[torch.Tensor], torch.Tensor] | None = None

    #: False: ``attend`` takes no ``key_log_scale`` (the key constants are one per (batch, head) slice).
    rescales_keys: bool = False

    @abc.abstractmethod
    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Return M @ x for x of shape (..., N, c) -> (..., N, c)."""

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """FAVOR+ key constants for z (..., N, m); default: ``default_key_stabilizer``."""
        return default_key_stabilizer(z)

    def parameters(self) -> Iterable[torch.Tensor]:
        """Tensors M depends on that may require grad; default: ``default_parameters(self)``."""
        return default_parameters(self)


class SymmetricMaskOperator(MaskOperator):
    """A mask with M = M^T (tree distances, Hamming distances, segment equality): ``rmatmul`` is
    ``matmul``, so training takes the adjoint backward (one product per recomputed block)."""

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x = M @ x for x (..., N, c)."""
        return self.matmul(x)


def attend_of(op: object):
    """The operator's ``attend`` method, or None when it has none (then the generic path runs)."""
    return getattr(op, "attend", None)


def rmatmul_of(op: object):
    """The operator's ``rmatmul`` (x -> M^T @ x), or None when it has none."""
    return getattr(op, "rmatmul", None)


def key_stabilizer_of(op: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """The operator's ``key_stabilizer``, or ``default_key_stabilizer`` when it has none."""
    fn = getattr(op, "key_stabilizer", None)
    return fn if fn is not None else default_key_stabilizer


def parameters_of(op: object) -> list[torch.Tensor]:
    """The operator's ``parameters()`` (or the default scan) as a list of distinct tensors
    requiring grad; entries that are not tensors or do not require grad are dropped."""
    fn = getattr(op, "parameters", None)
    items = fn() if callable(fn) else default_parameters(op)
    out: dict[int, torch.Tensor] = {}
    for t in items:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            out.setdefault(id(t), t)
    return list(out.values())


def nonnegative_of(op: object) -> bool:
    """True when the operator guarantees M_ij >= 0 (its ``nonnegative`` attribute is true); False
    when it says no, has no such attribute, or holds something that is not a truth value."""
    value = getattr(op, "nonnegative", False)
    if callable(value):  # a method by mistake: not a guarantee
        return False
    try:
        return bool(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of several entries
        return False


def abs_matmul_of(op: object):
    """The operator's ``abs_matmul`` (x -> B @ x with B >= |M| entrywise), or None."""
    fn = getattr(op, "abs_matmul", None)
    return fn if callable(fn) else None


def roundoff_bound_of(op: object):
    """The operator's ``roundoff_bound`` (x (..., N, c) -> per-column bound (..., c)), or None."""
    fn = getattr(op, "roundoff_bound", None)
    return fn if callable(fn) else None


def rescales_keys_of(op: object) -> bool:
    """True when the operator's ``attend`` takes ``key_log_scale`` (``rescales_keys`` is true and
    it has an ``attend``); False otherwise."""
    value = getattr(op, "rescales_keys", False)
    return value is True and attend_of(op) is not None
