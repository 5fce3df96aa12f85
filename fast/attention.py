"""Attention drivers: dense softmax, linear (choromanski22 Eq. 3) and masked linear (Algorithm 1).

Shapes: q, k (..., N, d_qk); v (..., N, d); features phi_q, phi_k (..., N, m); leading dims are
batch and heads and must agree between the arguments. The building blocks of Algorithm 1 (the
blocked numerator, block sizing, the guarded division, the memory-saving autograd Function) live
in fast.algebra, below the masks; the mask contract in fast.masks.base.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fast.algebra import (DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_COLS, blocked_numerator, default_block_cols, divide,
                          features_per_block, masked_products)
from fast.errors import DenominatorError
from fast.features import FavorPlus
from fast.masks.base import attend_of, key_stabilizer_of
from fast.masks.explicit import as_mask_operator
from fast.validation import check_positive_int, check_same_device, check_tensor, compute_dtype

# DenominatorError, DEFAULT_BLOCK_COLS, DEFAULT_BLOCK_BYTES and blocked_numerator are re-exported:
# they used to live here
__all__ = ["softmax_attention", "masked_linear_attention", "linear_attention", "favor_attention", "favor_features",
           "DenominatorError",
           "DEFAULT_BLOCK_COLS", "DEFAULT_BLOCK_BYTES", "blocked_numerator"]


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logits_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Dense softmax attention D^-1 exp(logits_mask + Q K^T / sqrt(d_qk)) V (choromanski22 Def. 2.1).

    q, k: (..., N, d_qk); v: (..., N, d); logits_mask: additive, broadcastable to (..., N, N),
    -inf excludes a pair. O(N^2): the quadratic baseline. Uses torch's scaled_dot_product_attention.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    check_same_device(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_qk, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same N, got {k.shape[-2]} and {v.shape[-2]}")
    if logits_mask is not None:
        if not isinstance(logits_mask, torch.Tensor) or not logits_mask.is_floating_point():
            raise TypeError("logits_mask must be a floating tensor of additive logits (use -inf to exclude)")
        logits_mask = logits_mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=logits_mask)


def _check_features(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> None:
    check_tensor("phi_q", phi_q)
    check_tensor("phi_k", phi_k)
    check_tensor("v", v)
    check_same_device(phi_q=phi_q, phi_k=phi_k, v=v)
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(f"phi_q and phi_k must have the same feature width m, got {phi_q.shape[-1]} and {phi_k.shape[-1]}")
    if phi_k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"phi_k (..., N, m) and v (..., N, d) must share leading dims and N, got {tuple(phi_k.shape)} and {tuple(v.shape)}")
    if phi_q.shape[:-2] != phi_k.shape[:-2]:
        raise ValueError(f"phi_q and phi_k must share leading (batch, head) dims, got {tuple(phi_q.shape)} and {tuple(phi_k.shape)}")


def masked_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    mask: object = None,
    *,
    block_cols: int | None = None,
) -> torch.Tensor:
    """Masked linear attention, choromanski22 Algorithm 1.

        out_i = phi_q_i^T sum_j M_ij phi_k_j v_j^T / phi_q_i^T sum_j M_ij phi_k_j

    phi_q: (..., N_q, m); phi_k: (..., N, m); v: (..., N, d) -> (..., N_q, d), input dtype.

    mask: None, or anything ``fast.as_mask_operator`` accepts (a MaskOperator, a dense (N, N) or
    (..., N, N) tensor or NumPy array, a torch sparse tensor, a scipy.sparse matrix).
    mask=None: unmasked linear attention (Eq. 3), two GEMMs, O(N m d); N_q may differ from N.
    An operator whose ``attend`` is not None: that specialised form (e.g. the chunked causal scan).
    Otherwise the generic path (fast.algebra.masked_products): D1 = M [vec(phi_k_j v_j^T)] is
    applied to column blocks of about ``block_cols`` columns and contracted with phi_q at once, so
    peak extra memory is O(N (m + d) + N block_cols), never O(N m d); D2 = M phi_k gives the
    denominator. Cost O((T_M(N) + N) m d) (Lemma 3.1). block_cols=None picks it from N: at most
    DEFAULT_BLOCK_COLS, and one block within DEFAULT_BLOCK_BYTES (64 columns at N = 2^20 in
    float32), at least d. Under autograd the generic path saves only phi_q, phi_k, v and
    recomputes the blocks in backward, one at a time (training memory O(N (m + d)) as well);
    gradients reach the mask's parameters().

    float16/bfloat16 inputs accumulate in float32 and are cast back.

    Raises:
        DenominatorError: a denominator is 0 or not finite (reported, never divided by).
        TypeError / ValueError: bad inputs, naming the argument (``mask`` for the mask).
    """
    _check_features(phi_q, phi_k, v)
    if block_cols is not None:
        check_positive_int("block_cols", block_cols)
    op = None if mask is None else as_mask_operator(mask)
    out_dtype = v.dtype
    work = compute_dtype(torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype))
    phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)

    if op is None:
        kv = phi_k.transpose(-1, -2) @ v  # (..., m, d)
        num = phi_q @ kv
        den = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
        return divide(num, den.squeeze(-1)).to(out_dtype)

    n = phi_k.shape[-2]
    if op.n != n or phi_q.shape[-2] != n:
        raise ValueError(f"mask is for N={op.n} tokens but phi_q, phi_k have N={phi_q.shape[-2]}, {n}")
    attend = attend_of(op)
    if attend is not None:
        num, den = _check_attend(op, attend(phi_q, phi_k, v), v)
        return divide(num, den).to(out_dtype)

    fpb = features_per_block(default_block_cols(v) if block_cols is None else block_cols, v.shape[-1])
    num, den = masked_products(phi_q, phi_k, v, op, fpb)
    return divide(num, den).to(out_dtype)


def _check_attend(op: object, result: object, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mask.attend must return (num (..., N, d), den (..., N)) with matching leading dims."""
    n, d = v.shape[-2], v.shape[-1]
    ok = isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result)
    if ok:
        num, den = result
        ok = num.dim() >= 2 and tuple(num.shape[-2:]) == (n, d) and tuple(den.shape) == tuple(num.shape[:-1])
    if not ok:
        got = (tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in result)
               if isinstance(result, tuple) else type(result).__name__)
        raise ValueError(f"mask.attend must return (num (..., {n}, {d}), den (..., {n})) with the same leading dims, "
                         f"got {got} (mask is {type(op).__name__})")
    return result


