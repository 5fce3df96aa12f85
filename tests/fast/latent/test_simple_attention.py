"""fast/latent/simple_attention.py (DIFFormer, SGFormer): against the dense NumPy reference, graphs that
never mix, the score term made visible, zero norms, the guard, gradients and bad input.

Inputs have leading dims (2, 2) = (batch, heads) and a batch vector of 3 uneven graphs (with a
gap label: an empty graph). q and k are shifted by a constant: on centred random inputs the
score term q~ . k~ moves the outputs by only ~5e-4 (docs/papers.md, section 7), which a float32
comparison at 1e-4 can hardly see; test_score_term_is_visible asserts that it moves them by far
more than the tolerance here.
"""
from __future__ import annotations

import pytest
import torch

import fast.segments as segments
import reference.latent.simple_attention as ref
from fast.errors import DenominatorError
from fast.latent.simple_attention import difformer_attention, frobenius_normalize, sgformer_attention
from tests.helpers import EQUIV_TOL, gen, np_, randn, rel_frobenius

FUNCS = {"difformer": (difformer_attention, ref.difformer_attention),
         "sgformer": (sgformer_attention, ref.sgformer_attention)}
SIZES = (4, 9, 6)  # three uneven graphs
BATCH = torch.tensor([0] * 4 + [2] * 9 + [3] * 6)  # label 1 is a gap (an empty graph)
N = sum(SIZES)
LEAD = (2, 2)
SHIFT = 2.0


def inputs(seed: int, dtype=torch.float64, lead=LEAD, n=N, d_qk=5, d=3, shift=SHIFT, scale=1.0):
    g = gen(seed)
    q = randn((*lead, n, d_qk), g, dtype, scale) + shift * scale
    k = randn((*lead, n, d_qk), g, dtype, scale) + shift * scale
    v = randn((*lead, n, d), g, dtype, scale)
    return q, k, v


def graph_rows(label: int) -> torch.Tensor:
    return BATCH == label


# ------------------------------------------------------------------------ fast == reference


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("joint_heads", [True, False])
@pytest.mark.parametrize("batched", [True, False])
def test_matches_reference(name, dtype, joint_heads, batched):
    fn, ref_fn = FUNCS[name]
    q, k, v = inputs(1, dtype)
    batch = BATCH if batched else None
    got = fn(q, k, v, batch=batch, joint_heads=joint_heads)
    expected = ref_fn(np_(q), np_(k), np_(v), batch=None if batch is None else batch.numpy(), joint_heads=joint_heads)
    assert got.shape == v.shape and got.dtype == dtype
    assert rel_frobenius(got, expected) <= EQUIV_TOL[dtype]


@pytest.mark.parametrize("joint_heads", [True, False])
def test_frobenius_normalize_matches_reference_and_has_unit_norms(joint_heads):
    q, _, _ = inputs(2)
    got = frobenius_normalize(q, batch=BATCH, joint_heads=joint_heads)
    assert rel_frobenius(got, ref.frobenius_normalize(np_(q), batch=BATCH.numpy(), joint_heads=joint_heads)) <= 1e-12
    for label in (0, 2, 3):
        part = got[..., graph_rows(label), :]
        norms = part.pow(2).sum((-3, -2, -1) if joint_heads else (-2, -1)).sqrt()
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=1e-13, atol=0)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_score_term_is_visible(name):
    """The comparison can see the score term: dropping it (q = 0, its exact limit) moves the
    outputs by > 100x the float32 tolerance, and the reference agrees on both."""
    fn, ref_fn = FUNCS[name]
    q, k, v = inputs(3)
    with_scores = fn(q, k, v, batch=BATCH)
    without = fn(torch.zeros_like(q), k, v, batch=BATCH)
    assert rel_frobenius(with_scores, without) > 100 * EQUIV_TOL[torch.float32]
    assert rel_frobenius(without, ref_fn(0 * np_(q), np_(k), np_(v), batch=BATCH.numpy())) <= 1e-12


