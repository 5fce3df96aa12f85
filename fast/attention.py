"""Attention drivers: dense softmax (choromanski22 Def. 2.1), linear (Eq. 3), masked linear
(Algorithm 1) and FAVOR+ (Performer) on top of them.

Shapes: q, k (..., N, d_qk); v (..., N, d); features phi_q, phi_k (..., N, m); the leading
(batch, head) dims must agree between the arguments. Cost: softmax_attention O(N^2 d);
linear_attention O(N m d); masked_linear_attention O((T_M(N) + N) m d) for a mask whose product
costs T_M(N) (Lemma 3.1); favor_attention adds the features, O(N m d_qk). The blocks of
Algorithm 1 live in fast.algebra and the mask contract in fast.operator: the driver names no
concrete mask.

Every denominator den_i = phi_q_i . sum_j M_ij phi_k_j is guarded: refused (DenominatorError,
never divided by) where it is not finite, zero or subnormal, or, for signed features or masks,
within round-off of zero relative to the terms it sums. Validation makes no extra pass over the
data on the fast path: metadata is checked first, finiteness and the guard are folded into 0-dim
flags read once per call, and only a failed read scans the arguments to raise ValueError naming
the non-finite one. Every output of Algorithm 1 is a weighted average of v's entries for
nonnegative features and mask, yet its numerator sums reach den_i max |v|: one more flag (a read
pass over the numerator, O(N d)) sends a call whose numerator overflowed on finite inputs to the
rare path, which redoes the products on v 2^-s (a power of two per column, fast.scaling) and
multiplies the output by 2^s: exact, so an output is inf only where the true one overflows. The
guard's derivation, ``no_key``, ``features_nonnegative`` and what is checked when: docs/papers.md,
"fast.attention".
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fast.algebra import (DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_COLS, blocked_numerator, default_block_cols, divide,
                          features_per_block, guard_flag, linear_products, masked_products, refused_rows, rows_dot)
from fast.errors import DenominatorError
from fast.favor_blockwise import favor_products
from fast.features import favor_exponentials, slice_max
from fast.kernels.dispatch import use_feature_kernel
from fast.masks.explicit import as_mask_operator
from fast.operator import MaskOperator
from fast.scaling import times_pow2, value_shift, within_values
from fast.validation import (broadcast_shape, check_favor_inputs, check_no_key, check_positive_int, check_same_device,
                             check_tensor, compute_dtype, finite_flag, raise_if_non_finite)

# DenominatorError, DEFAULT_BLOCK_COLS, DEFAULT_BLOCK_BYTES and blocked_numerator are re-exported:
# they used to live here
__all__ = ["softmax_attention", "masked_linear_attention", "linear_attention", "favor_attention", "favor_features",
           "DenominatorError",
           "DEFAULT_BLOCK_COLS", "DEFAULT_BLOCK_BYTES", "blocked_numerator"]


def _lead_of(names: tuple[str, ...], *tensors: torch.Tensor) -> tuple[int, ...]:
    """The broadcast of the tensors' leading (batch, head) dims, else ValueError naming them all."""
    lead: tuple[int, ...] = ()
    for t in tensors:
        try:
            lead = broadcast_shape(lead, tuple(t.shape[:-2]))
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(x.shape)}" for n, x in zip(names, tensors))
            raise ValueError(f"{', '.join(names)} must have leading (batch, head) dims that broadcast together, "
                             f"got {shapes}") from None
    return lead