def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked linear attention D^-1 (Q' (K'^T V)) (choromanski22 Eq. 3), O(N m d)."""
    return masked_linear_attention(phi_q, phi_k, v, mask=None)


def favor_features(
    q: torch.Tensor,
    k: torch.Tensor,
    projection: torch.Tensor,
    mask: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The features favor_attention feeds to masked_linear_attention: (phi_q, phi_k).

    Stabilised FAVOR+ (fast.FavorPlus(projection, stabilize=True)) of q / d_qk^(1/4) and
    k / d_qk^(1/4), so that phi_q_i . phi_k_j estimates exp(q_i . k_j / sqrt(d_qk)) up to
    constants that cancel in the masked attention ratio: a per-query one, and the keys' ones
    from the mask operator's ``key_stabilizer`` (fast.masks.base: the per-(batch, head) max by
    default; padding and packing override it so that keys the mask hides never set the scale);
    mask=None: FavorPlus's own per-(batch, head) max. The mask is only read for its stabiliser
    here (the masking is masked_linear_attention's).

    q: (..., N_q, d_qk); k: (..., N, d_qk); projection W: (m, d_qk); mask: None or anything
    ``fast.as_mask_operator`` accepts -> phi_q (..., N_q, m), phi_k (..., N, m), in q's / k's
    dtype. Differentiable in q and k.
    """
    _check_favor_inputs(q, k, projection)
    return _favor_features(q, k, projection, None if mask is None else as_mask_operator(mask))


def _check_favor_inputs(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor) -> None:
    check_tensor("q", q)
    check_tensor("k", k)
    check_tensor("projection", projection)
    check_same_device(q=q, k=k, projection=projection)


def _favor_features(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor,
                    op: object) -> tuple[torch.Tensor, torch.Tensor]:
    """favor_features on checked inputs and an operator (or None): one place for the construction."""
    fmap = FavorPlus(projection, stabilize=True)
    scale = q.shape[-1] ** -0.25
    stabilizer = None if op is None else key_stabilizer_of(op)  # None: FavorPlus's own per-slice max
    return fmap(q * scale, is_query=True), fmap(k * scale, is_query=False, key_stabilizer=stabilizer)


def favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    mask: object = None,
) -> torch.Tensor:
    """Performer softmax-kernel attention with an optional mask operator.

    masked_linear_attention(*favor_features(q, k, projection, mask), v, mask): stabilised FAVOR+
    of q / d_qk^(1/4) and k / d_qk^(1/4) with W = ``projection`` (m, d_qk), so the estimated
    kernel is exp(q.k / sqrt(d_qk)). mask: None or anything ``fast.as_mask_operator`` accepts.
    The keys' stabiliser is the operator's ``key_stabilizer`` (fast.masks.base: the
    per-(batch, head) max by default; padding and packing override it so that keys the mask
    hides never set the scale). For CausalMask the default is the only exact choice (each query
    sees a different prefix): a future key with a far larger FAVOR+ exponent than the past can
    underflow early keys (float64 needs exponents ~700 apart; this is then reported as
    DenominatorError, never a NaN).
    q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d).
    """
    _check_favor_inputs(q, k, projection)  # once: favor_features would check them again
    op = None if mask is None else as_mask_operator(mask)
    phi_q, phi_k = _favor_features(q, k, projection, op)
    return masked_linear_attention(phi_q, phi_k, v, op)
