"""fast.favor_blockwise's two halves, favor_key_state and favor_query_products (issue 26 follow-up):
fast.distributed.sharded_favor_attention forms each rank's key state and its queries' products a
block of rows at a time with them, rescaling each rank's state from its own constant C_r to the
global C by exp(C_r - C) before the states are summed. Here two key sets stand for two ranks: the
rescaled sum must give favor_products on the joined keys to round-off (float64: 1e-12, far above
the ~1e-15 observed and far below the O(1) error of a rescale left out), and the halves' blocked
backward must pass gradcheck."""
from __future__ import annotations

import torch
from torch.autograd import gradcheck

import fast
from fast.favor_blockwise import favor_key_state, favor_products, favor_query_products
from tests.helpers import gen, rel_frobenius


def _inputs(n_q=7, n=9, d=4, m=8, dv=3, seed=0):
    g = gen(seed)
    q, k = (torch.randn(2, n_q if i == 0 else n, d, generator=g, dtype=torch.float64) for i in range(2))
    v = torch.randn(2, n, dv, generator=g, dtype=torch.float64)
    k[1, -1] *= 3.0  # a late, large key: the second set's constant exceeds the first's
    w = fast.gaussian_projection(m, d, generator=g, dtype=torch.float64) * d ** -0.25
    return q, k, v, w


def _split(q, k, v, w, cut: int, block_rows: int):
    """out of the queries over keys[:cut] and keys[cut:] as two ranks would: states rescaled, summed."""
    parts = [favor_key_state(k[..., a:b, :], v[..., a:b, :], w, 0.25, block_rows=block_rows)
             for a, b in ((0, cut), (cut, k.shape[-2]))]
    c = torch.maximum(parts[0][2], parts[1][2])
    s = sum(p[0] * torch.exp(p[2] - c) for p in parts)
    z = sum(p[1] * torch.exp(p[2] - c).squeeze(-1) for p in parts)
    num, den = favor_query_products(q, w, s, z, block_rows=block_rows)
    return num / den.unsqueeze(-1)


def test_two_key_sets_rescaled_and_summed_equal_the_joined_keys():
    q, k, v, w = _inputs()
    whole = favor_products(q, k, v, w, w, 0.25)[0]
    for cut in (1, 4, 8):
        for block_rows in (2, 5, 100):
            assert rel_frobenius(_split(q, k, v, w, cut, block_rows), whole) <= 1e-12


def test_a_rescale_left_out_is_seen():
    q, k, v, w = _inputs()
    whole = favor_products(q, k, v, w, w, 0.25)[0]
    parts = [favor_key_state(k[..., a:b, :], v[..., a:b, :], w, 0.25) for a, b in ((0, 4), (4, 9))]
    num, den = favor_query_products(q, w, parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])
    assert rel_frobenius(num / den.unsqueeze(-1), whole) > 1e-3


def test_gradcheck_of_the_halves_over_several_blocks():
    q, k, v, w = (t.clone().requires_grad_(True) for t in _inputs(n_q=5, n=6))
    assert gradcheck(lambda a, b, c, p: _split(a, b, c, p, 3, 2), (q, k, v, w))


def test_gradient_of_the_query_half_alone():
    """num and den in S and z; in q through num / den only (the row max cancels there, not in num)."""
    q, _, v, w = _inputs()
    s = torch.rand(2, 8, 3, dtype=torch.float64, requires_grad=True)
    z = torch.rand(2, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda b, c: favor_query_products(q, w, b, c, block_rows=3), (s, z))
    q.requires_grad_(True)

    def ratio(a, b, c):
        num, den = favor_query_products(a, w, b, c, block_rows=3)
        return num / den.unsqueeze(-1)
    assert gradcheck(ratio, (q, s, z))
