"""Dense attention, float64 (choromanski22 Def. 2.1 and Eq. 2).

Shapes: q, k (..., N, d_qk); v (..., N, d); masks (N, N) or broadcastable to (..., N, N).
(Queries may number N_q != N: q (..., N_q, d_qk), masks broadcastable to (..., N_q, N).)

Rows that see no key (the no-key policy, shared with fast/): a query whose mask row is all zero
(masked_kernel_attention) or whose logits_mask row is -inf everywhere (softmax_attention) has no
denominator. no_key="raise" (the default) raises reference.DenominatorError saying so;
no_key="zero" outputs exactly 0 for those rows (what nested/varlen attention users expect).

Both functions build the N_q x N matrix: O(N_q N (d_qk + d)) time, O(N_q N) memory per slice.
"""
from __future__ import annotations

import numpy as np

from reference._checks import no_key_policy, real_array
from reference.budget import check_dense_budget
from reference.errors import DenominatorError


def _operands(names: tuple[str, str, str], arrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check (q, k, v)-like operands: real, at least 2-D, d_qk and N consistent, N >= 1, d_qk >= 1.

    Returns them as float64 arrays. Leading (batch, head) dims must broadcast.
    """
    nq, nk, nv = names
    q, k, v = (real_array(name, a) for name, a in zip(names, arrays))
    for name, a, dims in ((nq, q, "N_q, d_qk"), (nk, k, "N, d_qk"), (nv, v, "N, d")):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., {dims}), got shape {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{nq} and {nk} must share the last dim, got {nq} {q.shape} and {nk} {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{nk} and {nv} must have the same N (one value per key), got {nk} {k.shape} and {nv} {v.shape}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"N must be >= 1 (no queries or no keys: nothing to attend), got {nq} {q.shape} and {nk} {k.shape}")
    if q.shape[-1] == 0:
        raise ValueError(f"{nq} and {nk} must have a last dim >= 1, got {nq} {q.shape} and {nk} {k.shape}")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading (batch, head) dims of {nq} {q.shape}, {nk} {k.shape} and {nv} {v.shape} "
                         f"do not broadcast") from None
    return q, k, v


def _check_mask(name: str, mask: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """mask must broadcast to (..., N_q, N) without changing N_q or N."""
    n_q, n = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    try:
        full = np.broadcast_shapes(mask.shape, batch + (n_q, n))
    except ValueError:
        full = None
    if full is None or full[-2:] != (n_q, n):
        raise ValueError(f"{name} must broadcast to (..., N_q, N) = {batch + (n_q, n)}, got shape {mask.shape}")


def _first(rows: np.ndarray) -> str:
    """Names the first True of rows (..., N_q): "query 2", or "query 2 of batch index (0, 1)"."""
    *batch, i = (int(j) for j in np.argwhere(rows)[0])
    return f"query {i}" + (f" of batch index {tuple(batch)}" if batch else "")


def _no_key_error(what: str, blind: np.ndarray, why: str) -> DenominatorError:
    """The error for rows that see no key; blind (..., N_q) flags them."""
    others = int(blind.sum()) - 1
    more = f" (and {others} more of the {blind.size} query rows)" if others else ""
    return DenominatorError(
        f"{what}: {_first(blind)} sees no key: {why}{more}, so the row has no "
        f'denominator. Pass no_key="zero" to output exactly 0 for such rows, or fix the mask')


def softmax_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, logits_mask: np.ndarray | None = None, *, no_key: str = "raise"
) -> np.ndarray:
    """Att = D^-1 A V, A = exp(logits_mask + Q K^T / sqrt(d_qk)), D = diag(A 1).

    q: (..., N_q, d_qk); k: (..., N, d_qk); v: (..., N, d) -> (..., N_q, d), float64.
    logits_mask: additive float logits broadcastable to (..., N_q, N); -inf excludes a pair (NaN
    and +inf are refused). A query whose logits_mask row is -inf everywhere sees no key:
    no_key="raise" (default) raises DenominatorError, no_key="zero" gives that row exactly 0.

    Raises:
        TypeError: complex or non-numeric input, a non-float logits_mask (a bool mask is not a
            logit: use np.where(mask, 0.0, -np.inf)).
        ValueError: shapes that do not fit, N = 0, a bad logits_mask value, a bad no_key.
        DenominatorError: rows that see no key, with no_key="raise".
        MemoryError: N_q x N logits over the dense budget (reference.budget).

    Dense: O(N_q N (d_qk + d)) time and O(N_q N) memory per leading slice. A causal logits mask
    makes query 0 see key 0 alone:

        >>> import numpy as np
        >>> from reference.attention import softmax_attention
        >>> q, k, v = np.random.default_rng(0).standard_normal((3, 4, 2))
        >>> causal = np.where(np.tril(np.ones((4, 4))) > 0, 0.0, -np.inf)
        >>> out = softmax_attention(q, k, v, causal)
        >>> out.shape, bool(np.allclose(out[0], v[0]))
        ((4, 2), True)
    """
    no_key = no_key_policy(no_key)
    q, k, v = _operands(("q", "k", "v"), (q, k, v))
    if logits_mask is not None:
        raw = np.asarray(logits_mask)
        if raw.dtype.kind != "f":
            raise TypeError(f"logits_mask must be a float array of additive logits (-inf excludes a pair), got "
                            f"dtype {raw.dtype}; for a boolean mask use np.where(mask, 0.0, -np.inf)")
        logits_mask = real_array("logits_mask", raw)
        if np.isnan(logits_mask).any() or np.isposinf(logits_mask).any():
            raise ValueError("logits_mask must hold finite logits or -inf (to exclude a pair), got NaN or +inf")
        _check_mask("logits_mask", logits_mask, q, k, v)
    check_dense_budget(q.shape[-2], "softmax logits", copies=2)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if logits_mask is not None:
        logits = logits + logits_mask
    blind = np.zeros(logits.shape[:-1] + (1,), dtype=bool)  # (..., N_q, 1): rows that see no key
    if logits_mask is not None:
        blind = np.broadcast_to(np.isneginf(logits_mask).all(axis=-1, keepdims=True), blind.shape)
    if blind.any() and no_key == "raise":
        raise _no_key_error("softmax attention", blind[..., 0], "its logits_mask row is -inf everywhere")
    shift = np.where(blind, 0.0, logits.max(axis=-1, keepdims=True))  # row-wise: cancels in D^-1 A
    a = np.exp(logits - shift)  # a blind row: exp(-inf) = 0 everywhere
    den = a.sum(axis=-1, keepdims=True)
    return np.where(blind, 0.0, (a @ v) / np.where(blind, 1.0, den))


def masked_kernel_attention(
    phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *, no_key: str = "raise"
) -> np.ndarray:
    """Masked kernel attention with the feature kernel (choromanski22 Eq. 2, Algorithm 1 identity).

    out_i = sum_j M_ij (phi_q_i . phi_k_j) v_j / sum_j M_ij (phi_q_i . phi_k_j).

    phi_q: (..., N_q, m); phi_k: (..., N, m); v: (..., N, d) -> (..., N_q, d), float64.
    mask: real, finite, broadcastable to (..., N_q, N), or None for all ones.
    This is the obviously right O(N^2 m) form that fast.masked_linear_attention must equal.

    A query whose mask row is all zero sees no key: no_key="raise" (default) raises
    DenominatorError, no_key="zero" gives that row exactly 0. A row that does see keys but whose
    masked kernel sums to exactly 0 (phi_q_i . phi_k_j = 0 on every visible key, or signed terms
    that cancel) raises DenominatorError whatever no_key says.

    Raises:
        TypeError: complex or non-numeric input.
        ValueError: shapes that do not fit, N = 0, a non-finite mask, a bad no_key.
        DenominatorError: as above.
        MemoryError: the N_q x N kernel matrix over the dense budget (reference.budget).

    Dense: O(N_q N (m + d)) time and O(N_q N) memory per leading slice. The identity mask makes
    every query see only its own key, so the output is v; a row of zeros is a row without keys:

        >>> import numpy as np
        >>> from reference.attention import masked_kernel_attention
        >>> rng = np.random.default_rng(0)
        >>> phi_q, phi_k, v = rng.random((4, 3)), rng.random((4, 3)), rng.standard_normal((4, 2))
        >>> bool(np.allclose(masked_kernel_attention(phi_q, phi_k, v, np.eye(4)), v))
        True
        >>> masked_kernel_attention(phi_q, phi_k, v, np.zeros((4, 4)), no_key="zero").tolist()[0]
        [0.0, 0.0]
    """
    no_key = no_key_policy(no_key)
    phi_q, phi_k, v = _operands(("phi_q", "phi_k", "v"), (phi_q, phi_k, v))
    if mask is not None:
        mask = real_array("mask", mask, finite=True)
        _check_mask("mask", mask, phi_q, phi_k, v)
    check_dense_budget(phi_q.shape[-2], "masked kernel matrix", copies=2)
    a = phi_q @ np.swapaxes(phi_k, -1, -2)
    blind = np.zeros(a.shape[:-1] + (1,), dtype=bool)  # (..., N_q, 1): rows that see no key
    if mask is not None:
        a = a * mask  # Hadamard product, never a matrix product
        blind = np.broadcast_to((mask == 0).all(axis=-1, keepdims=True), a.shape[:-1] + (1,))
    den = a.sum(axis=-1, keepdims=True)
    if blind.any() and no_key == "raise":
        raise _no_key_error("masked kernel attention", blind[..., 0], "its mask row is all zero")
    vanished = (den == 0) & ~blind
    if vanished.any():
        raise DenominatorError(
            f"masked kernel attention: {int(vanished.sum())} query rows see keys but their masked kernel sums "
            f"to exactly 0 (the first is {_first(vanished[..., 0])}): the features give every "
            f"visible key zero weight (phi_q_i . phi_k_j = 0, e.g. phi_q_i = 0) or signed terms cancel. "
            f"no_key does not apply: these rows do see keys")
    return np.where(blind, 0.0, (a @ v) / np.where(blind, 1.0, den))
