"""Registry records: softmax, linear, causal, packing, padding (choromanski22 Sec. 2-3.1)."""
from __future__ import annotations

import numpy as np
import torch

import fast
import reference.attention as ref_attention
from measure import roofline
from reference.masks import sequence as ref_masks
from verify.favor import favor_mechanism, favor_problem, favor_tensors
from verify.problems import Problem, rng_for
from verify.registry import Mechanism, Roofline, Variant, register

#: perf/<id> of the linear family: fast.favor_attention at d = m = 64 against the matmul rate;
#: the issue's targets (linear >= 0.70, causal >= 0.50) are stated at N = 2^16 (the full run).
TARGET_N = 2**16

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
        # O(N^2): a smaller N than the linear family's (2^11: ~0.1 s per call on one thread here)
        roofline=Roofline("matmul", roofline.softmax_case, quick_n=2**11, n=2**13),
    )
)

# ---------------------------------------------------------------------------- linear family

register(favor_mechanism(
    "linear", "Unmasked linear attention, FAVOR+", "choromanski22 Eq. 3", "N",
    dense_mask=None, fast_mask=None, scale=True, scale_train=True,
    roofline=Roofline("matmul", roofline.favor_case(None), target=0.70, target_n=TARGET_N),
))

#: The default variant's chunk: None, CausalMask's own rule (chunk_for(m, d): C = 16 at the
#: registry's m = d = 16, so equivalence's N = 37, 300, 1000 end in a ragged chunk).
CAUSAL_CHUNK = None


def causal_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), chunk: int | None = CAUSAL_CHUNK) -> Problem:
    """FAVOR+ inputs; extras["chunk"]: the scan's chunk C (the variants' option; None: the mask's rule)."""
    return favor_problem(n, seed, batch=batch, chunk=None if chunk is None else int(chunk))


register(favor_mechanism(
    "causal", "Causal mask, chunked scan", "choromanski22 Sec. 3.1", "N",
    problem=causal_problem,
    dense_mask=lambda p: ref_masks.causal_mask(p.n),
    fast_mask=lambda p, device: fast.CausalMask(
        p.n, chunk=None if p.extras["chunk"] is None else int(p.extras["chunk"])),
    scale=True, scale_train=True,
    # perf times the operator a user gets: fast.CausalMask(N) with its default chunk
    roofline=Roofline("matmul", roofline.favor_case(lambda n, device: fast.CausalMask(n), executed="causal"),
                      target=0.50, target_n=TARGET_N),
    # the chunk changes constants, not the class: the options are equivalence-only. 7 divides
    # none of equivalence's N (1, 2, 37, 64, 300, 1000), so the last chunk is always ragged
    variants=(
        Variant("default", "chunk C chosen by CausalMask from m and d (16 here)"),
        Variant("chunk-64", "chunk C = 64 (the default before issue 11): 37 < C, 300 = 4 C + 44",
                params={"chunk": 64}, sweep=False),
        Variant("chunk-1", "chunk C = 1: every token its own chunk (no intra-chunk block)",
                params={"chunk": 1}, sweep=False),
        Variant("chunk-7", "chunk C = 7: N never a multiple of C (a zero-padded last chunk)",
                params={"chunk": 7}, sweep=False),
        Variant("chunk-above-n", "chunk C = 4096 > N: one chunk, the scan is the dense triangle",
                params={"chunk": 4096}, sweep=False),
    ),
))