def _broadcasts_to(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    if len(src) > len(dst):
        return False
    return all(s in (1, t) for s, t in zip(reversed(src), reversed(dst)))


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logits_mask: torch.Tensor | None = None, *,
    no_key: str = "raise",
) -> torch.Tensor:
    """Dense softmax attention D^-1 exp(logits_mask + Q K^T / sqrt(d_qk)) V (choromanski22 Def. 2.1).

    q: (..., N_q, d_qk); k: (..., N, d_qk); v: (..., N, d) -> (..., N_q, d), leading dims
    broadcasting together; logits_mask: additive, floating, broadcastable to (..., N_q, N), -inf
    excludes a pair (NaN and +inf are refused). O(N^2 d): the quadratic baseline, through torch's
    scaled_dot_product_attention. A query whose logits_mask row is all -inf sees no key:
    no_key="raise" (default) raises DenominatorError; no_key="zero" gives it output 0 (gradient 0).
    TypeError / ValueError name the argument (NaN or inf in q, k or v: "<name> contains non-finite
    values").

    >>> import torch
    >>> from fast import softmax_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(6, 4, generator=g) for _ in range(3))
    >>> causal = torch.zeros(6, 6).masked_fill(torch.ones(6, 6).triu(1).bool(), -torch.inf)
    >>> dense = torch.softmax(q @ k.T / 4 ** 0.5 + causal, dim=-1) @ v
    >>> torch.allclose(softmax_attention(q, k, v, causal), dense, atol=1e-6)
    True
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, check_finite=False)
    check_same_device(q=q, k=k, v=v)
    check_no_key(no_key)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_qk, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same N, got {k.shape[-2]} and {v.shape[-2]}")
    lead = _lead_of(("q", "k", "v"), q, k, v)
    if logits_mask is None:
        return _finite_output(lambda vv: F.scaled_dot_product_attention(q, k, vv), q, k, v)
    if not isinstance(logits_mask, torch.Tensor) or not logits_mask.is_floating_point():
        got = logits_mask.dtype if isinstance(logits_mask, torch.Tensor) else type(logits_mask).__name__
        raise TypeError(f"logits_mask must be a floating tensor of additive logits (use -inf to exclude), got {got}")
    target = (*lead, q.shape[-2], k.shape[-2])
    if not _broadcasts_to(tuple(logits_mask.shape), target):
        raise ValueError(f"logits_mask must broadcast to (..., N_q, N) = {target} (q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)}), got shape {tuple(logits_mask.shape)}")
    if logits_mask.device != q.device:
        raise ValueError(f"logits_mask must be on q's device {q.device}, got {logits_mask.device}")
    logits_mask = logits_mask.to(q.dtype)
    if not bool(logits_mask.amax() < torch.inf):  # NaN fails the comparison too
        raise ValueError("logits_mask must hold finite logits or -inf, got NaN or +inf")
    unseen = logits_mask.amax(-1) == -torch.inf  # (..., N_q): rows that exclude every key
    if not bool(unseen.any()):
        return _finite_output(lambda vv: F.scaled_dot_product_attention(q, k, vv, attn_mask=logits_mask), q, k, v)
    count = int(unseen.expand(target[:-1]).sum())
    if no_key == "raise":
        raise DenominatorError(
            f"{count} of {math.prod(target[:-1])} queries see no key (their logits_mask row is all -inf), so their "
            'attention is undefined; pass no_key="zero" to output 0 for them, or give every query a key')
    safe = logits_mask.masked_fill(unseen.unsqueeze(-1), 0.0)
    out = _finite_output(lambda vv: F.scaled_dot_product_attention(q, k, vv, attn_mask=safe), q, k, v)
    return torch.where(unseen.unsqueeze(-1), torch.zeros_like(out), out)


def _finite_output(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """attend(v) (softmax_attention's SDPA call) with its input check on the output: a NaN or inf
    anywhere in q, k or v reaches every output row that sees it (a NaN or infinite logit makes its
    softmax row NaN, a value enters with weight exp(.) >= 0 and 0 * NaN is NaN), so one read pass over
    the output and one sync replace three scans of the inputs. On a failure the inputs are scanned to
    name the argument (ValueError). Finite inputs whose output is not finite met an overflowed sum
    (SDPA's kernels sum exp(s - max) v_j before dividing, up to N max |v|): redone on v 2^-s, each
    column's largest |v| in [0.5, 1), and multiplied back, exactly (fast.scaling); the weights are a
    convex combination, so the output is clamped into v's range first."""
    out = attend(v)
    if not bool(finite_flag(out)):
        raise_if_non_finite(q=q, k=k, v=v)
        shift = value_shift(v)
        scaled = times_pow2(v, -shift)
        out = times_pow2(within_values(attend(scaled), scaled), shift)
    return out


def _check_features(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes, dtypes and devices only (metadata): finiteness is checked on the way (docs/papers.md,
    "fast.attention")."""
    check_tensor("phi_q", phi_q, check_finite=False)
    check_tensor("phi_k", phi_k, check_finite=False)
    check_tensor("v", v, check_finite=False)
    check_same_device(phi_q=phi_q, phi_k=phi_k, v=v)
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(f"phi_q and phi_k must have the same feature width m, got {phi_q.shape[-1]} and {phi_k.shape[-1]}")
    if phi_k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"phi_k (..., N, m) and v (..., N, d) must share leading dims and N, got {tuple(phi_k.shape)} and {tuple(v.shape)}")
    if phi_q.shape[:-2] != phi_k.shape[:-2]:
        raise ValueError(f"phi_q and phi_k must share leading (batch, head) dims, got {tuple(phi_q.shape)} and {tuple(phi_k.shape)}")


def _check_mask_n(op: object, n_q: int, n_k: int, names: str) -> None:
    """A mask ties N_q to N: both must be the operator's n (ValueError naming mask)."""
    if op.n != n_k or n_q != n_k:
        raise ValueError(f"mask is for N={op.n} tokens but {names} have N={n_q}, {n_k} (a mask needs "
                         f"N_q = N = mask.n; build the mask for these inputs)")


def masked_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    mask: object = None,
    *,
    block_cols: int | None = None,
    no_key: str = "raise",
    features_nonnegative: bool | None = None,
) -> torch.Tensor:
    """Masked linear attention, choromanski22 Algorithm 1 (= Eq. 2 with the kernel phi_q phi_k^T).

        out_i = phi_q_i^T sum_j M_ij phi_k_j v_j^T / phi_q_i^T sum_j M_ij phi_k_j

    phi_q: (..., N_q, m); phi_k: (..., N, m); v: (..., N, d) -> (..., N_q, d), input dtype
    (float16/bfloat16 accumulate in float32). mask: None, or anything ``fast.as_mask_operator``
    accepts (a MaskOperator, a dense (..., N, N) tensor or NumPy array, a torch or scipy sparse
    matrix), for N_q = N. mask=None: Eq. 3, two GEMMs, O(N m d). An operator with ``attend``: that
    specialised form (e.g. the chunked causal scan). Otherwise fast.algebra.masked_products: the mask
    is applied to blocks of about ``block_cols`` columns of [vec(phi_k_j v_j^T), phi_k_j] (None:
    fast.algebra.default_block_cols), O((T_M(N) + N) m d) time (Lemma 3.1) and O(N (m + d) +
    N block_cols) extra memory, in training too; gradients reach the mask's parameters().

    Values near the dtype's maximum: a numerator that overflows on finite inputs is redone on
    v 2^-s and multiplied back by 2^s (exact powers of two; the products run twice on that rare
    path only), so the output is inf only where the true output overflows. The common path pays
    one read pass over the numerator, O(N d).

    no_key: what a query whose mask row is all zero gets, "raise" (default) or "zero" (output 0).
    features_nonnegative: None (the sign is tested), True (the caller promises phi_q, phi_k >= 0, as
    EluPlusOne, ReLU, FavorPlus and Hyperbolic give: no test) or False (signed: the guard's relative
    floor is computed); docs/papers.md, "fast.attention", says what each costs and detects.

    Raises DenominatorError for a denominator the guard refuses, or a query that sees no key with
    no_key="raise"; TypeError / ValueError naming the argument for bad inputs (``mask``; "<name>
    contains non-finite values" for NaN or inf in phi_q, phi_k or v; ``features_nonnegative`` when a
    broken promise shows in a denominator).

    >>> import torch
    >>> from fast import EluPlusOne, masked_linear_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(6, 4, generator=g) for _ in range(3))
    >>> phi_q, phi_k = EluPlusOne()(q), EluPlusOne()(k)
    >>> mask = torch.ones(6, 6).tril()                        # causal
    >>> a = mask * (phi_q @ phi_k.T)                          # the dense masked kernel (Eq. 2)
    >>> out = masked_linear_attention(phi_q, phi_k, v, mask)
    >>> tuple(out.shape), torch.allclose(out, a @ v / a.sum(-1, keepdim=True), atol=1e-6)
    ((6, 4), True)
    """
    _check_features(phi_q, phi_k, v)
    if block_cols is not None:
        block_cols = check_positive_int("block_cols", block_cols)
    check_no_key(no_key)
    _check_sign_promise(features_nonnegative)
    op = None if mask is None else as_mask_operator(mask)
    if op is not None:
        _check_mask_n(op, phi_q.shape[-2], phi_k.shape[-2], "phi_q, phi_k")
    return _attention(phi_q, phi_k, v, op, block_cols=block_cols, no_key=no_key,
                      features_nonnegative=features_nonnegative,
                      diagnose=lambda: raise_if_non_finite(phi_q=phi_q, phi_k=phi_k, v=v))


def _check_sign_promise(value: object) -> None:
    if not (value is None or value is True or value is False):
        raise ValueError("features_nonnegative must be None (the features' sign is tested), True (the caller "
                         "promises phi_q >= 0 and phi_k >= 0 entrywise) or False (signed features), got "
                         f"{value!r}")


def _all(flags: list[torch.Tensor]) -> torch.Tensor:
    out = flags[0]
    for f in flags[1:]:
        out = out & f
    return out


def _attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, op: MaskOperator | None, *, block_cols: int | None,
               no_key: str, key_log_scale: torch.Tensor | None = None, features_nonnegative: bool | None = None,
               flags: tuple[torch.Tensor, ...] = (), diagnose=None) -> torch.Tensor:
    """Algorithm 1 on checked inputs and operator (or None): products, guard, division.

    key_log_scale: passed to ``op.attend`` (an operator with rescales_keys) when not None, through
    the contract's ``attend_optimistic`` (whose exactness flag joins the call's one host read; where
    it fails, ``attend_exact`` redoes the products).
    features_nonnegative: None (tested), True (promised, or known: FAVOR+), False (signed).
    flags: the caller's 0-dim bool checks (finite reductions of its own inputs), combined with
    this function's into the one host read of the call; ``diagnose()`` is called only when that
    read fails, and raises ValueError naming a non-finite argument (docs/papers.md,
    "fast.attention", "What is checked when").
    """
    out_dtype = v.dtype
    work = compute_dtype(torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype))
    mask_nonnegative = op is None or bool(op.nonnegative)  # read once (a property may compute it)
    optimistic = features_nonnegative is not False and mask_nonnegative
    # an attend that reads half precision itself and sums in float32 (attend_takes_half: CausalMask's
    # Triton kernel) gets the inputs as they are, saving three float32 copies and running the kernel
    # on half-precision loads; where the guard needs the features' round-off (signed features) or
    # the products have key constants, the float32 copies as before
    native = (optimistic and key_log_scale is None and op is not None and op.attend is not None
              and op.attend_takes_half and phi_q.dtype == phi_k.dtype == v.dtype != work)
    if not native:
        phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)  # no copy when the dtype is already right
    checks = list(flags)
    k_min = None
    exact = None  # the operator's optimistic attend: its condition, checked with the call's one read
    if op is None:
        num, den, kv = linear_products(phi_q, phi_k, v)  # kv (..., m, d)
        checks.append(finite_flag(kv))  # every entry of phi_k and v reaches kv; of phi_q (and phi_k), den
    else:
        attend = op.attend
        # a key the mask hides from every query may reach no product (a sparse matmul skips it), and
        # v reaches no denominator: one read pass over each (phi_q reaches den_i in every form),
        # unless the operator's attend reaches every key (then num and den's check covers them)
        if attend is None or not op.attend_reaches_keys:
            if phi_k.numel():  # (an empty batch has nothing to check, and aminmax refuses it)
                k_min, k_max = torch.aminmax(phi_k.detach())
                checks.append((k_min > -torch.inf) & (k_max < torch.inf))
            checks.append(finite_flag(v))
        if attend is not None:
            if key_log_scale is None:
                result = attend(phi_q, phi_k, v, accumulate=True) if native else attend(phi_q, phi_k, v)
            else:  # a route without a host read of its own, if the operator has one
                result, exact = op.attend_optimistic(phi_q, phi_k, v, key_log_scale)
                if exact is not None:
                    checks.append(exact)
            num, den = _check_attend(op, result, v)
        else:
            fpb = features_per_block(default_block_cols(v) if block_cols is None else block_cols, v.shape[-1])
            num, den = masked_products(phi_q, phi_k, v, op, fpb)
    # finite inputs can still overflow the numerator's sums (|num_i| reaches den_i max |v|) where
    # out = num / den is finite: one read pass over num (O(N d)) tells the rare path to rescale v
    checks.append(finite_flag(num))

    if optimistic:  # features (assumed and tested below, promised, or known) >= 0 and a nonnegative mask
        if features_nonnegative is None and phi_q.numel() and phi_k.numel():
            with torch.no_grad():
                q_min = phi_q.detach().amin()
                k_min = phi_k.detach().amin() if k_min is None else k_min
                checks.append((q_min >= 0) & (k_min >= 0))  # NaN fails
        floor = _guard_floor(phi_q, phi_k, op, True, True)  # only a mask's roundoff_bound, if any
    else:  # signed or unknown: the relative floor, from |phi| (a promise of features >= 0 is not
        # relied on here: |phi| = phi when it holds, and a broken one cannot switch the guard off)
        floor = _guard_floor(phi_q, phi_k, op, False, mask_nonnegative)
    checks.append(guard_flag(den, floor, positive=optimistic))  # den cannot be negative when optimistic

    def no_key_rows() -> torch.Tensor | None:  # called by divide on a failure only
        return _no_key_rows(op, phi_k)

    if bool(_all(checks)):  # the call's one host read
        return divide(num, den, floor=floor, no_key=no_key_rows, policy=no_key, verified=True).to(out_dtype)
    # the rare path: name a non-finite argument, or redo the guard with the features' actual sign
    if native:  # on float32 copies, as for every other operator (num, den are float32 already)
        phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)
    if diagnose is not None:
        diagnose()
    if exact is not None and not bool(exact):  # the optimistic route was not exact: redo
        num, den = _check_attend(op, op.attend_exact(phi_q, phi_k, v, key_log_scale), v)  # the floor needs no redo
    shift = None
    if not bool(finite_flag(num) | ~finite_flag(den)):  # finite inputs, den finite, num's sums overflowed:
        # redo on v 2^-s (exact); a non-finite den is refused below whatever num is
        num, den, shift = _rescaled_products(phi_q, phi_k, v, op, block_cols, key_log_scale, den)
    negative = True  # not known to be a convex combination
    if optimistic:
        with torch.no_grad():
            negative = bool(phi_q.detach().amin() < 0) or bool(phi_k.detach().amin() < 0)
        if negative and features_nonnegative is True:
            raise ValueError("features_nonnegative=True promised phi_q >= 0 and phi_k >= 0, but they have negative "
                             "entries: pass features_nonnegative=None (tested) or False (signed features)")
        floor = _guard_floor(phi_q, phi_k, op, not negative, True)
    out = divide(num, den, floor=floor, no_key=no_key_rows, policy=no_key,
                 no_key_cause=None if op is None else op.no_key_cause)
    if shift is None:
        return out.to(out_dtype)
    if not negative:  # nonnegative weights: out lies in v's range, which round-off must not leave (near max)
        out = within_values(out, times_pow2(v, -shift))
    return times_pow2(out, shift).to(out_dtype)


