"""The mask operator contract: ``MaskOperator`` (after scipy's ``LinearOperator`` and Scenic's
Performer ``Mask.act``).

A mask operator stands for an N x N matrix M that is never built. A subclass sets ``n`` and
implements ``_matmat``; the public methods check their input (a floating (..., N, c) tensor) and
the subclass's output (a tensor of shape (..., N, c) on x's device, whose leading dims are x's
broadcast against the operator's own) once, and cast it to x's dtype. Everything else is an
optional capability declared here with its default, read by the drivers as an attribute:

========================  ==============================================================  ============
capability                meaning                                                         default
========================  ==============================================================  ============
``matmul(x)``             M @ x, x (..., N, c) -> (..., N, c), sub-quadratic in N          required
                          (subclass: ``_matmat``); entries an inner sum overflowed are
                          redone on x 2^-s (one output pass and host read).
                          ``matmul_unscaled``: the same product unchecked, for the
                          drivers, which rescale v themselves
``rmatmul(x)``            M^T @ x (subclass: ``_rmatmat``); ``has_rmatmul`` says whether   absent
                          it exists (``rmatmul_unscaled``: unchecked, as above). With it
                          (and no parameter requiring grad) the
                          generic path's backward is two plain passes per block
                          (fast.algebra); symmetric masks: ``SymmetricMaskOperator``
``abs_matmul(x)``         B @ x for some B >= |M| entrywise (subclass: ``_abs_matmat``,   absent
                          no gradient); ``has_abs_matmul``. Read by the denominator
                          guard only for a mask that is not ``nonnegative``
``roundoff_bound(x)``     per-column bound (..., c) on |fl(M x) - M x| in x's compute      None
                          dtype, for products whose error is normwise (an FFT's);
                          subclass: ``_roundoff_bound``
``nonnegative``           True when M_ij >= 0 is guaranteed (a property may compute it);   False
                          the guard then needs no extra product
``attend``                a specialised Algorithm 1, attend(phi_q, phi_k, v) ->            None
                          (num (..., N, d), den (..., N)), preferred by the driver
``rescales_keys``         True when ``attend`` takes ``key_log_scale`` (..., N, 1): the    False
                          per-key constants of ``key_stabilizer``, which it undoes
``attend_reaches_keys``   True when ``attend``'s (num, den) hold a non-finite entry          False
                          wherever phi_k or v does (every key reaches its own row: M_jj
                          != 0, through plain sums and products, so inf or NaN spreads):
                          the driver then skips its read passes over phi_k and v
``attend_takes_half``     True when ``attend(..., accumulate=True)`` takes half-precision   False
                          phi_q, phi_k, v (one dtype) as they are and returns num, den in
                          float32: the driver then makes no float32 copies of them
``attend_optimistic``     a route of ``attend(..., key_log_scale)`` whose exactness is     attend, None
                          a 0-dim bool read with the driver's one host read
``attend_exact``          the exact route, called when that flag read False                attend
``no_key_cause``          what makes a row of M all zero, in the terms of the mask's       None
                          arguments ("key_mask is False at every key of their sample"):
                          the DenominatorError of a query that sees no key says it
``key_stabilizer(z)``     FAVOR+ key constants for z (..., N, m), broadcastable to z       slice max
``row_key_stabilizer()``  key_stabilizer as a function of z's row maxima, or None          slice max
``parameters()``          the tensors M depends on that may require grad                   scan
========================  ==============================================================  ============

Anything with ``n`` and a callable ``matmul`` that does not subclass is wrapped once by
``as_operator`` (at the drivers' and the algebra's entry points) into an ``OperatorAdapter``,
which reads the same optional names off the object with the defaults above. A subclass in five
lines: ``MaskOperator``'s example.
"""
from __future__ import annotations

import abc
import numbers
from typing import Callable, Iterable

import torch

from fast.scaling import times_pow2, value_shift
from fast.validation import check_tokens, finite_flag

__all__ = ["MaskOperator", "SymmetricMaskOperator", "OperatorAdapter", "as_operator", "default_key_stabilizer",
           "default_parameters"]


