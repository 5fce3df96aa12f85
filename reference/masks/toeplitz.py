"""Relative-position masks, dense: 1-D Toeplitz and d-D block-Toeplitz (choromanski22 Sec. 3.2).

Offsets run query minus key: M_ij = xi(i - j). A coefficient vector for N tokens has 2N - 1
entries, ``coeffs[k] = xi(k - (N - 1))``, i.e. offsets -(N-1), ..., 0, ..., N-1 in that order;
negative offsets are keys AFTER the query (xi = 0 there gives a causal mask).

On an n_1 x ... x n_d grid (row-major node order) the offset is a vector delta = x - y and the
table has shape (2 n_1 - 1, ..., 2 n_d - 1) with ``table[delta + (n - 1)] = f(delta)``.
With that order M is d-level block-Toeplitz (Lemma 3.3).

Attention needs M >= 0 (a weighted average). Masks given in log space (M = exp(b), as in
Luo et al. 2021 and the ViT experiments) are positive by construction. The dense masks cost
O(N^2) (O(d N^2) on a d-D grid); the fast side applies them by FFT.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from reference._checks import describe, function_values, integer, real_array
from reference.budget import check_dense_budget


def _finite(name: str, a: np.ndarray) -> np.ndarray:
    return real_array(name, a, finite=True)


def _callable(name: str, f) -> None:
    if not callable(f):
        raise TypeError(f"{name} must be a callable on an int array of distances, got {describe(f)}")


def check_grid_shape(shape) -> tuple[int, ...]:
    """A grid shape (n_1, ..., n_d) as a tuple of Python ints: a non-empty sequence of positive ints
    (a float side such as 2.5 or 2.0 is refused with TypeError, never truncated; a string or a
    non-sequence too). ValueError, naming shape, for an empty shape or a side <= 0. O(d).

        >>> from reference.masks.toeplitz import check_grid_shape
        >>> check_grid_shape([2, 3])
        (2, 3)
    """
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        sides = list(shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of positive ints (n_1, ..., n_d), got {shape!r}") from None
    shape = tuple(integer(f"shape[{i}]", s, minimum=None) for i, s in enumerate(sides))
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"shape must be a non-empty tuple of positive ints (an empty grid has no nodes), got {shape}")
    return shape


def toeplitz_mask(coeffs: np.ndarray) -> np.ndarray:
    """M_ij = xi(i - j) from coeffs (2N - 1,) over offsets -(N-1)..N-1 -> (N, N) float64, a Toeplitz
    matrix (choromanski22 Sec. 3.2; the fast side applies it by FFT).

    Raises TypeError for complex or non-numeric coeffs, ValueError for non-finite coeffs or a shape
    that is not (2N - 1,), MemoryError over the dense budget. O(N^2).

        >>> from reference.masks.toeplitz import toeplitz_mask
        >>> toeplitz_mask([0.0, 0.0, 1.0, 2.0, 3.0]).tolist()  # xi(-2..2): zero above: causal
        [[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [3.0, 2.0, 1.0]]
    """
    c = _finite("coeffs", coeffs)
    if c.ndim != 1 or c.size % 2 != 1:
        raise ValueError(f"coeffs must have shape (2N - 1,) for offsets -(N-1)..N-1, got {c.shape}")
    n = (c.size + 1) // 2
    check_dense_budget(n, "Toeplitz mask")
    i = np.arange(n)
    return c[i[:, None] - i[None, :] + n - 1]


def symmetric_coefficients(f: Callable[[np.ndarray], np.ndarray], n: int) -> np.ndarray:
    """coeffs (2n - 1,) float64 of M_ij = f(|i - j|), the input of ``toeplitz_mask``; f maps an int
    array of distances to finite real numbers (one per distance, or a scalar); n an int >= 1.

    Raises TypeError for a non-callable f, a non-int n or complex values; ValueError for n < 1, a
    wrong number of values or NaN/inf, naming f. O(n) plus f's cost.

        >>> from reference.masks.toeplitz import symmetric_coefficients
        >>> symmetric_coefficients(lambda d: 0.5 ** d, 3).tolist()
        [0.25, 0.5, 1.0, 0.5, 0.25]
    """
    _callable("f", f)
    n = integer("n", n)
    d = np.abs(np.arange(-(n - 1), n))
    return function_values("f", f(d), d.shape, "the distances |i - j|")


def grid_offsets(shape: tuple[int, ...]) -> np.ndarray:
    """Offset vectors delta of a table for ``shape``: (2 n_1 - 1, ..., 2 n_d - 1, d) ints, entry
    [delta + (n - 1)] holding delta (the index order of the tables of ``block_toeplitz_mask``).

    Raises as check_grid_shape. O(d prod(2 n_k - 1)).

        >>> from reference.masks.toeplitz import grid_offsets
        >>> grid_offsets((2,)).tolist(), grid_offsets((2, 3)).shape
        ([[-1], [0], [1]], (3, 5, 2))
    """
    shape = check_grid_shape(shape)
    axes = [np.arange(-(n - 1), n) for n in shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)


def l1_table(f: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """Table (2 n_1 - 1, ..., 2 n_d - 1) float64 of M_xy = f(|x - y|_1), the L1 grid distance, for
    ``shape`` (choromanski22 Lemma 3.3's example); f maps an int array of distances to finite reals.

    Raises TypeError for a non-callable f and as check_grid_shape; ValueError for a wrong number
    of values or NaN/inf, naming f. O(d prod(2 n_k - 1)) plus f's cost.

        >>> from reference.masks.toeplitz import l1_table
        >>> l1_table(lambda d: d, (2, 2)).tolist()
        [[2.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 2.0]]
    """
    _callable("f", f)
    dist = np.abs(grid_offsets(shape)).sum(-1)
    return function_values("f", f(dist), dist.shape, "the L1 grid distances")


def grid_coordinates(shape: tuple[int, ...]) -> np.ndarray:
    """Row-major coordinates of the grid's nodes: (prod(shape), d) ints (node k at row k). Raises as
    check_grid_shape. O(d prod(shape)).

        >>> from reference.masks.toeplitz import grid_coordinates
        >>> grid_coordinates((2, 2)).tolist()
        [[0, 0], [0, 1], [1, 0], [1, 1]]
    """
    shape = check_grid_shape(shape)
    return np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape), axis=-1)


def block_toeplitz_mask(shape: tuple[int, ...], table: np.ndarray, cls_token: bool = False,
                        n: int | None = None) -> np.ndarray:
    """M_xy = table[x - y + (n - 1)] on the grid ``shape`` in row-major order -> (N, N), N = prod(shape).

    table: (2 n_1 - 1, ..., 2 n_d - 1). cls_token=True prepends one token (index 0, the vision
    CLS token) that attends to and is attended by every token with weight 1: (N + 1, N + 1).
    n (optional): the expected matrix size; a shape whose product does not give it is refused.
    In row-major order M is d-level block-Toeplitz (choromanski22 Lemma 3.3).

    Raises TypeError for a non-bool cls_token, a non-int n, a bad shape or a complex table;
    ValueError for a table of the wrong shape or with NaN/inf, an n that does not match;
    MemoryError over the dense budget. O(d N^2).

        >>> from reference.masks.toeplitz import block_toeplitz_mask, l1_table
        >>> table = l1_table(lambda d: 0.5 ** d, (2, 2))
        >>> block_toeplitz_mask((2, 2), table)[0].tolist()
        [1.0, 0.5, 0.5, 0.25]
        >>> block_toeplitz_mask((2, 2), table, cls_token=True).shape
        (5, 5)
    """
    shape = check_grid_shape(shape)
    if not isinstance(cls_token, (bool, np.bool_)):
        raise TypeError(f"cls_token must be a bool, got {describe(cls_token)}")
    if n is not None:
        n = integer("n", n)
    t = _finite("table", table)
    want = tuple(2 * n - 1 for n in shape)
    if t.shape != want:
        raise ValueError(f"table must have shape {want} (2 n_k - 1 offsets per axis) for grid {shape}, got {t.shape}")
    if n is not None and n != int(np.prod(shape)) + int(cls_token):
        raise ValueError(f"grid shape {shape} gives {int(np.prod(shape)) + int(cls_token)} tokens"
                         f"{' (with CLS)' if cls_token else ''}, but n={n!r}")
    n = int(np.prod(shape))
    check_dense_budget(n + int(cls_token), "block-Toeplitz mask")
    x = grid_coordinates(shape)
    delta = x[:, None, :] - x[None, :, :] + np.asarray(shape) - 1  # (N, N, d)
    m = t[tuple(np.moveaxis(delta, -1, 0))]
    if cls_token:
        full = np.ones((n + 1, n + 1))
        full[1:, 1:] = m
        m = full
    return m
