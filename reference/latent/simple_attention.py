"""Simple attention with Frobenius-normalised queries and keys (DIFFormer, SGFormer), dense float64.

Shapes: q, k (..., N, d_qk); v (..., N, d) -> (..., N, d); leading dims (batch, heads) equal in
q, k and v. batch: None (one graph) or an integer array (N,), sorted nondecreasing (PyG
convention), labels >= 0; the block-diagonal mask same[u, w] = batch[u] == batch[w]. Both are
dense attention with the masked score matrix M = same * (1 + q~ k~^T) (docs/papers.md Sec. 4),
q~ and k~ normalised per graph by ``frobenius_normalize``: O(N^2 d), the obviously right form
the fast O(N d^2) path must equal.
"""
from __future__ import annotations

import numpy as np

from reference._checks import describe, real_array
from reference.budget import check_dense_budget
from reference.errors import DenominatorError

__all__ = ["frobenius_normalize", "difformer_attention", "sgformer_attention"]


def _batch(batch, n: int) -> np.ndarray:
    """The batch vector as an int64 array (N,) (all zeros for None), checked: integer, shape (N,),
    labels >= 0, sorted (ValueError / TypeError naming batch)."""
    if batch is None:
        return np.zeros(n, dtype=np.int64)
    b = np.asarray(batch)
    if b.dtype.kind not in "iu":
        raise TypeError(f"batch must be an integer array of graph labels, got {describe(b)}")
    if b.shape != (n,):
        raise ValueError(f"batch has {b.size} entries (shape {b.shape}) but the inputs have N = {n} nodes")
    b = b.astype(np.int64)
    if n and b.min() < 0:
        raise ValueError(f"batch must hold graph labels >= 0, got {int(b.min())}")
    down = np.flatnonzero(b[1:] < b[:-1])
    if down.size:
        i = int(down[0]) + 1
        raise ValueError(f"batch must be sorted (PyG convention: each graph's nodes are contiguous); "
                         f"batch[{i}] = {b[i]} follows batch[{i - 1}] = {b[i - 1]}")
    return b


def _array(name: str, x) -> np.ndarray:
    a = real_array(name, x, finite=True)
    if a.ndim < 2 or a.shape[-2] == 0 or a.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (..., N, features) with N >= 1 and features >= 1, got {a.shape}")
    return a


def _joint(ndim: int, joint_heads) -> bool:
    """Whether the norm spans axis -3 (frobenius_normalize's doc): None -> ndim >= 4, True -> ndim >= 3, False -> no."""
    if joint_heads is None:
        return ndim >= 4
    if not isinstance(joint_heads, bool):
        raise TypeError(f"joint_heads must be None, True or False, got {joint_heads!r}")
    return bool(joint_heads) and ndim >= 3


def frobenius_normalize(x, *, batch=None, joint_heads: bool | None = None) -> np.ndarray:
    """x / ||x_g||_F per graph g; x (..., N, c) -> the same shape, float64. A graph whose x is all
    zero gives 0 (the limit the fast path uses).

    The norm runs over the graph's nodes and features, and over the head axis -3 too when that
    axis holds heads: joint_heads=None (default) when ndim >= 4 ((*batch, H, N, c)); True when
    ndim >= 3 (a 3-D (H, N, c) read as heads); False never (per leading slice). A 3-D input with
    the default is (B, N, c): one norm per sample, samples never share a norm.

    Raises TypeError for complex input or a joint_heads that is not None or a bool, ValueError
    for non-finite input or an empty N or c, and as the batch checks (module doc). O(N c) per slice.

        >>> import numpy as np
        >>> from reference.latent.simple_attention import frobenius_normalize
        >>> frobenius_normalize(np.array([[3.0], [4.0], [0.0]]), batch=np.array([0, 0, 1])).ravel().tolist()
        [0.6, 0.8, 0.0]
    """
    x = _array("x", x)
    b = _batch(batch, x.shape[-2])
    joint = _joint(x.ndim, joint_heads)
    out = np.zeros_like(x)
    for g in np.unique(b):
        rows = b == g
        part = x[..., rows, :]
        axes = (-3, -2, -1) if joint else (-2, -1)
        norm = np.sqrt((part ** 2).sum(axis=axes, keepdims=True))
        out[..., rows, :] = np.where(norm > 0, part / np.where(norm > 0, norm, 1.0), 0.0)
    return out