def default_key_stabilizer(z: torch.Tensor) -> torch.Tensor:
    """Max of z (..., N, m) over keys and features of each (batch, head) slice -> (..., 1, 1).

    Never a max across the batch: one sample's underflow would then depend on another's inputs.

    >>> import torch
    >>> from fast.operator import default_key_stabilizer
    >>> default_key_stabilizer(torch.tensor([[[1., 2.], [3., 0.]], [[0., -1.], [-2., -3.]]])).flatten().tolist()
    [3.0, 0.0]
    """
    return z.amax(dim=(-2, -1), keepdim=True)


def _slice_max_of_rows(rows: torch.Tensor) -> torch.Tensor:
    """default_key_stabilizer from the row maxima (..., N, 1) of z: their max per slice."""
    return rows.amax(-2, keepdim=True)


def _looks_like_operator(value: object) -> bool:
    return isinstance(value, MaskOperator) or (hasattr(value, "n") and callable(getattr(value, "matmul", None)))


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
    elif _looks_like_operator(value) and id(value) not in seen:  # a nested operator (or duck-typed one)
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
    """Tensor attributes of ``op`` that require grad (in lists, tuples, dicts and nested operators
    too), each once, in attribute order.

    >>> import torch
    >>> from fast.operator import default_parameters
    >>> class Holder:
    ...     pass
    >>> h = Holder(); h.w = torch.ones(2, requires_grad=True); h.c = torch.ones(2)
    >>> [t is h.w for t in default_parameters(h)]
    [True]
    """
    return _scan(op, set())


def _broadcasts_to(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    if len(src) > len(dst):
        return False
    return all(s in (1, t) for s, t in zip(reversed(src), reversed(dst)))


class _PairedPow2(torch.autograd.Function):
    """x 2^e forward, the gradient passed unchanged: for the pair x -> M (x 2^-s) 2^s around a linear
    M, whose derivative is M's own (the true factors 2^s and 2^-s would overflow the gradient on the
    way where M^T g does not)."""

    @staticmethod
    def forward(ctx, x, e):
        return times_pow2(x, e)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _without_overflow(x: torch.Tensor, y: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor],
                      parameters: Callable[[], Iterable[torch.Tensor]]) -> torch.Tensor:
    """y = product(x), with its non-finite entries computed again as 2^s product(x 2^-s) when x is
    finite (s per leading slice and column of x: its largest |entry| scaled into [0.5, 1),
    fast.scaling.value_shift). The entries y has finite met no overflow (an inf intermediate
    leaves inf or NaN in every sum it reaches) and are kept as they are: the rescaled product would
    round x's entries far below its largest into subnormals. Half precisions take s in float32
    and the product in their own dtype. Gradients: M^T g for x when no parameter of M requires
    grad; otherwise the true factors (exact, but 2^s g may overflow on the way). One read pass
    (a sum: NaN or inf in any entry makes it NaN or inf; a third of aminmax's time on CPU) and one
    host read; finite_flag and the redo only on the rare path."""
    with torch.no_grad():
        if bool(torch.isfinite(y.sum())):  # the one host read
            return y
        if bool(finite_flag(y)) or not bool(finite_flag(x)):  # the sum itself overflowed; or x is not finite
            return y
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()  # pow2's dtypes
    shift = value_shift(wide)
    paired = not (torch.is_grad_enabled() and any(p.requires_grad for p in parameters()))
    scale = _PairedPow2.apply if paired else times_pow2
    redo = product(scale(wide, -shift).to(x.dtype))
    redo = scale(redo.to(wide.dtype), shift).to(y.dtype)
    return torch.where(torch.isfinite(y), y, redo)


