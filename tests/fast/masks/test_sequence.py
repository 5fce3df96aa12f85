"""Exact structural properties of the sequence mask operators (fast/masks/sequence.py).

Hypothesis searches shapes and edge cases (N = 1, N < chunk, N not a multiple of the chunk,
leading batch dims); the properties hold exactly in exact arithmetic, so the comparisons allow
float64 round-off only (helpers.F64_RTOL).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import fast
from fast import CausalMask, DenominatorError, PackingMask, PaddingMask, masked_linear_attention
from tests.helpers import GenericMask, assert_unchanged, gen, positive, randn

seeds = st.integers(0, 2**31 - 1)
batches = st.sampled_from([(), (2,), (2, 3)])


def _inputs(batch, n, m, d, g, scale=1.0):
    return positive((*batch, n, m), g, scale=scale), positive((*batch, n, m), g, scale=scale), randn((*batch, n, d), g, scale=scale)


# ----------------------------------------------------------------------------------- causal


@given(n=st.integers(1, 40), chunk=st.integers(1, 16), t_raw=st.integers(0, 10**6), m=st.integers(1, 4),
       d=st.integers(1, 3), batch=batches, seed=seeds, generic=st.booleans(),
       scale=st.sampled_from([1.0, 1e-3, 1e6]))
@example(n=1, chunk=4, t_raw=0, m=2, d=2, batch=(), seed=0, generic=False, scale=1.0)  # N = 1
@example(n=5, chunk=8, t_raw=2, m=2, d=2, batch=(2,), seed=1, generic=False, scale=1.0)  # N < chunk
@example(n=10, chunk=4, t_raw=4, m=3, d=2, batch=(), seed=2, generic=False, scale=1e6)  # 10 = 2*4 + 2
@example(n=12, chunk=4, t_raw=3, m=3, d=2, batch=(), seed=3, generic=False, scale=1.0)  # t at a chunk edge
def test_causal_outputs_ignore_future_tokens(n, chunk, t_raw, m, d, batch, seed, generic, scale):
    t = t_raw % n
    g = gen(seed)
    pq, pk, v = _inputs(batch, n, m, d, g)
    mask = CausalMask(n, chunk=chunk)
    mask = GenericMask(mask) if generic else mask
    out = masked_linear_attention(pq, pk, v, mask)
    # fresh draws (of another magnitude) at every position after t, in queries, keys and values
    new_q, new_k, new_v = _inputs(batch, n, m, d, g, scale=scale)
    pq2, pk2, v2 = pq.clone(), pk.clone(), v.clone()
    pq2[..., t + 1:, :], pk2[..., t + 1:, :], v2[..., t + 1:, :] = new_q[..., t + 1:, :], new_k[..., t + 1:, :], new_v[..., t + 1:, :]
    out2 = masked_linear_attention(pq2, pk2, v2, mask)
    assert_unchanged(out2[..., : t + 1, :], out[..., : t + 1, :])
    if t + 1 < n:  # the perturbation is real: later outputs did move
        assert not torch.allclose(out2[..., t + 1:, :], out[..., t + 1:, :])


@given(n=st.integers(1, 30), chunk=st.integers(1, 16), m=st.integers(1, 4), d=st.integers(1, 3), seed=seeds)
def test_causal_row_i_is_unmasked_attention_over_prefix(n, chunk, m, d, seed):
    """out_i = linear attention of query i over keys 0..i (the definition, token by token)."""
    pq, pk, v = _inputs((), n, m, d, gen(seed))
    out = masked_linear_attention(pq, pk, v, CausalMask(n, chunk=chunk))
    for i in range(n):
        row = masked_linear_attention(pq[i: i + 1], pk[: i + 1], v[: i + 1], None)
        assert_unchanged(out[i: i + 1], row)


@given(n=st.integers(1, 40), chunk=st.integers(1, 50), c=st.integers(1, 5), batch=batches, seed=seeds)
def test_causal_matmul_is_prefix_sum(n, chunk, c, batch, seed):
    x = randn((*batch, n, c), gen(seed))
    got = CausalMask(n, chunk=chunk).matmul(x)
    expected = torch.tril(torch.ones(n, n, dtype=x.dtype)) @ x
    assert_unchanged(got, expected)


# ---------------------------------------------------------------------------------- padding


def _key_mask(batch, n, g):
    """Random key mask (batch..., N) with at least one real key per sample."""
    km = torch.rand(*batch, n, generator=g) < 0.6
    first = torch.randint(0, n, (*batch, 1), generator=g)
    return km.scatter(-1, first, True)


@given(n=st.integers(1, 30), m=st.integers(1, 4), d=st.integers(1, 3), batch=st.sampled_from([(1,), (3,), (2, 2)]),
       seed=seeds, generic=st.booleans(), scale=st.sampled_from([1.0, 1e-3, 1e6]))
@example(n=1, m=2, d=2, batch=(1,), seed=0, generic=False, scale=1e6)
def test_padding_outputs_ignore_padded_tokens(n, m, d, batch, seed, generic, scale):
    g = gen(seed)
    pq, pk, v = _inputs(batch, n, m, d, g)
    km = _key_mask(batch, n, g)
    mask = PaddingMask(km)
    mask = GenericMask(mask) if generic else mask
    out = masked_linear_attention(pq, pk, v, mask)
    new_q, new_k, new_v = _inputs(batch, n, m, d, g, scale=scale)
    pad = ~km
    pq2, pk2, v2 = pq.clone(), pk.clone(), v.clone()
    pq2[pad], pk2[pad], v2[pad] = new_q[pad], new_k[pad], new_v[pad]
    out2 = masked_linear_attention(pq2, pk2, v2, mask)
    assert_unchanged(out2[km], out[km])


@given(n=st.integers(1, 30), m=st.integers(1, 4), d=st.integers(1, 3), seed=seeds, generic=st.booleans())
def test_padding_equals_attention_over_real_tokens_only(n, m, d, seed, generic):
    """Padded keys leave both numerator and denominator (the docs/papers.md Sec. 5 bug zeroed V only)."""
    g = gen(seed)
    pq, pk, v = _inputs((2,), n, m, d, g)
    km = _key_mask((2,), n, g)
    mask = PaddingMask(km)
    out = masked_linear_attention(pq, pk, v, GenericMask(mask) if generic else mask)
    for b in range(2):
        real = km[b]
        expected = masked_linear_attention(pq[b], pk[b][real], v[b][real], None)  # every query, real keys
        assert_unchanged(out[b], expected)


@given(n=st.integers(1, 20), bad=st.integers(0, 2), seed=seeds)
def test_fully_padded_sample_generic_path_raises_denominator_error(n, bad, seed):
    """The generic driver knows nothing of padding: a row with no visible key is reported."""
    g = gen(seed)
    pq, pk, v = _inputs((3,), n, 3, 2, g)
    km = _key_mask((3,), n, g)
    km[bad] = False  # sample ``bad`` has no real key: its denominators are all zero
    with pytest.raises(DenominatorError):
        masked_linear_attention(pq, pk, v, GenericMask(PaddingMask(km)))


@given(n=st.integers(1, 20), bad=st.integers(0, 2), seed=seeds)
def test_fully_padded_sample_attend_path_follows_the_no_key_policy(n, bad, seed):
    """PaddingMask.attend: the queries of a fully padded sample see no key. By default that is a
    DenominatorError naming no_key (it used to return 0 silently, against the docs); with
    no_key="zero" they get output 0 (never NaN) and the other samples are exactly what they are
    without it."""
    g = gen(seed)
    pq, pk, v = _inputs((3,), n, 3, 2, g)
    km = _key_mask((3,), n, g)
    km[bad] = False
    with pytest.raises(DenominatorError, match="no_key"):
        masked_linear_attention(pq, pk, v, PaddingMask(km))
    out = masked_linear_attention(pq, pk, v, PaddingMask(km), no_key="zero")
    assert torch.equal(out[bad], torch.zeros_like(out[bad]))
    others = [b for b in range(3) if b != bad]
    alone = masked_linear_attention(pq[others], pk[others], v[others], PaddingMask(km[others]))
    assert_unchanged(out[others], alone)


def test_padding_zero_feature_padded_query_does_not_break_real_outputs():
    g = gen(0)
    n = 6
    x = randn((n, 4), g).abs() + 0.1  # ReLU(x) > 0 for the real tokens
    x[4:] = 0.0  # right padding, zero-filled as usual
    v = randn((n, 2), g)
    km = torch.arange(n) < 4
    relu = fast.ReLU()
    out = masked_linear_attention(relu(x), relu(x), v, PaddingMask(km))
    expected = masked_linear_attention(relu(x[:4]), relu(x[:4]), v[:4], None)
    assert_unchanged(out[:4], expected)


def test_padding_from_lengths_is_right_padding():
    mask = PaddingMask.from_lengths(torch.tensor([0, 2, 5]), 5)
    expected = torch.tensor([[False] * 5, [True, True, False, False, False], [True] * 5])
    assert mask.n == 5
    assert torch.equal(mask.key_mask, expected)


# ---------------------------------------------------------------------------------- packing


@st.composite
def segmentations(draw, max_n=30):
    """(labels (N,), chosen label): arbitrary distinct integer labels, interleaved positions."""
    n = draw(st.integers(1, max_n))
    names = draw(st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=5, unique=True))
    ids = draw(st.lists(st.sampled_from(names), min_size=n, max_size=n))
    return torch.tensor(ids, dtype=draw(st.sampled_from([torch.int64, torch.int32, torch.int16]))
                        if max(map(abs, ids)) < 2**15 else torch.int64)


@given(ids=segmentations(), which=st.integers(0, 10**6), m=st.integers(1, 4), d=st.integers(1, 3), seed=seeds,
       scale=st.sampled_from([1.0, 1e6]))
@example(ids=torch.tensor([7, -3, 7, 100, -3, 100, 7]), which=0, m=2, d=2, seed=0, scale=1e6)
def test_packing_segments_are_isolated(ids, which, m, d, seed, scale):
    n = ids.numel()
    g = gen(seed)
    pq, pk, v = _inputs((), n, m, d, g)
    mask = PackingMask(ids)
    out = masked_linear_attention(pq, pk, v, mask)
    labels = torch.unique(ids)
    inside = ids == labels[which % labels.numel()]
    new_q, new_k, new_v = _inputs((), n, m, d, g, scale=scale)
    pq2, pk2, v2 = pq.clone(), pk.clone(), v.clone()
    pq2[inside], pk2[inside], v2[inside] = new_q[inside], new_k[inside], new_v[inside]
    out2 = masked_linear_attention(pq2, pk2, v2, mask)
    assert_unchanged(out2[~inside], out[~inside])


@given(ids=segmentations(), m=st.integers(1, 4), d=st.integers(1, 3), seed=seeds)
def test_packing_each_segment_is_plain_attention_on_its_tokens(ids, m, d, seed):
    n = ids.numel()
    pq, pk, v = _inputs((), n, m, d, gen(seed))
    out = masked_linear_attention(pq, pk, v, PackingMask(ids))
    for label in torch.unique(ids):
        sel = ids == label
        assert_unchanged(out[sel], masked_linear_attention(pq[sel], pk[sel], v[sel], None))


@given(ids=segmentations(), shift=st.integers(-1000, 1000), seed=seeds)
def test_packing_depends_only_on_the_partition(ids, shift, seed):
    """Relabelling segments injectively (here: reversing order and shifting) changes nothing."""
    pq, pk, v = _inputs((), ids.numel(), 3, 2, gen(seed))
    relabelled = (-ids.to(torch.int64) * 3 + shift)
    out = masked_linear_attention(pq, pk, v, PackingMask(ids))
    assert_unchanged(masked_linear_attention(pq, pk, v, PackingMask(relabelled)), out)


@given(n=st.integers(1, 20), c=st.integers(1, 4), seed=seeds)
def test_packing_matmul_is_segment_sum(n, c, seed):
    g = gen(seed)
    ids = torch.randint(-3, 3, (n,), generator=g) * 17
    x = randn((2, n, c), g)
    dense = (ids[:, None] == ids[None, :]).to(x.dtype)
    assert_unchanged(PackingMask(ids).matmul(x), dense @ x)


def test_packing_batched_segment_ids_broadcast_over_heads():
    """segment_ids (B, 1, N) for inputs (B, H, N, m): each sample uses its own segmentation."""
    g = gen(5)
    b, h, n = 2, 3, 9
    ids = torch.stack([torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2]), torch.tensor([5, 9, 5, 9, 5, 9, 5, 9, 5])])
    pq, pk, v = _inputs((b, h), n, 3, 2, g)
    out = masked_linear_attention(pq, pk, v, PackingMask(ids[:, None, :]))
    for i in range(b):
        for j in range(h):
            assert_unchanged(out[i, j], masked_linear_attention(pq[i, j], pk[i, j], v[i, j], PackingMask(ids[i])))


@pytest.mark.parametrize("x_shape", [(2, 4, 6, 3), (1, 4, 6, 3), (2, 1, 6, 3)])
def test_packing_batched_ids_sharing_labels_with_broadcast_inputs(x_shape):
    """ids (B, 1, N) whose samples use the same labels, against inputs that broadcast on either
    leading dim: each (sample, head) slice sums its own segments only (a label of one sample never
    meets the same label in another sample or head), forward and backward, as the dense mask."""
    g = gen(11)
    ids = torch.tensor([[3, 3, 7, 7, 7, 3], [7, 3, 3, 3, 7, 7]])[:, None, :]
    dense = (ids[..., :, None] == ids[..., None, :]).double()  # (2, 1, 6, 6)
    x = randn(x_shape, g).requires_grad_(True)
    y = randn((2, 4, 6, 3), g)
    out = PackingMask(ids).matmul(x)
    want = dense @ x
    assert_unchanged(out.detach(), want.detach().expand(out.shape))
    assert_unchanged(torch.autograd.grad((out * y).sum(), x)[0], torch.autograd.grad((want * y).sum(), x)[0])


@given(n=st.integers(1, 20), c=st.integers(1, 4), seed=seeds)
def test_padding_matmul_sums_real_rows(n, c, seed):
    g = gen(seed)
    km = _key_mask((), n, g)
    x = randn((3, n, c), g)
    dense = km[None, :].expand(n, n).to(x.dtype)
    assert_unchanged(PaddingMask(km).matmul(x), dense @ x)


def test_mask_operators_satisfy_the_protocol():
    for mask in (CausalMask(4), PackingMask(torch.tensor([1, 2, 2, 1])), PaddingMask(torch.tensor([True, False]))):
        assert isinstance(mask, fast.MaskOperator)
    assert not isinstance(object(), fast.MaskOperator)
    assert np.array_equal(PackingMask(torch.tensor([4, -1, 4])).segment_index.numpy(), [1, 0, 1])


def test_a_fully_padded_sample_is_named_by_its_key_mask():
    """The error says what emptied the rows: key_mask, not only "their mask row is all zero" (issue 24)."""
    g = gen(0)
    pq, pk, v = _inputs((2,), 4, 3, 2, g)
    km = torch.tensor([[True, True, False, False], [False, False, False, False]])
    with pytest.raises(DenominatorError, match=r"4 of 8 queries see no key \(their mask row is all zero: key_mask "
                                               r"is False at every key of their sample, a fully padded sample\)"):
        masked_linear_attention(pq, pk, v, PaddingMask(km))
    with pytest.raises(DenominatorError, match=r"4 of 8 queries see no key \(their mask row is all zero: key_mask"):
        fast.favor_attention(pq, pk, v, randn((5, 3), g), PaddingMask(km))


def test_a_duck_typed_mask_declares_its_no_key_cause():
    """OperatorAdapter reads no_key_cause off the object (fast.operator), default None."""
    from fast.operator import as_operator

    class Rows:
        n = 3
        nonnegative = True
        no_key_cause = "rows is empty at queries 1 and 2"

        def matmul(self, x):
            return torch.cat([x.sum(-2, keepdim=True), torch.zeros_like(x[..., 1:, :])], -2)

    assert as_operator(Rows()).no_key_cause == "rows is empty at queries 1 and 2"
    with pytest.raises(DenominatorError, match=r"2 of 3 queries see no key \(their mask row is all zero: rows is empty"):
        masked_linear_attention(torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 1), Rows())
    assert as_operator(PaddingMask(torch.ones(3, dtype=torch.bool))).no_key_cause.startswith("key_mask")


def test_absurd_padding_length_is_refused_before_allocating():
    with pytest.raises(MemoryError, match=r"n = 1152921504606846976 asks for the key mask \(B, n\)"):
        PaddingMask.from_lengths(torch.tensor([1]), 2**60)