def _simple(q, k, v, batch, joint_heads, own_value: bool, what: str) -> np.ndarray:
    q, k, v = _array("q", q), _array("k", k), _array("v", v)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., N, d_qk), got q {q.shape} and k {k.shape}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v must have shape (..., N, d) with the leading dims and N of q {q.shape[:-1]}, got v {v.shape}")
    n = q.shape[-2]
    b = _batch(batch, n)
    _joint(q.ndim, joint_heads)  # a bad joint_heads is refused before the dense work
    check_dense_budget(n, f"{what} score matrix", copies=3)
    same = (b[:, None] == b[None, :]).astype(np.float64)  # (N, N) block diagonal
    sizes = same.sum(axis=-1)[:, None]  # (N, 1): N_g of each node's graph
    qn = frobenius_normalize(q, batch=b, joint_heads=joint_heads)
    kn = frobenius_normalize(k, batch=b, joint_heads=joint_heads)
    dots = same * (qn @ np.swapaxes(kn, -1, -2))  # (..., N, N): q~_u . k~_w within each graph
    scores = same + dots  # the masked score matrix M = same * (1 + q~ k~^T)
    den = scores.sum(axis=-1, keepdims=True)
    num = scores @ v if not own_value else sizes * v + dots @ v
    # den >= N_g - sqrt(N_g) (Cauchy-Schwarz): it vanishes only on a one-node graph with q~ . k~ = -1,
    # and a den within float64 round-off of the terms it sums (<= 2 N_g) is no denominator either
    vanished = den <= 64 * np.finfo(np.float64).eps * 2 * sizes
    if vanished.any():
        first = tuple(int(i) for i in np.argwhere(vanished[..., 0])[0])
        raise DenominatorError(f"{what}: the denominator N_g + q~_u . sum_w k~_w is zero (to float64 round-off) at "
                               f"(leading index, node) {first}: a one-node graph whose q is a negative multiple "
                               f"of its k")
    return num / den


def difformer_attention(q, k, v, *, batch=None, joint_heads: bool | None = None) -> np.ndarray:
    """z_u = (sum_{w in g} v_w + q~_u . sum_{w in g} k~_w v_w^T) / (N_g + q~_u . sum_{w in g} k~_w), dense
    (the tutorial's DIFFormer formula): sum_w M_uw v_w / sum_w M_uw, (..., N, d).

    Raises TypeError/ValueError for bad inputs (as frobenius_normalize; q and k of different
    shapes, a v whose leading dims and N differ); reference.DenominatorError when a denominator is
    zero to float64 round-off (only a one-node graph whose q is a negative multiple of its k:
    otherwise den >= N_g - sqrt(N_g) > 0); MemoryError over the dense budget. O(N^2 (d_qk + d)).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3))
        >>> from reference.latent.simple_attention import difformer_attention
        >>> z = difformer_attention(q, k, v, batch=np.array([0, 0, 0, 1]))
        >>> z.shape, bool(np.allclose(z[3], v[3]))  # a one-node graph attends to itself
        ((4, 3), True)
    """
    return _simple(q, k, v, batch, joint_heads, own_value=False, what="difformer_attention")


def sgformer_attention(q, k, v, *, batch=None, joint_heads: bool | None = None) -> np.ndarray:
    """z_u = (N_g v_u + q~_u . sum_{w in g} k~_w v_w^T) / (N_g + q~_u . sum_{w in g} k~_w), dense
    (SGFormer: the constant term is the node's own value), (..., N, d).

    Raises as difformer_attention. O(N^2 (d_qk + d)).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3))
        >>> from reference.latent.simple_attention import sgformer_attention
        >>> z = sgformer_attention(q, np.zeros((4, 2)), v)  # k~ = 0: no score term, z = v
        >>> z.shape, bool(np.allclose(z, v))
        ((4, 3), True)
    """
    return _simple(q, k, v, batch, joint_heads, own_value=True, what="sgformer_attention")
