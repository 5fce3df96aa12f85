"""Registry records: softmax, linear, causal, packing, padding (choromanski22 Sec. 2-3.1)."""
from __future__ import annotations

import numpy as np
import torch

import fast
import reference.attention as ref_attention
from reference.masks import sequence as ref_masks
from verify.favor import favor_mechanism, favor_problem, favor_tensors
from verify.problems import Problem, rng_for
from verify.registry import Mechanism, register

# ----------------------------------------------------------------------------------- softmax


def _softmax_fast_setup(problem: Problem, device, dtype, requires_grad: bool = False):
    q, k, v, _ = favor_tensors(problem, device, dtype, requires_grad)
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

register(favor_mechanism(
    "linear", "Unmasked linear attention, FAVOR+", "choromanski22 Eq. 3", "N",
    dense_mask=None, fast_mask=None, scale=True, scale_train=True,
))

register(favor_mechanism(
    "causal", "Causal mask, chunked scan", "choromanski22 Sec. 3.1", "N",
    dense_mask=lambda p: ref_masks.causal_mask(p.n),
    fast_mask=lambda p, device: fast.CausalMask(p.n, chunk=64),
    scale=True, scale_train=True,
))


def packing_problem(n: int, seed: int) -> Problem:
    """Contiguous packed segments, about one per 256 tokens (at least min(n, 4)), random boundaries."""
    rng = rng_for(seed, 20)
    segments = max(min(n, 4), n // 256)  # small N still has several segments to keep apart
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(segments - 1, n - 1), replace=False)) if n > 1 else []
    ids = np.zeros(n, dtype=np.int64)
    ids[np.asarray(cuts, dtype=np.int64)] = 1
    return favor_problem(n, seed, segment_ids=np.cumsum(ids))


register(favor_mechanism(
    "packing", "Packing mask (segment ids)", "choromanski22 Sec. 3.1, Fig. 2", "N",
    problem=packing_problem,
    dense_mask=lambda p: ref_masks.packing_mask(p.extras["segment_ids"]),
    fast_mask=lambda p, device: fast.PackingMask(torch.as_tensor(p.extras["segment_ids"], device=device)),
))


def padding_problem(n: int, seed: int) -> Problem:
    """A key mask keeping a random 60-90% prefix of the tokens (right padding)."""
    rng = rng_for(seed, 21)
    length = max(1, int(round(n * rng.uniform(0.6, 0.9))))
    return favor_problem(n, seed, key_mask=np.arange(n) < length)


register(favor_mechanism(
    "padding", "Padding mask (real keys only)", "choromanski22 Sec. 3.1, Fig. 2", "N",
    problem=padding_problem,
    dense_mask=lambda p: ref_masks.padding_mask(p.extras["key_mask"]),
    fast_mask=lambda p, device: fast.PaddingMask(torch.as_tensor(p.extras["key_mask"], device=device)),
))
