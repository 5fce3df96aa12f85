"""Argument checks shared by reference/: each error names the argument, what was expected and
what came. Kept deliberately small; the functions that use them stay obviously right."""
from __future__ import annotations

import numbers
import operator

import numpy as np

#: The values of the ``no_key`` keyword of the attention functions (the no-key policy).
NO_KEY_POLICIES = ("raise", "zero")


def describe(x) -> str:
    """A short description of what came: type, and dtype/shape for arrays."""
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return f"{type(x).__name__} {x!r:.80}"


def integer(name: str, x, minimum: int | None = 1) -> int:
    """x as a Python int. Refuses bool, float (even 4.0: no silent truncation), str, ... with
    TypeError, and x < minimum with ValueError."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {x!r}")
    try:
        value = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {describe(x)}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def real_scalar(name: str, x) -> float:
    """x as a float: a real number (int, float, NumPy scalar or 0-d array), not bool, complex or str."""
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iuf":
        x = x[()]
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {describe(x)}")
    return float(x)


def real_array(name: str, x, *, finite: bool = False) -> np.ndarray:
    """x as a float64 array. Complex input is refused (TypeError) rather than made real with a
    warning; so are non-numeric dtypes (str, object). finite=True also refuses NaN and +-inf."""
    a = np.asarray(x)
    if a.dtype.kind == "c":
        raise TypeError(f"{name} must be real, got complex input (dtype {a.dtype}); pass the real part "
                        f"explicitly if that is what you mean")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array, got {describe(a)}")
    a = a.astype(np.float64, copy=False)
    if finite and not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return a


def generator(name: str, rng) -> np.random.Generator:
    """A numpy.random.Generator, nothing else: None (OS entropy) would make a draw irreproducible,
    and an int seed or the legacy RandomState hide where the randomness comes from."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name} must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), "
                        f"got {describe(rng)}")
    return rng


def no_key_policy(no_key) -> str:
    """The no-key policy: "raise" or "zero" (ValueError naming no_key otherwise)."""
    if not isinstance(no_key, str) or no_key not in NO_KEY_POLICIES:
        raise ValueError(f'no_key must be "raise" or "zero", got {no_key!r}')
    return no_key


def function_values(name: str, values, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The values a user callable ``name`` returned for arguments of ``shape`` (``what`` says which),
    as a writable float64 array of that shape: a scalar broadcasts; a wrong shape, complex or
    non-numeric values (TypeError) and NaN or inf (ValueError) are refused, naming the callable."""
    v = np.asarray(values)
    if v.dtype.kind == "c" or v.dtype.kind not in "biuf":
        raise TypeError(f"{name} must return real numbers for {what}, got {describe(v)}")
    try:
        v = np.array(np.broadcast_to(v, shape), dtype=np.float64)
    except ValueError:
        raise ValueError(f"{name} must return one value per entry of {what} (shape {shape}) or a scalar, "
                         f"got shape {v.shape}") from None
    bad = ~np.isfinite(v)
    if bad.any():
        raise ValueError(f"{name} returned non-finite values (NaN or inf) for {int(bad.sum())} of {v.size} "
                         f"entries of {what}")
    return v
