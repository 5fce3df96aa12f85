"""Registry records: softmax, linear, causal, packing, padding (choromanski22 Sec. 2-3.1)."""
from __future__ import annotations

import numpy as np
import torch

import fast
import reference.attention as ref_attention
import reference.features as ref_features
from reference.masks import sequence as ref_masks
from verify.dense import dense_masked_attention
from verify.problems import Problem, qkv, rng_for
from verify.registry import Mechanism, register

D_QK = 16  # query/key width
D_V = 16  # value width
M_FEATURES = 16  # random features


def favor_problem(n: int, seed: int, **extras) -> Problem:
    """Q, K (N, 16) of row norm 1, V (N, 16), an iid Gaussian projection (16, 16)."""
    q, k, v = qkv(n, D_QK, D_V, seed=seed)
    w = ref_features.gaussian_projection(M_FEATURES, D_QK, rng_for(seed, 10))
    return Problem(n=n, seed=seed, q=q, k=k, v=v, projection=w, extras=extras)


def favor_reference(problem: Problem, mask: np.ndarray | None) -> np.ndarray:
    """Dense float64 masked kernel attention with FAVOR+ features of x / d^(1/4)."""
    s = problem.q.shape[-1] ** -0.25
    phi_q = ref_features.favor_plus(problem.q * s, problem.projection)
    phi_k = ref_features.favor_plus(problem.k * s, problem.projection)
    return ref_attention.masked_kernel_attention(phi_q, phi_k, problem.v, mask)


def _tensors(problem: Problem, device, dtype):
    return [torch.as_tensor(a, device=device, dtype=dtype) for a in (problem.q, problem.k, problem.v, problem.projection)]


def favor_fast_setup(make_mask):
    """Runner factory for fast.favor_attention with the operator ``make_mask(problem, device)``."""

    def setup(problem: Problem, device, dtype):
        q, k, v, w = _tensors(problem, device, dtype)
        mask = make_mask(problem, device) if make_mask else None
        return lambda: fast.favor_attention(q, k, v, w, mask)

    return setup


def favor_dense_setup(make_dense_mask):
    """Runner factory for the dense torch twin with the (N, N) mask ``make_dense_mask(problem)``."""

    def setup(problem: Problem, device, dtype):
        q, k, v, w = _tensors(problem, device, dtype)
        mask = None if make_dense_mask is None else torch.as_tensor(make_dense_mask(problem), device=device, dtype=dtype)
        fmap = fast.FavorPlus(w, stabilize=True)
        s = q.shape[-1] ** -0.25
        return lambda: dense_masked_attention(fmap(q * s, True), fmap(k * s, False), v, mask)

    return setup


def _favor_mechanism(id, title, source, dense_mask, fast_mask, problem=favor_problem, **kw) -> Mechanism:
    return register(
        Mechanism(
            id=id,
            title=title,
            source=source,
            complexity="N",
            make_problem=problem,
            reference=lambda p: favor_reference(p, None if dense_mask is None else dense_mask(p)),
            fast_setup=favor_fast_setup(fast_mask),
            dense_setup=favor_dense_setup(dense_mask),
            dense_mask=dense_mask or (lambda p: np.ones((p.n, p.n))),
            **kw,
        )
    )


# ----------------------------------------------------------------------------------- softmax


def _softmax_fast_setup(problem: Problem, device, dtype):
    q, k, v, _ = _tensors(problem, device, dtype)
    return lambda: fast.softmax_attention(q, k, v)


register(
    Mechanism(
        id="softmax",
        title="Dense softmax attention",
        source="choromanski22 Def. 2.1",
        complexity="N^2",
        make_problem=favor_problem,
        reference=lambda p: ref_attention.softmax_attention(p.q, p.k, p.v),
        fast_setup=_softmax_fast_setup,
        dense_mask=lambda p: np.ones((p.n, p.n)),
        fast_sizes=tuple(2**p for p in range(9, 15)),
        quick_fast_sizes=tuple(2**p for p in range(9, 15)),
        notes="The quadratic baseline (torch scaled_dot_product_attention); no dense twin.",
    )
)

# ---------------------------------------------------------------------------- linear family

_favor_mechanism(
    "linear",
    "Unmasked linear attention, FAVOR+",
    "choromanski22 Eq. 3",
    dense_mask=None,
    fast_mask=None,
)

_favor_mechanism(
    "causal",
    "Causal mask, chunked scan",
    "choromanski22 Sec. 3.1",
    dense_mask=lambda p: ref_masks.causal_mask(p.n),
    fast_mask=lambda p, device: fast.CausalMask(p.n, chunk=64),
)


def packing_problem(n: int, seed: int) -> Problem:
    """Contiguous packed segments, about one per 256 tokens (at least min(n, 4)), random boundaries."""
    rng = rng_for(seed, 20)
    segments = max(min(n, 4), n // 256)  # small N still has several segments to keep apart
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(segments - 1, n - 1), replace=False)) if n > 1 else []
    ids = np.zeros(n, dtype=np.int64)
    ids[np.asarray(cuts, dtype=np.int64)] = 1
    return favor_problem(n, seed, segment_ids=np.cumsum(ids))


_favor_mechanism(
    "packing",
    "Packing mask (segment ids)",
    "choromanski22 Sec. 3.1, Fig. 2",
    dense_mask=lambda p: ref_masks.packing_mask(p.extras["segment_ids"]),
    fast_mask=lambda p, device: fast.PackingMask(torch.as_tensor(p.extras["segment_ids"], device=device)),
    problem=packing_problem,
)


def padding_problem(n: int, seed: int) -> Problem:
    """A key mask keeping a random 60-90% prefix of the tokens (right padding)."""
    rng = rng_for(seed, 21)
    length = max(1, int(round(n * rng.uniform(0.6, 0.9))))
    return favor_problem(n, seed, key_mask=np.arange(n) < length)


_favor_mechanism(
    "padding",
    "Padding mask (real keys only)",
    "choromanski22 Sec. 3.1, Fig. 2",
    dense_mask=lambda p: ref_masks.padding_mask(p.extras["key_mask"]),
    fast_mask=lambda p, device: fast.PaddingMask(torch.as_tensor(p.extras["key_mask"], device=device)),
    problem=padding_problem,
)