def _rescaled_products(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, op: MaskOperator | None,
                       block_cols: int | None, key_log_scale: torch.Tensor | None,
                       den: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(num, den, s) of Algorithm 1 on the values v 2^-s (fast.scaling), for the rare path where the
    numerator overflowed on finite inputs: out = 2^s num / den exactly (powers of two), and it is
    finite wherever the true output is. s is the least shift keeping max |v| 2^-s max den_i below
    finfo.max / 4 (num_i <= den_i max |v| for nonnegative features and mask); if the numerator
    still overflows (the sums of a signed product, or of features a small phi_q_i hides from
    den_i), every column's largest |v| is brought into [0.5, 1). Both products are recomputed
    (under autograd the overflowed ones are discarded, so no inf reaches a gradient). The same
    route as the first products (attend_exact for an operator given key_log_scale)."""
    num = None
    for bound in (den, None):
        shift = value_shift(v, bound)
        scaled = times_pow2(v, -shift)
        if op is None:
            num, den, _ = linear_products(phi_q, phi_k, scaled)
        elif op.attend is not None:
            result = op.attend(phi_q, phi_k, scaled) if key_log_scale is None else \
                op.attend_exact(phi_q, phi_k, scaled, key_log_scale)
            num, den = _check_attend(op, result, scaled)
        else:
            fpb = features_per_block(default_block_cols(v) if block_cols is None else block_cols, v.shape[-1])
            num, den = masked_products(phi_q, phi_k, scaled, op, fpb)
        if bool(finite_flag(num)):
            break
    return num, den, shift


def _guard_floor(phi_q: torch.Tensor, phi_k: torch.Tensor, op: MaskOperator | None, features_nonnegative: bool,
                 mask_nonnegative: bool) -> torch.Tensor | None:
    """The guard's floor (..., N_q) on |den| (docs/papers.md, "fast.attention"), or None when only the
    dtype's normal range applies (nonnegative features and mask, no roundoff_bound): then nothing
    is computed.
    features_nonnegative False means "not known to be": |phi| is formed (equal to phi when it is
    >= 0, so the floor is the same either way; only an abs pass is saved by knowing)."""
    with torch.no_grad():
        pq, pk = phi_q.detach(), phi_k.detach()
        bound = None if op is None else op.roundoff_bound(pk)  # (..., m), checked by the operator
        extra = None
        if bound is not None:
            per_column = bound.to(pk.dtype)
            extra = rows_dot(pq if features_nonnegative else pq.abs(), per_column)
        if features_nonnegative and mask_nonnegative:
            return extra
        apq = pq if features_nonnegative else pq.abs()
        apk = pk if features_nonnegative else None  # |phi_k|, formed only where it is used
        if op is None:
            scale = rows_dot(apq, (apk if apk is not None else pk.abs()).sum(dim=-2))
        elif mask_nonnegative:
            scale = (apq * op.matmul_unscaled(pk.abs())).sum(-1)
        elif op.has_abs_matmul:
            apk = apk if apk is not None else pk.abs()
            scale = (apq * op.abs_matmul(apk)).sum(-1)
        else:  # sign unknown, no entrywise bound: cancellation in the final contraction only (docs/papers.md)
            scale = (apq * op.matmul_unscaled(pk).abs()).sum(-1)
        u = torch.finfo(pk.dtype).eps / 2
        floor = (8.0 * u * math.sqrt(pk.shape[-2] * pk.shape[-1])) * scale
        return floor if extra is None else floor + extra


def _no_key_rows(op: MaskOperator | None, phi_k: torch.Tensor) -> torch.Tensor | None:
    """Bool (..., N): rows of M that are all zero ((M 1)_i == 0 for a nonnegative mask, (B 1)_i == 0
    for abs_matmul's B >= |M|; within the mask's roundoff_bound of 0 if it has one), or None when
    the mask's sign is unknown (or there is no mask: every query sees every key)."""
    if op is None:
        return None
    with torch.no_grad():
        ones = torch.ones_like(phi_k[..., :1]).detach()  # (..., N, 1)
        if op.nonnegative:
            sums = op.matmul_unscaled(ones)
        elif op.has_abs_matmul:
            sums = op.abs_matmul(ones)
        else:
            return None
        bound = op.roundoff_bound(ones)
        limit = bound.to(sums.dtype).unsqueeze(-2) if bound is not None else torch.zeros_like(sums[..., :1, :])
        return (sums.abs() <= limit)[..., 0]


def _check_attend(op: MaskOperator, result: object, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mask.attend must return (num (..., N, d), den (..., N)) with matching leading dims, which v's
    leading dims broadcast to."""
    n, d = v.shape[-2], v.shape[-1]
    ok = isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result)
    if ok:
        num, den = result
        ok = (num.dim() >= 2 and tuple(num.shape[-2:]) == (n, d) and tuple(den.shape) == tuple(num.shape[:-1])
              and _broadcasts_to(tuple(v.shape[:-2]), tuple(num.shape[:-2])))
    if not ok:
        got = (tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in result)
               if isinstance(result, tuple) else type(result).__name__)
        raise ValueError(f"mask.attend must return (num (..., {n}, {d}), den (..., {n})) with the same leading dims "
                         f"(those of the inputs, {tuple(v.shape[:-2])}, broadcast against the mask's), "
                         f"got {got} (mask is {op.type_name})")
    return result


def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, *,
                     features_nonnegative: bool | None = None) -> torch.Tensor:
    """Unmasked linear attention D^-1 (Q' (K'^T V)) (choromanski22 Eq. 3), O(N m d).

    phi_q: (..., N_q, m); phi_k: (..., N, m); v: (..., N, d) -> (..., N_q, d). Every query sees every
    key (no ``no_key`` argument); the denominators are guarded and features_nonnegative means what
    it means for masked_linear_attention, which raises the same errors.

    >>> import torch
    >>> from fast import EluPlusOne, linear_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> phi_q, phi_k = (EluPlusOne()(torch.randn(6, 4, generator=g)) for _ in range(2))
    >>> v = torch.randn(6, 2, generator=g)
    >>> a = phi_q @ phi_k.T
    >>> torch.allclose(linear_attention(phi_q, phi_k, v), a @ v / a.sum(-1, keepdim=True), atol=1e-6)
    True
    """
    return masked_linear_attention(phi_q, phi_k, v, mask=None, features_nonnegative=features_nonnegative)


def favor_features(
    q: torch.Tensor,
    k: torch.Tensor,
    projection: torch.Tensor,
    mask: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stabilised FAVOR+ features (phi_q, phi_k) for masked_linear_attention(phi_q, phi_k, v, mask).

    FavorPlus of q / d_qk^(1/4) and k / d_qk^(1/4) (Performer Lemma 1): phi_q_i . phi_k_j estimates
    exp(q_i . k_j / sqrt(d_qk)) up to constants that cancel in the attention ratio, one per query and
    the keys' from the mask's ``key_stabilizer`` (one per (batch, head) slice for mask=None or an
    operator with ``rescales_keys``; the mask, for q's and k's N, is read for nothing else).
    q: (..., N_q, d_qk); k: (..., N, d_qk); projection W: (m, d_qk) -> phi_q (..., N_q, m), phi_k
    (..., N, m) in q's / k's dtype (float32 for half precisions), differentiable in q and k,
    O(N m d_qk). ValueError names q, k or projection (NaN or inf) or ``mask`` (another N).

    >>> import torch
    >>> from fast import favor_attention, favor_features, gaussian_projection, masked_linear_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(8, 4, generator=g) / 2 for _ in range(3))
    >>> w = gaussian_projection(16, 4, generator=g)
    >>> mask = torch.ones(8, 8).tril()
    >>> phi_q, phi_k = favor_features(q, k, w, mask)
    >>> out = masked_linear_attention(phi_q, phi_k, v, mask)
    >>> tuple(phi_q.shape), torch.allclose(out, favor_attention(q, k, v, w, mask), atol=1e-5)
    ((8, 16), True)
    """
    check_favor_inputs(q, k, projection)
    op = None if mask is None else as_mask_operator(mask)
    if op is not None:
        _check_mask_n(op, q.shape[-2], k.shape[-2], "q, k")
    phi_q, phi_k, _, flags = _favor_features(q, k, projection, op, in_driver=False)
    if not bool(_all(flags)):
        raise_if_non_finite(q=q, k=k, projection=projection)
    root = math.sqrt(projection.shape[0])
    return phi_q / root, phi_k / root


def _favor_features(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, op: MaskOperator | None,
                    in_driver: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(phi_q, phi_k, key_log_scale, flags) on checked inputs and an operator (or None): one place
    for the construction. Features without 1/sqrt(m). in_driver (favor_attention): for an
    operator with rescales_keys its own stabiliser and key_log_scale (its constants, detached,
    (..., N, 1)), and the queries' norm term is never formed (a per-query factor cancels in
    attention); otherwise the default stabiliser for such operators and key_log_scale None.
    flags: 0-dim bool checks that every entry of k's squared norms, of the projection and (not
    in_driver) of q's squared norms is finite: NaN or inf in q, k or projection fails one of
    them (in the driver, q's reach the denominators instead)."""
    # an operator's per-key constants are undone only by its attend given key_log_scale
    rescales = op is not None and op.rescales_keys is True and op.attend is not None
    captured: list[torch.Tensor] = []
    row_fn = None
    if op is None or (bool(op.rescales_keys) and not (in_driver and rescales)):
        stabilizer = None  # FavorPlus's own per-(batch, head) max
    else:
        row_fn = op.row_key_stabilizer()  # a function of the rows' maxima: z is never formed whole
        stabilizer = None
        if row_fn is None:
            own = op.key_stabilizer

            def stabilizer(z: torch.Tensor) -> torch.Tensor:
                c = own(z)
                if not isinstance(c, torch.Tensor) or not _broadcasts_to(tuple(c.shape), tuple(z.shape)):
                    got = tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__
                    raise ValueError(
                        f"mask.key_stabilizer(z) must return constants broadcastable to z {tuple(z.shape)} (k's "
                        f"leading dims and N, then m), got {got} (mask is {op.type_name}; a batched mask needs "
                        "k with its leading dims)")
                captured.append(c.detach())
                return c

    # the scale d^(-1/4) of q and k folds into W (m x d) and the norm term, in the compute dtype:
    # q * d^(-1/4) rounded to bfloat16 would move each exponent by ~2^-9 |w . q| (issue 10)
    d = projection.shape[1]
    scale, half = d ** -0.25, 0.5 * d ** -0.5
    q, k = q.to(compute_dtype(q.dtype)), k.to(compute_dtype(k.dtype))
    w_q = projection.to(q.dtype) * scale
    w_k = w_q if k.dtype == q.dtype else projection.to(k.dtype) * scale
    if in_driver and stabilizer is None and q.dtype == k.dtype and use_feature_kernel(q, w_q):
        # the same features by Triton kernels (fast.kernels.favor_features): no (N, m) product
        # matrix and no elementwise passes over it, the keys' constants from their row maxima
        from fast.kernels.favor_features import favor_kernel_features  # imports Triton: only when chosen
        phi_q, phi_k, c, n_k = favor_kernel_features(q, k, w_q, w_k, half, slice_max if row_fn is None else row_fn)
        n_q = None
    else:
        phi_q, _, n_q = favor_exponentials(q, w_q, half, is_query=True, query_norm=not in_driver)
        phi_k, c, n_k = favor_exponentials(k, w_k, half, is_query=False, key_stabilizer=stabilizer,
                                           row_stabilizer=row_fn)
    flags = [finite_flag(n_k, projection)]
    if n_q is not None:
        flags.append(finite_flag(n_q))
    key_log_scale = None
    if in_driver and rescales:
        if stabilizer is not None:
            c = captured[0]
        z_shape = (*phi_k.shape[:-1], 1)
        if not _broadcasts_to(tuple(c.shape), z_shape):
            raise ValueError(f"mask.key_stabilizer(z) of a mask with rescales_keys must return one constant per key, "
                             f"broadcastable to {z_shape}, got {tuple(c.shape)} (mask is {op.type_name})")
        key_log_scale = c.expand(z_shape)
    return phi_q, phi_k, key_log_scale, flags


def favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    mask: object = None,
    *,
    no_key: str = "raise",
) -> torch.Tensor:
    """Performer softmax-kernel attention (FAVOR+) with an optional mask operator.

    Algorithm 1 (masked_linear_attention) on stabilised FAVOR+ features of q / d_qk^(1/4) and
    k / d_qk^(1/4) with W = ``projection`` (m, d_qk): the estimated kernel is exp(q.k / sqrt(d_qk))
    (Performer Lemma 1). q, k: (..., N, d_qk); v: (..., N, d) -> (..., N, d). mask: None or anything
    ``fast.as_mask_operator`` accepts, for q's and k's N; its ``key_stabilizer`` sets the keys'
    constants (an operator with ``rescales_keys``, CausalMask, undoes per-key ones in its attend).
    no_key as in masked_linear_attention. O(N m (d_qk + d)) plus the mask's products. mask=None: the
    features are formed a block of rows at a time, forward and backward (fast.favor_blockwise), so
    no (N, m) feature matrix exists. Values whose sums overflow (near the dtype's maximum) are
    rescaled exactly as in masked_linear_attention (one read pass over the output, O(N d)). Equals masked_linear_attention(*favor_features(...), v, mask) up
    to round-off for an operator without rescales_keys (docs/papers.md, "fast.attention").

    Raises DenominatorError as masked_linear_attention; TypeError / ValueError naming the argument
    (NaN or inf in q, k, v or projection: "<name> contains non-finite values"; ``mask``).

    >>> import torch
    >>> from fast import favor_attention, gaussian_projection, softmax_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(8, 4, generator=g) / 2 for _ in range(3))
    >>> w = gaussian_projection(256, 4, generator=g)
    >>> out = favor_attention(q, k, v, w)                     # estimates softmax attention
    >>> tuple(out.shape), bool((out - softmax_attention(q, k, v)).abs().max() < 0.1)
    ((8, 4), True)
    """
    check_favor_inputs(q, k, projection)  # once: favor_features would check them again
    check_tensor("v", v, check_finite=False)
    check_same_device(q=q, v=v)
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k (..., N, d_qk) and v (..., N, d) must share leading dims and N, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must share leading (batch, head) dims, got {tuple(q.shape)} and {tuple(k.shape)}")
    check_no_key(no_key)
    op = None if mask is None else as_mask_operator(mask)
    if op is not None:
        _check_mask_n(op, q.shape[-2], k.shape[-2], "q, k")
    if op is None:
        return _favor_unmasked(q, k, v, projection)
    # the features are exponentials: >= 0 by construction (no sign test)
    phi_q, phi_k, key_log_scale, flags = _favor_features(q, k, projection, op, in_driver=True)
    return _attention(phi_q, phi_k, v, op, block_cols=None, no_key=no_key, key_log_scale=key_log_scale,
                      features_nonnegative=True, flags=tuple(flags),
                      diagnose=lambda: raise_if_non_finite(q=q, k=k, projection=projection, v=v))


