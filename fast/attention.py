"""Attention drivers: dense softmax, linear (choromanski22 Eq. 3) and masked linear (Algorithm 1).

Shapes: q, k (..., N, d_qk); v (..., N, d); features phi_q, phi_k (..., N, m); leading dims are
batch and heads and must agree between the arguments.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from fast.errors import DenominatorError
from fast.features import FavorPlus
from fast.masks.base import MaskOperator
from fast.validation import check_positive_int, check_same_device, check_tensor, compute_dtype

#: Most columns of [vec(phi_k v^T)] pushed through the mask at once: peak extra memory of the
#: generic path is O(N * block_cols).
DEFAULT_BLOCK_COLS = 256
#: block_cols=None: as many columns as keep one block of (..., N, cols) within this many bytes
#: (a mask's matmul makes a few copies of it), between d and DEFAULT_BLOCK_COLS.
DEFAULT_BLOCK_BYTES = 256 * 2**20


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


def _divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    bad = (den == 0) | ~torch.isfinite(den)
    if bool(bad.any()):
        raise DenominatorError(
            f"attention denominator vanished or is not finite at {int(bad.sum())} of {den.numel()} "
            "query positions (every key masked out, features underflowing, or a non-positive mask)"
        )
    return num / den.unsqueeze(-1)


def masked_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskOperator | None = None,
    *,
    block_cols: int | None = None,
) -> torch.Tensor:
    """Masked linear attention, choromanski22 Algorithm 1.

        out_i = phi_q_i^T sum_j M_ij phi_k_j v_j^T / phi_q_i^T sum_j M_ij phi_k_j

    phi_q: (..., N_q, m); phi_k: (..., N, m); v: (..., N, d) -> (..., N_q, d), input dtype.

    mask=None: unmasked linear attention (Eq. 3), two GEMMs, O(N m d); N_q may differ from N.
    mask with ``attend``: that specialised form (e.g. the chunked causal scan).
    Otherwise: D1 = M [vec(phi_k_j v_j^T)] is applied to column blocks of about ``block_cols``
    columns and contracted with phi_q at once, so peak extra memory is O(N (m + d) + N block_cols),
    never O(N m d); D2 = M phi_k gives the denominator. Cost O((T_M(N) + N) m d) (Lemma 3.1).
    block_cols=None picks it from N: at most DEFAULT_BLOCK_COLS, and one block within
    DEFAULT_BLOCK_BYTES (64 columns at N = 2^20 in float32), at least d.

    float16/bfloat16 inputs accumulate in float32 and are cast back.

    Raises:
        DenominatorError: a denominator is 0 or not finite (reported, never divided by).
    """
    _check_features(phi_q, phi_k, v)
    if block_cols is not None:
        check_positive_int("block_cols", block_cols)
    out_dtype = v.dtype
    work = compute_dtype(torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype))
    phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)

    if mask is None:
        kv = phi_k.transpose(-1, -2) @ v  # (..., m, d)
        num = phi_q @ kv
        den = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
        return _divide(num, den.squeeze(-1)).to(out_dtype)

    n = phi_k.shape[-2]
    if getattr(mask, "n", None) != n or phi_q.shape[-2] != n:
        raise ValueError(f"mask is for N={getattr(mask, 'n', None)} tokens but phi_q, phi_k have N={phi_q.shape[-2]}, {n}")
    if hasattr(mask, "attend"):
        num, den = mask.attend(phi_q, phi_k, v)
        return _divide(num, den).to(out_dtype)

    if block_cols is None:
        rows = v.numel() // v.shape[-1]  # batch x N
        block_cols = min(DEFAULT_BLOCK_COLS, max(v.shape[-1], DEFAULT_BLOCK_BYTES // (rows * v.element_size())))
    den = (phi_q * mask.matmul(phi_k)).sum(-1)
    num = blocked_numerator(phi_q, phi_k, v, mask.matmul, max(1, block_cols // v.shape[-1]))
    return _divide(num, den).to(out_dtype)


def blocked_numerator(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, matmul, features_per_block: int) -> torch.Tensor:
    """Algorithm 1's numerator phi_q_i^T devec(D1_i), D1 = M [vec(phi_k_j v_j^T)], in feature blocks.

    phi_q, phi_k: (..., N, m); v: (..., N, d); matmul(x) = M @ x for x (..., N, c) -> (..., N, d).
    Each block pushes ``features_per_block * d`` columns through the mask at once and contracts
    them with phi_q immediately, so the O(N m d) matrix D1 never exists whole.
    """
    m, d = phi_k.shape[-1], v.shape[-1]
    num = torch.zeros_like(v)
    for a in range(0, m, features_per_block):
        b = min(m, a + features_per_block)
        cols = (phi_k[..., a:b, None] * v[..., None, :]).flatten(-2)  # (..., N, (b-a) d)
        mixed = matmul(cols).unflatten(-1, (b - a, d))
        num = num + torch.einsum("...nk,...nkd->...nd", phi_q[..., a:b], mixed)
    return num


def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked linear attention D^-1 (Q' (K'^T V)) (choromanski22 Eq. 3), O(N m d)."""
    return masked_linear_attention(phi_q, phi_k, v, mask=None)


def favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    mask: MaskOperator | None = None,
) -> torch.Tensor:
    """Performer softmax-kernel attention with an optional mask operator.

    Feeds q / d_qk^(1/4) and k / d_qk^(1/4) to stabilised FAVOR+ with W = ``projection`` (m, d_qk),
    so the estimated kernel is exp(q.k / sqrt(d_qk)), then masked_linear_attention. The keys'
    stabiliser is the mask's ``key_stabilizer`` where it has one (padding, packing), so keys the
    mask hides never set the scale. CausalMask has none yet: a future key with a far larger
    FAVOR+ exponent than the past can underflow early keys (float64 needs exponents ~700 apart;
    this is then reported as DenominatorError, never a NaN).
    q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d).
    """
    check_tensor("q", q)
    check_tensor("k", k)
    check_tensor("projection", projection)
    check_same_device(q=q, projection=projection)
    fmap = FavorPlus(projection, stabilize=True)
    scale = q.shape[-1] ** -0.25
    phi_k = fmap(k * scale, is_query=False, key_stabilizer=getattr(mask, "key_stabilizer", None))
    return masked_linear_attention(fmap(q * scale, is_query=True), phi_k, v, mask)
