"""verify/mechanisms/sequence.py: the problems of the sequence records are what they claim, and
every option variant really exercises its option."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.masks import sequence as ref_masks
from verify.checks import equivalence
from verify.mechanisms import sequence as S
from verify.mechanisms import get
from verify.registry import EQUIVALENCE_BATCH

B, H = EQUIVALENCE_BATCH


@pytest.mark.parametrize("n", [1, 2, 300, 1100])
def test_packing_problem_segments(n):
    p = S.packing_problem(n, seed=3)
    ids = p.extras["segment_ids"]
    assert ids.shape == (n,) and ids[0] == 0
    assert np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)  # contiguous, consecutive labels
    assert ids.max() + 1 == max(min(n, 4), n // 256)  # one per 256 tokens, at least min(n, 4)
    np.testing.assert_array_equal(get("packing").dense_mask(p), ref_masks.packing_mask(ids))


@pytest.mark.parametrize("labels", ["consecutive", "scattered"])
def test_batched_packing_ids_are_per_sample(labels):
    p = S.packing_problem(300, seed=5, batch=EQUIVALENCE_BATCH, labels=labels)
    ids = p.extras["segment_ids"]
    assert ids.shape == (B, 1, 300) and ids.dtype == np.int64
    assert not np.array_equal(ids[0], ids[1])  # every sample its own packing
    mask = ref_masks.packing_mask(ids)
    assert mask.shape == (B, 1, 300, 300)  # broadcasts over the heads


def _runs(ids: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(ids[1:] != ids[:-1])])


@pytest.mark.parametrize("n", [4, 37, 300])
@pytest.mark.parametrize("seed", range(3))
def test_scattered_ids_reappear_in_runs_that_are_not_adjacent(n, seed):
    """Labels are arbitrary int64 (not 0, 1, 2, ...), adjacent runs differ, and some label owns two
    runs: the "same id" mask differs from a "same run" mask, which the variant must expose."""
    ids = S.packing_problem(n, seed, labels="scattered").extras["segment_ids"]
    run = _runs(ids)
    labels = ids[np.r_[0, np.flatnonzero(np.diff(run)) + 1]]  # one label per run
    assert np.all(labels[1:] != labels[:-1])
    assert len(np.unique(labels)) < len(labels)  # a label reappears (in a non-adjacent run)
    assert not np.array_equal(np.unique(ids), np.arange(len(np.unique(ids))))  # not consecutive
    assert not np.array_equal(ref_masks.packing_mask(ids), ref_masks.packing_mask(run))


def test_packing_variant_scattered_runs_through_the_fast_mask():
    mech = get("packing")
    p = mech.problem(37, 0, "scattered-ids", batch=EQUIVALENCE_BATCH)
    op = mech.fast_mask(p, "cpu")
    x = torch.randn(B, H, 37, 3, dtype=torch.float64)
    np.testing.assert_allclose(op.matmul(x).numpy(), mech.dense_mask(p) @ x.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 10, 500])
def test_padding_problem_keeps_a_60_to_90_percent_prefix(n):
    p = S.padding_problem(n, seed=4)
    km = p.extras["key_mask"]
    length = int(km.sum())
    assert km.dtype == bool and np.array_equal(km, np.arange(n) < length)
    assert length >= 1
    if n >= 10:
        assert 0.6 * n - 0.5 <= length <= 0.9 * n + 0.5


def test_batched_padding_lengths_are_per_sample():
    km = S.padding_problem(300, seed=4, batch=EQUIVALENCE_BATCH).extras["key_mask"]
    assert km.shape == (B, 1, 300) and km.dtype == bool
    lengths = km.sum(-1).ravel()
    assert len(set(lengths.tolist())) == B  # different per sample
    for b in range(B):
        assert np.array_equal(km[b, 0], np.arange(300) < lengths[b]) and 180 <= lengths[b] <= 270


def test_hostile_padding_only_touches_padded_keys_and_values():
    plain = S.padding_problem(300, seed=2, batch=EQUIVALENCE_BATCH)
    hostile = S.padding_problem(300, seed=2, batch=EQUIVALENCE_BATCH, padded="hostile")
    real = np.broadcast_to(plain.extras["key_mask"][..., None], plain.k.shape)
    np.testing.assert_array_equal(hostile.q, plain.q)  # padded queries keep their draws
    np.testing.assert_array_equal(hostile.k[real], plain.k[real])
    np.testing.assert_array_equal(hostile.v[real], plain.v[real])
    np.testing.assert_array_equal(hostile.v[~real], S.HUGE * plain.v[~real])
    # padded keys: the loudest FAVOR+ key (exponent |w|^2 / 2) or a huge one
    z = (hostile.k / 2) @ hostile.projection.T - (hostile.k ** 2).sum(-1, keepdims=True) / 8
    top = z.max(-1)
    pad = ~np.broadcast_to(plain.extras["key_mask"], top.shape)
    loudest = (np.linalg.norm(hostile.projection, axis=1) ** 2).max() / 2
    even = (np.arange(300) % 2 == 0)
    np.testing.assert_allclose(top[pad & even], loudest, rtol=1e-12)
    assert np.all(top[pad & ~even] < -1e6)  # huge keys: exponent ~ -|k|^2 / 8
    assert np.all(top[~pad].max() < loudest)  # louder than any real key
    # reference outputs: the padded contents change nothing anywhere
    mech = get("padding")
    np.testing.assert_allclose(mech.reference(hostile), mech.reference(plain), rtol=1e-12)


def test_causal_chunk_variants_exercise_their_option():
    mech = get("causal")
    chunks = {v.name: mech.problem(300, 0, v).extras["chunk"] for v in mech.all_variants}
    assert chunks == {"default": S.CAUSAL_CHUNK, "chunk-64": 64, "chunk-1": 1, "chunk-7": 7, "chunk-above-n": 4096}
    for v in mech.all_variants:
        p = mech.problem(37, 0, v, batch=EQUIVALENCE_BATCH)
        assert mech.fast_mask(p, "cpu").chunk == p.extras["chunk"]
        assert v.sweep == (v.name == "default")
    for n in sorted(set(equivalence.QUICK_SIZES + equivalence.FULL_SIZES)):  # 7 never divides them, 4096 exceeds them
        assert n % 7 != 0 and n < 4096, n


def test_problem_arguments_are_checked():
    with pytest.raises(ValueError, match="labels must be"):
        S.packing_problem(5, 0, labels="runs")
    with pytest.raises(ValueError, match="padded must be"):
        S.padding_problem(5, 0, padded="loud")