def _favor_unmasked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """favor_attention with mask=None on checked inputs: the features a block of rows at a time
    (fast.favor_blockwise: no (N, m) feature matrix, in forward or backward), the same features,
    stabilisers and guard as the masked paths (the denominators are those of
    masked_linear_attention's optimistic guard: every den_i in [finfo.tiny, finfo.max], refused
    otherwise), one host read."""
    d = projection.shape[1]
    scale, half = d ** -0.25, 0.5 * d ** -0.5  # folded into W and the norm term, as in _favor_features
    w_q = projection.to(compute_dtype(q.dtype)) * scale
    w_k = w_q if compute_dtype(k.dtype) == w_q.dtype else projection.to(compute_dtype(k.dtype)) * scale
    out, den, flag = favor_products(q, k, v, w_q, w_k, half)  # flag: out finite too (redone below if not)
    if not bool(flag & finite_flag(projection)):  # the call's one host read
        raise_if_non_finite(q=q, k=k, projection=projection, v=v)
        refused_rows(den)  # DenominatorError saying why (no query lacks keys without a mask)
        if not bool(finite_flag(out)):  # S = sum_j phi_k_j v_j^T or a numerator overflowed: v 2^-s, exact
            work = compute_dtype(torch.promote_types(w_q.dtype, v.dtype))
            for bound in (den, None):  # as fast.attention's _rescaled_products
                shift = value_shift(v.to(work), bound)
                scaled = times_pow2(v.to(work), -shift)
                out, _, _ = favor_products(q, k, scaled, w_q, w_k, half)
                if bool(finite_flag(out)):
                    break
            out = times_pow2(within_values(out, scaled), shift)  # exponential weights: out in v's range
    return out.to(v.dtype)