def test_many_graphs_path_matches_reference(monkeypatch):
    """More graphs than FEW_SEGMENTS: the blocked gather path (several blocks), including one-node
    graphs (output v_u) and gaps."""
    g = gen(4)
    sizes = torch.randint(1, 5, (90,), generator=g)
    labels = torch.arange(90) * 2  # every other label empty
    batch = torch.repeat_interleave(labels, sizes)
    n = int(sizes.sum())
    q, k, v = inputs(5, lead=(2,), n=n)
    monkeypatch.setattr(segments, "OUTER_BLOCK_ELEMENTS", 200)
    assert 90 > segments.FEW_SEGMENTS
    for name, (fn, ref_fn) in FUNCS.items():
        got = fn(q, k, v, batch=batch)
        assert rel_frobenius(got, ref_fn(np_(q), np_(k), np_(v), batch=batch.numpy())) <= 1e-10, name
    single = torch.nonzero(sizes == 1)[0, 0]
    u = int(sizes[:single].sum())
    torch.testing.assert_close(difformer_attention(q, k, v, batch=batch)[..., u, :], v[..., u, :])


# ------------------------------------------------------------------------ graphs never mix


def _others_unchanged(fn, seed: int = 6) -> bool:
    """Perturb q, k and v of graph 2 (label 2): are the outputs of the other graphs bit-identical?"""
    q, k, v = inputs(seed)
    g = gen(seed + 1)
    rows = graph_rows(2)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[..., rows, :] += 3 * torch.randn(q2[..., rows, :].shape, generator=g, dtype=q.dtype)
    k2[..., rows, :] *= 5.0
    v2[..., rows, :] += 1.0
    a, b = fn(q, k, v, batch=BATCH), fn(q2, k2, v2, batch=BATCH)
    assert not torch.equal(a[..., rows, :], b[..., rows, :])  # the perturbation does something
    return torch.equal(a[..., ~rows, :], b[..., ~rows, :])


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("joint_heads", [True, False])
def test_graphs_never_mix(name, joint_heads):
    fn = FUNCS[name][0]
    assert _others_unchanged(lambda q, k, v, batch: fn(q, k, v, batch=batch, joint_heads=joint_heads))


def test_the_mixing_check_can_fail():
    """The public batched DIFFormer normalises Q and K over the whole batch: the check above
    catches that variant, and the same variant with per-graph norms passes it."""
    assert not _others_unchanged(_whole_batch_difformer)
    assert _others_unchanged(_per_graph_difformer)
    q, k, v = inputs(6)
    assert rel_frobenius(_per_graph_difformer(q, k, v, BATCH), difformer_attention(q, k, v, batch=BATCH)) <= 1e-12


def _whole_batch_difformer(q, k, v, batch):
    """DIFFormer with the peer's whole-batch Frobenius norm, per graph otherwise (dense, float64)."""
    return _dense_difformer(q / q.square().sum((-3, -2, -1), keepdim=True).sqrt(),
                            k / k.square().sum((-3, -2, -1), keepdim=True).sqrt(),
                            v, batch)


def _per_graph_difformer(q, k, v, batch):
    return _dense_difformer(frobenius_normalize(q, batch=batch), frobenius_normalize(k, batch=batch), v, batch)


def _dense_difformer(qn, kn, v, batch):
    same = (batch[:, None] == batch[None, :]).to(qn.dtype)
    scores = same * (1 + qn @ kn.transpose(-1, -2))
    return (scores @ v) / scores.sum(-1, keepdim=True)


# ------------------------------------------------------------------------ the formulas