def _per_sample_shape(batch: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Shape of per-sample mask data for q (*batch, N, d): (B, 1, ..., 1, N) (one row per sample,
    shared by the heads and any further dims); (N,) unbatched."""
    return (batch[0], *(1,) * (len(batch) - 1), n) if batch else (n,)


def _segment_runs(n: int, runs: int, rng: np.random.Generator) -> np.ndarray:
    """Run index (n,) of ``runs`` contiguous runs (at most n) with random boundaries: 0, 0, 1, 1, 1, 2, ..."""
    cut = np.zeros(n, dtype=np.int64)
    if n > 1 and runs > 1:
        cut[rng.choice(np.arange(1, n), size=min(runs - 1, n - 1), replace=False)] = 1
    return np.cumsum(cut)


def _scatter_labels(run: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Labels for run indices: arbitrary int64 values (large, negative, not consecutive) from a pool
    of max(2, runs // 2) labels, adjacent runs different, so that labels REAPPEAR in runs that are
    not contiguous (a packing mask is "same id", not "same run")."""
    runs = int(run[-1]) + 1
    pool = rng.choice(np.arange(-(2**40), 2**40, 2**30 + 7), size=max(2, runs // 2), replace=False)
    labels = np.empty(runs, dtype=np.int64)
    for r in range(runs):
        choices = pool if r == 0 else pool[pool != labels[r - 1]]
        labels[r] = rng.choice(choices)
    return labels[run]


#: Packing: default segments per token (at least min(n, 4)); the scattered variant's runs are shorter.
TOKENS_PER_SEGMENT = 256
TOKENS_PER_RUN = 16


def packing_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), labels: str = "consecutive") -> Problem:
    """Packed segments with random boundaries; segment_ids of shape (B, 1, N) with batch (B, H)
    (every sample its own packing, the heads share it), (N,) without.

    labels "consecutive": contiguous segments 0, 1, 2, ... (about one per 256 tokens, at least
    min(n, 4)); "scattered": runs of about 16 tokens labelled by arbitrary int64 values that
    reappear in non-adjacent runs (``_scatter_labels``): tokens of two runs with the same label
    attend to each other.
    """
    if labels not in ("consecutive", "scattered"):
        raise ValueError(f"labels must be 'consecutive' or 'scattered', got {labels!r}")
    rng = rng_for(seed, 20)
    shape = _per_sample_shape(batch, n)
    samples = shape[0] if batch else 1
    ids = np.empty((samples, n), dtype=np.int64)
    for b in range(samples):
        if labels == "consecutive":  # small N still has several segments to keep apart
            ids[b] = _segment_runs(n, max(min(n, 4), n // TOKENS_PER_SEGMENT), rng)
        else:
            ids[b] = _scatter_labels(_segment_runs(n, max(min(n, 4), n // TOKENS_PER_RUN), rng), rng)
    return favor_problem(n, seed, batch=batch, segment_ids=ids.reshape(shape))


register(favor_mechanism(
    "packing", "Packing mask (segment ids)", "choromanski22 Sec. 3.1, Fig. 2", "N",
    problem=packing_problem,
    dense_mask=lambda p: ref_masks.packing_mask(p.extras["segment_ids"]),
    fast_mask=lambda p, device: fast.PackingMask(torch.as_tensor(p.extras["segment_ids"], device=device)),
    # the generic blocked path (segment sums of the N x m d blocks of phi_k v^T, ~60x the two GEMMs'
    # time at d = m = 64): executed FLOPs not counted, and a smaller N to stay within --quick's time
    roofline=Roofline("matmul", roofline.favor_case("registry", executed="unknown"), quick_n=2**12, n=2**14),
    variants=(
        Variant("default", "contiguous segments labelled 0, 1, 2, ..."),
        Variant("scattered-ids", "arbitrary int64 labels reappearing in non-adjacent runs",
                params={"labels": "scattered"}, sweep=False),
    ),
))

#: Padding's hostile variant: padded values and huge keys are multiplied by this (float32 squares
#: of 1e4 * unit vectors stay far from overflow).
HUGE = 1e4


def padding_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), padded: str = "plain") -> Problem:
    """Right padding: a key mask keeping a random 60-90% prefix (at least one token) of every sample;
    key_mask of shape (B, 1, N) with batch (B, H) (lengths differ per sample), (N,) without.

    padded "plain": padded tokens hold ordinary draws. "hostile": padded KEYS alternate between the
    loudest key FAVOR+ allows (k = 2 w_f* for the longest projection row w_f*: exponent
    |w_f*|^2 / 2, the largest any key can reach) and huge keys (HUGE times a unit vector), and
    padded VALUES are multiplied by HUGE: a stabiliser that looks at padded keys is moved as far as
    keys can move it (in the quiet slice of batched problems, ~150 above the real keys: float32
    underflows), and any weight leaking onto a padded key shows at 1e4 times the values. Padded
    QUERIES keep their ordinary draws: their outputs (attention over the real keys, defined by the
    reference too) are compared like the others; huge queries would make the float64 reference's
    unstabilised features underflow to 0 (exp(-|q|^2 / 8)), and PaddingMask documents padded
    queries' outputs as ignorable anyway.
    """
    if padded not in ("plain", "hostile"):
        raise ValueError(f"padded must be 'plain' or 'hostile', got {padded!r}")
    rng = rng_for(seed, 21)
    shape = _per_sample_shape(batch, n)
    samples = shape[0] if batch else 1
    lengths = np.maximum(1, np.round(n * rng.uniform(0.6, 0.9, samples)).astype(np.int64))
    key_mask = (np.arange(n) < lengths[:, None]).reshape(shape)
    p = favor_problem(n, seed, batch=batch, key_mask=key_mask, padded=padded)
    if padded == "hostile":
        pad = np.broadcast_to(~key_mask[..., None], p.k.shape)  # (*batch, N, 1) -> (*batch, N, d)
        w = p.projection
        loud = 2.0 * w[np.argmax(np.linalg.norm(w, axis=1))] * np.ones_like(p.k)
        unit = p.k / np.linalg.norm(p.k, axis=-1, keepdims=True)
        alternate = (np.arange(n) % 2 == 0)[:, None]
        hostile_k = np.where(alternate, loud, HUGE * unit)
        p.k = np.where(pad, hostile_k, p.k)
        p.v = np.where(np.broadcast_to(~key_mask[..., None], p.v.shape), HUGE * p.v, p.v)
    return p


register(favor_mechanism(
    "padding", "Padding mask (real keys only)", "choromanski22 Sec. 3.1, Fig. 2", "N",
    problem=padding_problem,
    dense_mask=lambda p: ref_masks.padding_mask(p.extras["key_mask"]),
    fast_mask=lambda p, device: fast.PaddingMask(torch.as_tensor(p.extras["key_mask"], device=device)),
    roofline=Roofline("matmul", roofline.favor_case("registry", executed="padding")),
    variants=(
        Variant("default", "padded tokens hold ordinary draws"),
        Variant("hostile-padding", "padded keys as loud as FAVOR+ allows or huge, padded values x 1e4",
                params={"padded": "hostile"}, sweep=False),
    ),
))