class MaskOperator(abc.ABC):
    """An N x N mask M given by its products (module doc: the contract and its defaults).

    Subclasses set ``self.n`` (the number of tokens N) and implement ``_matmat(x)`` = M @ x for
    x (..., N, c); they may implement ``_rmatmat`` (M^T @ x), ``_abs_matmat`` (B @ x, B >= |M|)
    and ``_roundoff_bound``, define ``attend``, and override the other capabilities. Instantiating
    a subclass without ``_matmat`` raises TypeError.

    >>> import torch
    >>> from fast.operator import MaskOperator
    >>> class Causal3(MaskOperator):                  # M = lower-triangular ones
    ...     n = 3
    ...     nonnegative = True                         # a declared capability
    ...     def _matmat(self, x):
    ...         return x.cumsum(-2)
    >>> Causal3().matmul(torch.ones(3, 1)).flatten().tolist(), Causal3().has_rmatmul
    ([1.0, 2.0, 3.0], False)
    """

    n: int

    #: None: no specialised Algorithm 1; the driver runs the generic blocked path through matmul.
    attend: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    #: False: the sign of the entries is unknown (subclasses set True, or compute it, when M >= 0).
    nonnegative: bool = False

    #: False: ``attend`` takes no ``key_log_scale`` (the key constants are one per (batch, head) slice).
    rescales_keys: bool = False

    #: False: the driver reads phi_k and v once more to find a non-finite entry that attend may hide
    #: (a key no query sees); True where every key reaches its own row's products (CausalMask).
    attend_reaches_keys: bool = False

    #: False: the driver gives attend float32 copies of half-precision inputs; True where attend takes
    #: ``accumulate=True`` and reads them itself, summing in float32 (CausalMask's Triton kernel).
    attend_takes_half: bool = False

    #: None: a query that sees no key is explained in general terms; a mask whose arguments can empty a
    #: row says which argument and how (PaddingMask: its key_mask), so the error names it.
    no_key_cause: str | None = None

    # ---------------------------------------------------------------- products, checked once

    @abc.abstractmethod
    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for a checked x (..., N, c) -> (..., N, c)."""

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{self.type_name} offers no rmatmul (M^T @ x): check has_rmatmul first")

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{self.type_name} offers no abs_matmul (B @ x, B >= |M|): check has_abs_matmul "
                                  "first")

    def _roundoff_bound(self, x: torch.Tensor) -> torch.Tensor | None:
        return None

    @property
    def type_name(self) -> str:
        """The operator's class name, for error messages (an adapter gives the wrapped object's)."""
        return type(self).__name__

    def _check_input(self, what: str, x: object) -> None:
        """x must be a floating (..., N, c) tensor with N = n: TypeError / ValueError naming the method."""
        try:
            check_tokens("x", x, self.n)
        except (TypeError, ValueError) as error:  # the happy path costs the metadata checks only
            raise type(error)(f"mask.{what}(x): {error} (mask is {self.type_name})") from None

    def _checked(self, what: str, x: torch.Tensor, y: object) -> torch.Tensor:
        """y as the product of x (..., N, c): a tensor of shape (..., N, c) whose leading dims are x's
        broadcast against the operator's, on x's device, cast to x's dtype. Metadata only."""
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"mask.{what}(x) must return a torch.Tensor, got {type(y).__name__} "
                            f"(mask is {self.type_name})")
        if y.shape != x.shape and (y.dim() < 2 or y.shape[-2:] != x.shape[-2:]  # x's shape: the common case
                                   or not _broadcasts_to(tuple(x.shape[:-2]), tuple(y.shape[:-2]))):
            raise ValueError(
                f"mask.{what}(x) must return shape (..., N, c) = (..., {x.shape[-2]}, {x.shape[-1]}) with x's "
                f"leading dims {tuple(x.shape[:-2])} (broadcast against the mask's); got {tuple(y.shape)} "
                f"for x of shape {tuple(x.shape)} (mask is {self.type_name})")
        if y.device != x.device:
            raise ValueError(f"mask.{what}(x) returned a tensor on {y.device} for x on {x.device} "
                             f"(mask is {self.type_name})")
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., N, c) -> (..., N, c), x's leading dims broadcast against the mask's.

        Computed in x's dtype, and finite wherever M @ x is: sums inside the product (an FFT's,
        a series' powers, a GEMM's partial sums) can overflow for x within a factor of about N of
        the dtype's maximum where M @ x does not, and then the entries that came back inf or NaN
        are computed again on x 2^-s and multiplied back by 2^s (fast.scaling: exact in floating
        point; only entries whose true value overflows stay inf); the others are returned as
        computed. Gradients are the product's (x's: M^T g; with a parameter of M requiring grad
        the factors 2^-s, 2^s stay in the graph, and its backward overflows where g 2^s does).
        The check is one read pass over the output and one host read (a device sync on CUDA);
        the redo, a second product, runs only for finite x whose product is not. The attention
        drivers call ``matmul_unscaled`` and rescale v themselves; call it too where a sync per
        product matters and |x| is far below the maximum.

        Raises TypeError / ValueError naming ``mask.matmul(x)`` for an input that is not a
        floating (..., N, c) tensor, or an output of the wrong type, shape or device."""
        self._check_input("matmul", x)
        return _without_overflow(x, self._checked("matmul", x, self._matmat(x)),
                                 lambda scaled: self._checked("matmul", scaled, self._matmat(scaled)),
                                 self.parameters)

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x for x (..., N, c) -> (..., N, c); NotImplementedError when ``has_rmatmul`` is False.
        Checked, and redone on x 2^-s where it overflows, as ``matmul``."""
        self._check_input("rmatmul", x)
        return _without_overflow(x, self._checked("rmatmul", x, self._rmatmat(x)),
                                 lambda scaled: self._checked("rmatmul", scaled, self._rmatmat(scaled)),
                                 self.parameters)

    def matmul_unscaled(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x as ``matmul`` but with no overflow check (no pass over the output, no host read):
        an intermediate sum that overflows leaves inf or NaN in the result. For callers that
        detect and rescale overflow themselves (the attention drivers and their backward,
        fast.algebra: one host read per call for all their products). Errors as ``matmul``.

        >>> import torch
        >>> from fast import DenseMask
        >>> op, x = DenseMask(2 * torch.ones(3, 3)), torch.tensor([[2e38], [-2e38], [1e38]])   # M @ x = 2e38
        >>> op.matmul_unscaled(x).flatten().tolist(), op.matmul(x).flatten().tolist() == [2 * x[2].item()] * 3
        ([nan, nan, nan], True)

        A subclass (or instance) that overrides ``matmul`` itself, rather than ``_matmat``, is
        called through its override here too, so that the drivers compute with the product it
        defines.
        """
        if getattr(self.matmul, "__func__", None) is not _BASE_MATMUL:
            return self.matmul(x)
        self._check_input("matmul", x)
        return self._checked("matmul", x, self._matmat(x))

    def rmatmul_unscaled(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x as ``rmatmul`` but with no overflow check (``matmul_unscaled``; an override of
        ``rmatmul`` is called through as there)."""
        if getattr(self.rmatmul, "__func__", None) is not _BASE_RMATMUL:
            return self.rmatmul(x)
        self._check_input("rmatmul", x)
        return self._checked("rmatmul", x, self._rmatmat(x))

    def abs_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """B @ x for some B >= |M| entrywise, x (..., N, c) -> (..., N, c), no gradient;
        NotImplementedError when ``has_abs_matmul`` is False. Checked as ``matmul``."""
        self._check_input("abs_matmul", x)
        with torch.no_grad():
            return self._checked("abs_matmul", x, self._abs_matmat(x))

    def roundoff_bound(self, x: torch.Tensor) -> torch.Tensor | None:
        """A per-column bound (..., c) on |fl(M x) - M x| (entrywise) for x (..., N, c), in x's
        compute dtype (leading dims broadcast against the mask's), or None when the product's
        round-off is a few units of each summed term (the default). The driver adds
        |phi_q_i| . roundoff_bound(phi_k) to the guard's floor. ValueError naming
        ``mask.roundoff_bound(x)`` for a wrong shape."""
        self._check_input("roundoff_bound", x)
        bound = self._roundoff_bound(x)
        if bound is None:
            return None
        want = (*x.shape[:-2], x.shape[-1])
        if not isinstance(bound, torch.Tensor) or not _broadcasts_to(want, tuple(bound.shape)) \
                or tuple(bound.shape[-1:]) != want[-1:]:
            got = tuple(bound.shape) if isinstance(bound, torch.Tensor) else type(bound).__name__
            raise ValueError(f"mask.roundoff_bound(x) must return shape {want} (leading dims broadcast against the "
                             f"mask's), got {got} (mask is {self.type_name})")
        return bound

    @property
    def has_rmatmul(self) -> bool:
        """True when the operator offers M^T @ x (its class implements ``_rmatmat``)."""
        return type(self)._rmatmat is not MaskOperator._rmatmat

    @property
    def has_abs_matmul(self) -> bool:
        """True when the operator offers an entrywise bound B >= |M| (its class implements ``_abs_matmat``)."""
        return type(self)._abs_matmat is not MaskOperator._abs_matmat

    # ---------------------------------------------------------------- FAVOR+ key constants

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """FAVOR+ key constants for exponents z (..., N, m), broadcastable to z, subtracted before
        exp by fast.favor_attention. They cancel only if every query sees its keys with one common
        constant, or if ``attend`` undoes them (``rescales_keys``). Default: ``default_key_stabilizer``
        (the per-(batch, head) max); padding and packing override it so that a hidden key never
        sets the scale of the visible ones."""
        return default_key_stabilizer(z)

    def row_key_stabilizer(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``key_stabilizer`` as a function of the row maxima r = z.amax(-1, keepdim=True) (..., N, 1),
        which lets the FAVOR+ features take their constants without forming z (and shift once),
        or None when key_stabilizer needs z itself. Default: the per-slice max of r while
        ``key_stabilizer`` is this class's own (as defined at import), None once a subclass or an
        instance replaces it."""
        if getattr(self.key_stabilizer, "__func__", None) is _DEFAULT_KEY_STABILIZER:
            return _slice_max_of_rows
        return None

    # ---------------------------------------------------------------- the optimistic attend

    def attend_optimistic(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                          key_log_scale: torch.Tensor) -> tuple[object, torch.Tensor | None]:
        """(result of attend, exact) for an operator with ``rescales_keys``: ``exact`` is None when
        the result is exact, or a 0-dim bool tensor, read by fast.favor_attention with its one host
        read, saying whether a faster route taken without a host read of its own was exact; where
        it reads False the driver calls ``attend_exact``. Default: ``attend(phi_q, phi_k, v,
        key_log_scale=key_log_scale)`` and None (CausalMask overrides it: the one-reference scan)."""
        return self.attend(phi_q, phi_k, v, key_log_scale=key_log_scale), None

    def attend_exact(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                     key_log_scale: torch.Tensor) -> object:
        """(num, den) by a route that is always exact, after ``attend_optimistic``'s flag read False
        (the operator may remember to skip the optimistic route afterwards). Default: ``attend``."""
        return self.attend(phi_q, phi_k, v, key_log_scale=key_log_scale)

    # ---------------------------------------------------------------- learnable tensors

    def parameters(self) -> Iterable[torch.Tensor]:
        """The tensors M depends on that may require grad (a learnable Toeplitz table, a diffusion
        time): the generic path's autograd Function (fast.algebra) returns gradients for exactly
        these. Default: ``default_parameters(self)``; an ``nn.Module``'s own parameters() satisfies
        the contract."""
        return default_parameters(self)


#: The base key_stabilizer as defined at import: one patched in later is called on z like any other.
_DEFAULT_KEY_STABILIZER = MaskOperator.key_stabilizer
#: The checked public products as defined at import: matmul_unscaled calls an override of them.
_BASE_MATMUL, _BASE_RMATMUL = MaskOperator.matmul, MaskOperator.rmatmul


class SymmetricMaskOperator(MaskOperator):
    """A mask with M = M^T (tree distances, Hamming distances, segment equality): ``rmatmul`` is
    ``matmul``, so training takes the adjoint backward (one product per recomputed block).

    >>> import torch
    >>> from fast.operator import SymmetricMaskOperator
    >>> class Eye(SymmetricMaskOperator):
    ...     n = 2
    ...     def _matmat(self, x):
    ...         return x.clone()
    >>> Eye().has_rmatmul, Eye().rmatmul(torch.ones(2, 1)).flatten().tolist()
    (True, [1.0, 1.0])
    """

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmat(x)


def _nonnegative_value(value: object) -> bool:
    """A duck-typed operator's ``nonnegative`` as a guarantee: True only for a truth value that is
    true (a method by mistake, or a tensor of several entries, is no guarantee)."""
    if callable(value):
        return False
    try:
        return bool(value)
    except (TypeError, ValueError, RuntimeError):
        return False


class OperatorAdapter(MaskOperator):
    """A duck-typed operator (an object with ``n`` and a callable ``matmul`` that does not subclass
    MaskOperator) under the contract: products are checked, and each optional name the object
    lacks takes its default (module doc). The object is read at each use (``wrapped``), so a
    property such as ``nonnegative`` is computed when the driver asks, as for a subclass.

    >>> import torch
    >>> from fast.operator import as_operator
    >>> class User:
    ...     n = 2
    ...     def matmul(self, x):
    ...         return x.flip(-2)
    >>> op = as_operator(User())
    >>> type(op).__name__, op.has_rmatmul, op.nonnegative, op.matmul(torch.eye(2))[0].tolist()
    ('OperatorAdapter', False, False, [0.0, 1.0])
    """

    def __init__(self, wrapped: object):
        self.wrapped = wrapped

    @property
    def n(self) -> int:
        return self.wrapped.n

    @property
    def type_name(self) -> str:
        return type(self.wrapped).__name__

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped.matmul(x)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped.rmatmul(x)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped.abs_matmul(x)

    def _roundoff_bound(self, x: torch.Tensor) -> torch.Tensor | None:
        fn = getattr(self.wrapped, "roundoff_bound", None)
        return fn(x) if callable(fn) else None

    @property
    def has_rmatmul(self) -> bool:
        return getattr(self.wrapped, "rmatmul", None) is not None

    @property
    def has_abs_matmul(self) -> bool:
        return callable(getattr(self.wrapped, "abs_matmul", None))

    @property
    def attend(self):
        return getattr(self.wrapped, "attend", None)

    @property
    def nonnegative(self) -> bool:
        return _nonnegative_value(getattr(self.wrapped, "nonnegative", False))

    @property
    def rescales_keys(self) -> bool:
        return getattr(self.wrapped, "rescales_keys", False)

    @property
    def attend_reaches_keys(self) -> bool:
        return getattr(self.wrapped, "attend_reaches_keys", False) is True

    @property
    def attend_takes_half(self) -> bool:
        return getattr(self.wrapped, "attend_takes_half", False) is True

    @property
    def no_key_cause(self) -> str | None:
        return getattr(self.wrapped, "no_key_cause", None)

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        fn = getattr(self.wrapped, "key_stabilizer", None)
        return default_key_stabilizer(z) if fn is None else fn(z)

    def row_key_stabilizer(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return _slice_max_of_rows if getattr(self.wrapped, "key_stabilizer", None) is None else None

    def parameters(self) -> list[torch.Tensor]:
        fn = getattr(self.wrapped, "parameters", None)
        return list(fn()) if callable(fn) else default_parameters(self.wrapped)


def _type_name(x: object) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__qualname__}"


def as_operator(obj: object, *, name: str = "mask") -> MaskOperator:
    """``obj`` under the contract: a MaskOperator as it is, a duck-typed one (``n`` and a callable
    ``matmul``) wrapped once in an ``OperatorAdapter``; its n checked to be a positive int.

    Raises TypeError naming ``name`` for an object without n or without a callable matmul, or an
    n that is not an int (NumPy integers are ints here); ValueError for n <= 0. Matrices are
    fast.as_mask_operator's (it calls this for everything else).

    >>> from fast.operator import as_operator
    >>> class User:
    ...     n = 4
    ...     def matmul(self, x):
    ...         return x
    >>> op = as_operator(User())
    >>> as_operator(op) is op, op.n
    (True, 4)
    """
    if isinstance(obj, MaskOperator):
        op = obj
        if not hasattr(op, "n"):  # a subclass that never set self.n
            raise TypeError(f"{name} ({_type_name(obj)}) has no n (the number of tokens N): a MaskOperator "
                            "needs n and matmul")
    else:
        has_n, matmul = hasattr(obj, "n"), getattr(obj, "matmul", None)
        if has_n and matmul is not None and not callable(matmul):
            raise TypeError(f"{name}.matmul must be a method matmul(x) -> M @ x, got {type(matmul).__name__}")
        if not (has_n and matmul is not None):
            if has_n or matmul is not None:
                missing = ("n (the number of tokens N)" if not has_n
                           else "callable matmul(x) returning M @ x for x (..., N, c)")
                raise TypeError(f"{name} ({_type_name(obj)}) has no {missing}: a MaskOperator needs n and matmul")
            raise TypeError(
                f"{name} must be a MaskOperator (with n and matmul), a (..., N, N) tensor or NumPy array, a torch "
                f"sparse tensor or a scipy.sparse matrix; got {_type_name(obj)}")
        op = OperatorAdapter(obj)
    count = op.n
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise TypeError(f"{name}.n must be a positive int (the number of tokens N; NumPy integers are "
                        f"accepted), got {_type_name(count)} {count!r:.40}")
    if count <= 0:
        raise ValueError(f"{name}.n must be a positive integer (the number of tokens N), got {count!r}")
    return op