def test_difformer_and_sgformer_differ_as_the_formulas_say():
    """sg - dif = (N_g v_u - sum_{w in g} v_w) / den_u, den_u = N_g + q~_u . sum_{w in g} k~_w."""
    q, k, v = inputs(7)
    dif, sg = difformer_attention(q, k, v, batch=BATCH), sgformer_attention(q, k, v, batch=BATCH)
    assert rel_frobenius(sg, dif) > 0.1
    qn, kn = frobenius_normalize(q, batch=BATCH), frobenius_normalize(k, batch=BATCH)
    for label, n_g in zip((0, 2, 3), SIZES):
        rows = graph_rows(label)
        den = n_g + qn[..., rows, :] @ kn[..., rows, :].sum(-2, keepdim=True).transpose(-1, -2)
        expected = (n_g * v[..., rows, :] - v[..., rows, :].sum(-2, keepdim=True)) / den
        torch.testing.assert_close(sg[..., rows, :] - dif[..., rows, :], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_joint_heads_changes_the_result(name):
    """Heads share one norm (joint) or have their own: different q~, different outputs (each
    equals its reference in test_matches_reference)."""
    fn = FUNCS[name][0]
    q, k, v = inputs(8)
    q = q * torch.tensor([1.0, 4.0], dtype=q.dtype).view(1, 2, 1, 1)  # heads of unequal size
    joint, apart = fn(q, k, v, batch=BATCH, joint_heads=True), fn(q, k, v, batch=BATCH, joint_heads=False)
    assert rel_frobenius(joint, apart) > 1e-2
    q2 = q[..., 0:1, :, :]  # one head: the two readings agree exactly
    assert torch.equal(fn(q2, k[..., :1, :, :], v[..., :1, :, :], batch=BATCH, joint_heads=True),
                       fn(q2, k[..., :1, :, :], v[..., :1, :, :], batch=BATCH, joint_heads=False))


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("batched", [True, False])
def test_joint_heads_rule(name, batched):
    """joint_heads=None (default): a 4-D (B, H, N, d) input spans H (= True); a 3-D (B, N, d) input
    keeps its samples apart (= False: scaling sample 1 leaves sample 0 bit for bit unchanged);
    True reads a 3-D input as (H, N, d) (fast.latent.layers' layout) and equals the 4-D (1, H, N, d)
    default. Each equals the reference under the same rule."""
    fn, ref_fn = FUNCS[name]
    batch = BATCH if batched else None
    rb = None if batch is None else batch.numpy()
    q, k, v = inputs(22)
    q = q * torch.tensor([1.0, 4.0], dtype=q.dtype).view(1, 2, 1, 1)  # heads of unequal size
    assert torch.equal(fn(q, k, v, batch=batch), fn(q, k, v, batch=batch, joint_heads=True))
    q3, k3, v3 = q[0], k[0], v[0]  # (2, N, d)
    default3 = fn(q3, k3, v3, batch=batch)
    assert torch.equal(default3, fn(q3, k3, v3, batch=batch, joint_heads=False))
    scaled = q3.clone()
    scaled[1] *= 100.0
    assert torch.equal(fn(scaled, k3, v3, batch=batch)[0], default3[0])  # no cross-sample leak
    as_heads = fn(q3, k3, v3, batch=batch, joint_heads=True)
    assert rel_frobenius(as_heads, fn(q3[None], k3[None], v3[None], batch=batch)[0]) <= 1e-15
    assert rel_frobenius(as_heads, default3) > 1e-3  # the two readings of 3-D really differ (~5e-3)
    for joint in (None, True, False):
        expected = ref_fn(np_(q3), np_(k3), np_(v3), batch=rb, joint_heads=joint)
        assert rel_frobenius(fn(q3, k3, v3, batch=batch, joint_heads=joint), expected) <= EQUIV_TOL[q.dtype]
    with pytest.raises(TypeError, match="joint_heads"):
        fn(q, k, v, joint_heads="yes")
    with pytest.raises(TypeError, match="joint_heads"):
        frobenius_normalize(q, joint_heads=1)


# ------------------------------------------------------------------------ zero norms, extremes


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_zero_q_gives_the_limit_with_finite_gradient(name, dtype):
    """q = 0 on one graph (and then everywhere): q~ = 0 there, the output is the constant term's
    average (DIFFormer: the graph's mean value; SGFormer: v_u), equal to the reference, and the
    gradient is finite (exactly 0 for the zeroed graph's q)."""
    fn, ref_fn = FUNCS[name]
    q, k, v = inputs(9, dtype)
    rows = graph_rows(3)
    q[..., rows, :] = 0
    q.requires_grad_(True)
    out = fn(q, k, v, batch=BATCH)
    assert torch.isfinite(out).all()
    assert rel_frobenius(out, ref_fn(np_(q), np_(k), np_(v), batch=BATCH.numpy())) <= EQUIV_TOL[dtype]
    limit = v[..., rows, :].mean(-2, keepdim=True).expand_as(v[..., rows, :]) if name == "difformer" else v[..., rows, :]
    torch.testing.assert_close(out[..., rows, :], limit)
    out.square().sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.equal(q.grad[..., rows, :], torch.zeros_like(q.grad[..., rows, :]))
    assert q.grad[..., ~rows, :].abs().max() > 0
    everywhere = fn(torch.zeros_like(q), torch.zeros_like(k), v, batch=BATCH)
    assert torch.isfinite(everywhere).all()


def test_frobenius_normalize_zero_graph_and_gradient():
    x = randn((3, N, 4), gen(10)).requires_grad_(True)
    with torch.no_grad():
        x[:, graph_rows(0), :] = 0
    y = frobenius_normalize(x, batch=BATCH)
    assert torch.equal(y[:, graph_rows(0), :], torch.zeros(3, 4, 4, dtype=x.dtype))
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[:, graph_rows(0), :], torch.zeros(3, 4, 4, dtype=x.dtype))


U32 = 2.0**-24  # float32 unit round-off


def float32_bound(q, k, v, batch, own_value: bool, joint: bool = True) -> float:
    """A first-order bound on the relative Frobenius error of one float32 evaluation, derived from
    the inputs (float64, dense). Row u of graph g is num_u / den_u with
        num_u = C_u + sum_{w in g} (q~_u . k~_w) v_w,   den_u = N_g + sum_{w in g} q~_u . k~_w;
    every quantity is a sum of at most m = (H N_g d_qk) (a norm) + N_g (a state) + d_qk (a dot)
    + 3 (input scaling, the fold, the division) rounded steps, so (recursive summation, Higham
    Lemma 3.1/3.3) |fl(num_u) - num_u| <= m u A_u and |fl(den_u) - den_u| <= m u D_u with the
    absolute-value sums A_u = |C|_u + sum_w |q~_u|.|k~_w| |v_w|, D_u = N_g + sum_w |q~_u|.|k~_w|,
    hence |fl(z_u) - z_u| <= m u (A_u + |z_u| D_u) / den_u (to first order). The condition numbers
    A_u / |num_u| and D_u / den_u are what the inputs make them: computed here, not guessed."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    qn, kn = (frobenius_normalize(t, batch=batch, joint_heads=joint).abs() for t in (q, k))
    same = (batch[:, None] == batch[None, :]).double()
    sizes = same.sum(-1, keepdim=True)  # (N, 1)
    w = same * (qn @ kn.transpose(-1, -2))  # |q~_u| . |k~_w| within each graph
    const = sizes * v.abs() if own_value else same @ v.abs()
    a, dd = const + w @ v.abs(), sizes + w.sum(-1, keepdim=True)
    z = (sgformer_attention if own_value else difformer_attention)(q, k, v, batch=batch, joint_heads=joint)
    den = frobenius_normalize(q, batch=batch, joint_heads=joint) @ (
        same @ frobenius_normalize(k, batch=batch, joint_heads=joint)).transpose(-1, -2)
    den = sizes + torch.diagonal(den, dim1=-2, dim2=-1).unsqueeze(-1)  # N_g + q~_u . sum_{w in g} k~_w
    heads = q.shape[-3] if joint and q.dim() >= 3 else 1
    m = heads * int(sizes.max()) * q.shape[-1] + int(sizes.max()) + q.shape[-1] + 3
    bound = m * U32 * (a + z.abs() * dd) / den
    return float(bound.norm() / z.norm())


@pytest.mark.parametrize("factor", [1e25, 1e-25, 1e-35])
def test_extreme_norms_float32_are_scale_invariant(factor):
    """Entries whose squares overflow or underflow float32 (or are subnormal): the rare path
    rescales, and q~, k~ (so the output) are the same as for the unscaled inputs. Both runs are
    float32 evaluations of the same exact output (the factor cancels in q~, k~), each within
    float32_bound of it, so they differ by at most twice that (~3e-5 here: a worst-case bound;
    the observed differences are ~1e-7)."""
    q, k, v = inputs(11, torch.float32)
    for fn, own in ((difformer_attention, False), (sgformer_attention, True)):
        tol = 2 * float32_bound(q, k, v, BATCH, own)
        assert 1e-7 < tol < 1e-4  # the bound is a real constraint, tighter than EQUIV_TOL
        expected = fn(q, k, v, batch=BATCH)
        got = fn(q * factor, k / factor if factor > 1 else k * factor, v, batch=BATCH)
        assert rel_frobenius(got, expected) <= tol
    # q~ = q / ||q_g||: the norm sums H N_g c squares (recursive bound (H N_g c + 2) u per run,
    # the scaling 1 u more), so entrywise rtol 2 (H N_g c + 3) u between the two runs
    rtol = 2 * (LEAD[1] * max(SIZES) * q.shape[-1] + 3) * U32
    torch.testing.assert_close(frobenius_normalize(q * factor, batch=BATCH),
                               frobenius_normalize(q, batch=BATCH), rtol=rtol, atol=0.0)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_float32_large_magnitudes_stay_within_tolerance(name):
    """q, k, v with std 8 and d = 128 (shifted q, k): float32 stays within 1e-4 of float64."""
    fn, ref_fn = FUNCS[name]
    q, k, v = inputs(12, torch.float32, lead=(2,), d_qk=128, d=128, scale=8.0, shift=0.5)
    got = fn(q, k, v, batch=BATCH)
    assert rel_frobenius(got, ref_fn(np_(q), np_(k), np_(v), batch=BATCH.numpy())) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computes_in_float32(dtype):
    q, k, v = inputs(13, dtype)
    got = sgformer_attention(q, k, v, batch=BATCH)
    assert got.dtype == dtype
    expected = sgformer_attention(q.float(), k.float(), v.float(), batch=BATCH)
    assert torch.equal(got, expected.to(dtype))


# ------------------------------------------------------------------------ the guard


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_one_node_graph_with_opposite_q_and_k_raises(name):
    fn, ref_fn = FUNCS[name]
    q, k, v = inputs(14, lead=())
    batch = torch.tensor([0] * 5 + [1] + [2] * (N - 6))
    k[5] = -3.0 * q[5]  # q~ . k~ = -1 on the one-node graph 1: den = 1 - 1 = 0
    with pytest.raises(DenominatorError, match=r"node 5 \(graph 1, 1 node\(s\)\).*one-node graph"):
        fn(q, k, v, batch=batch)
    with pytest.raises(ArithmeticError, match="one-node graph"):
        ref_fn(np_(q), np_(k), np_(v), batch=batch.numpy())
    k[5] = 3.0 * q[5]  # the same graph with q~ . k~ = +1 is fine: its output is v_5
    torch.testing.assert_close(fn(q, k, v, batch=batch)[5], v[5])


def test_denominator_within_round_off_is_refused():
    """q~ . k~ = -1 + O(1e-18) on a one-node graph: den is positive but pure round-off (below the
    floor 8 u sqrt(N_g d_qk) (N_g + sqrt(N_g))): refused, not divided by."""
    q, k, v = inputs(18, lead=())
    batch = torch.tensor([0] * 5 + [1] + [2] * (N - 6))
    k[5] = -3.0 * q[5] + 1e-9 * torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0], dtype=q.dtype)
    with pytest.raises(DenominatorError, match="within round-off"):
        sgformer_attention(q, k, v, batch=batch)


def test_one_graph_batch_equals_no_batch():
    q, k, v = inputs(19)
    for fn in (difformer_attention, sgformer_attention):
        assert rel_frobenius(fn(q, k, v, batch=torch.zeros(N, dtype=torch.int32)), fn(q, k, v)) <= 1e-13


# ------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("joint_heads", [None, True, False])
def test_gradcheck(name, joint_heads):
    fn = FUNCS[name][0]
    batch = torch.tensor([0, 0, 0, 1, 1, 3, 3, 3])
    q, k, v = (t.requires_grad_(True) for t in inputs(15, lead=(1, 2), n=8, d_qk=3, d=2))
    assert torch.autograd.gradcheck(lambda a, b, c: fn(a, b, c, batch=batch, joint_heads=joint_heads), (q, k, v))
    assert torch.autograd.gradcheck(lambda a: frobenius_normalize(a, batch=batch, joint_heads=joint_heads), (q,))


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_gradcheck_rare_path_zero_norm_graph(name):
    """A batch with a zero-q graph (label 1) and a zero-k graph (label 3): the zero norms send the
    call to the rare path (q~ formed with the zero-norm convention); gradcheck in every input of
    the non-zero graphs (the zero rows are held at 0: x / ||x|| has no derivative there)."""
    fn = FUNCS[name][0]
    batch = torch.tensor([0, 0, 0, 1, 1, 3, 3, 3])
    q, k, v = inputs(21, lead=(1, 2), n=8, d_qk=3, d=2)
    zeros = torch.zeros(1, 2, 2, 3, dtype=q.dtype)
    qa, qb = q[..., :3, :].clone().requires_grad_(True), q[..., 5:, :].clone().requires_grad_(True)
    ka = k[..., :5, :].clone().requires_grad_(True)
    v = v.clone().requires_grad_(True)

    def f(qa_, qb_, ka_, v_):
        q_ = torch.cat([qa_, zeros, qb_], dim=-2)  # graph 1: q = 0
        k_ = torch.cat([ka_, torch.zeros(1, 2, 3, 3, dtype=q.dtype)], dim=-2)  # graph 3: k = 0
        return fn(q_, k_, v_, batch=batch)

    out = f(qa, qb, ka, v)
    limit = v[..., 3:5, :].mean(-2, keepdim=True).expand(1, 2, 2, 2) if name == "difformer" else v[..., 3:5, :]
    torch.testing.assert_close(out[..., 3:5, :], limit)  # the zero-q graph's limit: the rare path ran
    assert torch.autograd.gradcheck(f, (qa, qb, ka, v))


def test_gradcheck_many_graphs():
    """More graphs than FEW_SEGMENTS (the gathered-state path and segment_outer's blocked scatter)."""
    batch = torch.repeat_interleave(torch.arange(70), 2)
    q, k, v = (t.requires_grad_(True) for t in inputs(20, lead=(), n=140, d_qk=2, d=1))
    assert torch.autograd.gradcheck(lambda a, b, c: sgformer_attention(a, b, c, batch=batch), (q, k, v),
                                    fast_mode=True)


def test_gradcheck_without_batch():
    q, k, v = (t.requires_grad_(True) for t in inputs(16, lead=(2,), n=5, d_qk=3, d=2))
    assert torch.autograd.gradcheck(lambda a, b, c: difformer_attention(a, b, c), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: sgformer_attention(a, b, c), (q, k, v))


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("fn", [difformer_attention, sgformer_attention])
def test_bad_inputs(fn):
    q, k, v = inputs(17)
    with pytest.raises(ValueError, match=r"batch must be sorted.*batch\[4\] = 0 follows batch\[3\] = 2"):
        fn(q, k, v, batch=torch.tensor([0, 0, 0, 2, 0] + [3] * (N - 5)))
    with pytest.raises(ValueError, match=f"batch has {N - 1} entries but the inputs have N = {N} nodes"):
        fn(q, k, v, batch=BATCH[1:])
    with pytest.raises(TypeError, match="batch"):
        fn(q, k, v, batch=BATCH.double())
    with pytest.raises(ValueError, match="batch"):
        fn(q, k, v, batch=BATCH - 1)
    for name, idx in (("q", 0), ("k", 1), ("v", 2)):
        args = [q.clone(), k.clone(), v.clone()]
        args[idx][1, 0, 7, 1] = float("nan")
        with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
            fn(*args, batch=BATCH)
        args[idx][1, 0, 7, 1] = float("inf")
        with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
            fn(*args)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        fn(q, k[..., :-1], v)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        fn(q, k[:1], v)
    with pytest.raises(ValueError, match="v must have shape"):
        fn(q, k, v[..., :-1, :])
    with pytest.raises(TypeError, match="v must be a floating tensor"):
        fn(q, k, v.long())
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        fn(np_(q), k, v)


def test_frobenius_normalize_bad_inputs():
    with pytest.raises(ValueError, match="^x contains non-finite values"):
        frobenius_normalize(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="batch has 2 entries"):
        frobenius_normalize(torch.ones(3, 2), batch=torch.tensor([0, 0]))
