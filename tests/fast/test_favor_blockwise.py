"""fast/favor_blockwise.py: favor_attention without a mask forms its FAVOR+ features a block of rows
at a time, forward and backward (issue 21, item 6).

"The previous formula" is masked_linear_attention(*favor_features(q, k, W), v): both (N, m) feature
matrices whole and the two-GEMM linear attention, which is what favor_attention computed before
(bit for bit: favor_features' factor 1/sqrt(m) is a power of two here, m = 16 and 64).

Round-off bound (``roundoff_bound``). Either implementation computes out_i = sum_j w_ij v_j /
sum_j w_ij with positive weights w_ij = phi_q_i . phi_k_j, in the unit round-off u of its dtype:
- each feature exp(arg) has relative error at most e_f = gamma_(d+3) A + 2u, A bounding the
  exponents' terms: a projection x . w' (d products: gamma_d |x| |w'|), the norm term n, the
  stabiliser C (|C| <= P + n_max), then the subtractions and exp, so A = 2 (P + n_max) with
  P = max |x| max |w'| over queries and keys (x = q or k, w' = d^(-1/4) rows of W);
- the sums S = sum_j phi_k_j v_j^T, z, then phi_q . S and phi_q . z are sums of positive
  weights times v: computed with error at most gamma_K sum_j w_ij |v_j| (resp. w_ij) where
  K = 2 N + m + 2 covers N terms, m terms, one rounding of the running-max factor per block
  (at most N blocks) and the division;
so |out_i(computed) - out_i| <= 2 (gamma_K + 2 e_f) max_j |v_j| (num and den each off by
(gamma_K + 2 e_f) den_i max|v|, and |out_i| <= max|v|). Two implementations differ by at most
twice that. It is a worst-case bound (the observed differences are ~1e-3 of it); a planted
error (a stabiliser not undone, a block missed or counted twice) moves outputs by O(1) of max|v|.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.profiler import ProfilerActivity, profile

import fast
from fast import DenominatorError, favor_attention, favor_features, masked_linear_attention
from fast import favor_blockwise as fb
from tests.helpers import DEVICES, EQUIV_TOL, gen, rel_frobenius, saved_bytes

def previous_formula(q, k, v, w):
    """What favor_attention(q, k, v, w) computed before: the features whole, then linear attention."""
    return masked_linear_attention(*favor_features(q, k, w), v)


def blockwise(q, k, v, w, block_rows):
    """favor_attention's unmasked path with a given block size (the scale folded as it folds it)."""
    d = w.shape[1]
    wq = w.to(fast.validation.compute_dtype(q.dtype)) * d ** -0.25
    out, _, flag = fb.favor_products(q, k, v, wq, wq, 0.5 * d ** -0.5, block_rows=block_rows)
    assert bool(flag)
    return out


def inputs(lead, n_q, n, d=16, m=16, dv=5, dtype=torch.float64, device="cpu", seed=0, late_key=True):
    """q (*lead, n_q, d), k (*lead, n, d), v (*lead, n, dv), W (m, d). late_key: each slice's LAST
    key is aligned with W's longest row, so the keys' max C is set by the last block and every
    earlier block was formed with a smaller running max (the rescaling is exercised)."""
    g = gen(seed)
    w = fast.gaussian_projection(m, d, generator=g, dtype=torch.float64)
    q = torch.randn(*lead, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, n, dv, generator=g, dtype=torch.float64)
    if late_key:
        row = w[w.norm(dim=1).argmax()]
        k[..., -1, :] = 1.5 * d ** 0.25 * row / row.norm()  # exponent ~ 1.5 |w_max| - 1.125: above the others
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)] + [w.to(device=device, dtype=torch.float64
                                                                       if dtype == torch.float64 else torch.float32)]


def roundoff_bound(q, k, v, w, dtype) -> float:
    """The worst-case absolute difference allowed between two implementations' outputs (module doc)."""
    u = torch.finfo(dtype).eps / 2
    n, m, d = k.shape[-2], w.shape[0], w.shape[1]

    def gamma(j):
        return j * u / (1 - j * u)

    q64, k64, w64 = q.double(), k.double(), w.double() * d ** -0.25
    p = max(float(q64.norm(dim=-1).max()), float(k64.norm(dim=-1).max())) * float(w64.norm(dim=-1).max())
    n_max = float((0.5 * d ** -0.5) * k64.square().sum(-1).max())
    e_f = gamma(d + 3) * 2 * (p + n_max) + 2 * u
    return 2 * 2 * (gamma(2 * n + m + 2) + 2 * e_f) * float(v.double().abs().max())


def _late_key_needs_the_rescale(k, w, block_rows):
    """Power of the comparison: the first block's running max is below the final C by more than 1,
    so a block not rescaled would be off by a factor e or more."""
    d = w.shape[1]
    x = k.double().reshape(-1, k.shape[-2], d)[0]
    arg = x @ (w.double() * d ** -0.25).T - 0.5 * d ** -0.5 * x.square().sum(-1, keepdim=True)
    rows = arg.amax(-1)
    return float(rows.max() - rows[:block_rows].max()) > 1.0


CASES = {  # lead, n_q, n
    "heads": ((2, 3), 40, 40),
    "cross": ((2,), 23, 37),
    "2d": ((), 30, 30),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("block_rows", [1, 7, 40, 80, None])
def test_output_equals_the_previous_formula_within_roundoff(device, dtype, case, block_rows):
    """Blocks of one row, blocks that split slices (7), one slice (40), two slices (80) and the
    default: entrywise within the round-off bound of the module doc."""
    lead, n_q, n = CASES[case]
    q, k, v, w = inputs(lead, n_q, n, dtype=dtype, device=device)
    assert block_rows is None or block_rows >= n or _late_key_needs_the_rescale(k, w, block_rows)
    old = previous_formula(q, k, v, w)
    for new in (blockwise(q, k, v, w, block_rows), favor_attention(q, k, v, w)):
        assert new.shape == old.shape and new.dtype == old.dtype and new.device == old.device
        assert float((new - old).abs().max()) <= roundoff_bound(q, k, v, w, dtype)


def test_the_comparison_sees_a_missing_rescale(monkeypatch):
    """Power check: with the running max's rescaling factor planted as 1 (torch.exp of the
    difference of maxima replaced), blocks formed before the late key are off by e^(C - C') and
    the comparison above fails."""
    q, k, v, w = inputs((2, 3), 40, 40)
    real_exp = torch.exp

    def no_rescale(x, *args, **kwargs):  # the planted bug: exp(C_old - C_new) -> 1 once a max exists
        y = real_exp(x, *args, **kwargs)
        return torch.where(torch.isfinite(x), torch.ones_like(y), y) if x.shape[-2:] == (1, 1) else y

    monkeypatch.setattr(torch, "exp", no_rescale)  # fast.favor_blockwise's only torch.exp is that factor
    bad = blockwise(q, k, v, w, 7)
    monkeypatch.undo()
    assert float((bad - previous_formula(q, k, v, w)).abs().max()) > 100 * roundoff_bound(q, k, v, w, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32_as_before(dtype):
    """Half inputs: the features, sums and gradients in float32, cast back: outputs and gradients
    in the inputs' dtypes, outputs within one rounding to the half dtype (2^-p relative, p its
    significand bits) plus the float32 bound of the previous formula's."""
    q, k, v, w = inputs((2, 2), 33, 33, dtype=torch.float32)
    qh, kh, vh = (t.to(dtype).requires_grad_() for t in (q, k, v))
    new = favor_attention(qh, kh, vh, w)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (qh, kh, vh))
    old = previous_formula(q2, k2, v2, w)
    assert new.dtype == old.dtype == dtype
    ulp = torch.finfo(dtype).eps  # 2^-p: one rounding each side, <= 2^-(p+1) relative each
    tol = ulp * old.float().abs() + roundoff_bound(q, k, v, w, torch.float32)
    assert bool(((new.float() - old.float()).abs() <= tol).all())
    g = torch.randn(new.shape, generator=gen(1)).to(dtype)
    new.backward(g)
    old.backward(g)
    for a, b in ((qh, q2), (kh, k2), (vh, v2)):
        assert a.grad.dtype == dtype
        assert rel_frobenius(a.grad, b.grad) <= 2 * ulp  # float32 gradients (~1e-6 apart), each rounded once


# ------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("block_rows", [1, 7, None])
def test_gradients_equal_the_previous_formula(device, case, block_rows):
    """float64 gradients of q, k, v and W (a learnable projection) against autograd through the
    previous formula: equal up to round-off (EQUIV_TOL, relative Frobenius)."""
    lead, n_q, n = CASES[case]
    q, k, v, w = inputs(lead, n_q, n, device=device)
    g = torch.randn(*lead, n_q, v.shape[-1], generator=gen(2), dtype=torch.float64).to(device)
    grads = []
    for fn in (lambda *a: blockwise(*a, block_rows), previous_formula):
        args = [t.detach().clone().requires_grad_() for t in (q, k, v, w)]
        fn(*args).backward(g)
        grads.append([a.grad for a in args])
    for new, old in zip(*grads):
        assert rel_frobenius(new, old) <= EQUIV_TOL[torch.float64]


@pytest.mark.parametrize("block_rows", [1, 2, 3, 8])
def test_gradcheck_blockwise(block_rows):
    """Finite differences (float64) for q, k, v and W, cross attention (N_q != N), blocks of one
    row up to whole slices."""
    q, k, v, w = inputs((2,), 5, 7, d=4, m=6, dv=3, seed=3, late_key=False)
    args = [t.requires_grad_() for t in (q * 0.7, k * 0.7, v, w)]
    assert gradcheck(lambda a, b, c, p: blockwise(a, b, c, p, block_rows), args)


def test_gradgradcheck_blockwise():
    """Double backward (create_graph=True) differentiates the whole-tensor twin favor_naive."""
    q, k, v, w = inputs((2,), 4, 5, d=3, m=4, dv=2, seed=4, late_key=False)
    args = [t.requires_grad_() for t in (q * 0.7, k * 0.7, v, w)]
    assert gradgradcheck(lambda a, b, c, p: blockwise(a, b, c, p, 2), args)


def test_gradient_of_some_inputs_only():
    """needs_input_grad: v alone, q alone, k alone give what the full call gives for them."""
    q, k, v, w = inputs((2,), 6, 9, seed=5)
    full = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    blockwise(*full, w, 4).sum().backward()
    for i in range(3):
        args = [t.detach().clone().requires_grad_(j == i) for j, t in enumerate((q, k, v))]
        blockwise(*args, w, 4).sum().backward()
        torch.testing.assert_close(args[i].grad, full[i].grad, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------ guard, batch


def test_a_vanishing_denominator_is_refused_as_before():
    """float32, each query aligned with one projection row and each key with another: every
    phi_q_i . phi_k_j underflows, so den_i = 0 and both formulas raise DenominatorError (the
    guard's semantics kept), never dividing."""
    d, m = 4, 8
    w = torch.zeros(m, d)
    w[0, 0], w[1, 1] = 30.0, 30.0  # phi_q_0 = 1 and phi_k_1 = 1; every other product is exp(-127) = 0
    w[2:, 2] = 1.0
    q, k = torch.zeros(1, 3, d), torch.zeros(1, 3, d)
    q[..., 0], k[..., 1] = 6.0, 6.0  # exponents 6 * 30 * d^(-1/4) = 127 > 104 (exp(-104) < float32's subnormals)
    v = torch.ones(1, 3, 2)
    with pytest.raises(DenominatorError, match="zero or subnormal"):
        previous_formula(q, k, v, w)
    with pytest.raises(DenominatorError, match="zero or subnormal"):
        favor_attention(q, k, v, w)


@pytest.mark.parametrize("block_rows", [3, 10, 20])
def test_slices_stay_independent_across_blocks(block_rows):
    """Blocks holding several slices (20 rows = 2 slices of 10) or parts of one: a slice with huge
    aligned keys changes no other slice's output (the running max is per (batch, head) slice)."""
    q, k, v, w = inputs((3, 2), 10, 10, seed=6, late_key=False)
    out = blockwise(q, k, v, w, block_rows)
    row = w[w.norm(dim=1).argmax()]
    k2 = k.clone()
    k2[1, 0] = 12.0 * row / row.norm()
    out2 = blockwise(q, k2, v, w, block_rows)
    others = torch.ones(3, 2, dtype=torch.bool)
    others[1, 0] = False
    torch.testing.assert_close(out2[others], out[others], rtol=1e-12, atol=0)
    assert not torch.allclose(out2[1, 0], out[1, 0])


# ------------------------------------------------------------------------------ block plan


@pytest.mark.parametrize("n", [40, 37])
def test_long_reductions_cut_into_pieces_change_nothing_but_roundoff(monkeypatch, n):
    """_gram (the per-slice phi^T v of blocks holding several slices) with GRAM_ROWS = 4: rows cut
    into pieces that become batch entries (40 = 10 x 4) or one GEMM per slice (37): outputs and
    gradients as above."""
    monkeypatch.setattr(fb, "GRAM_ROWS", 4)
    q, k, v, w = inputs((2, 3), n, n, seed=8)
    old = previous_formula(q, k, v, w)
    assert float((blockwise(q, k, v, w, 2 * n) - old).abs().max()) <= roundoff_bound(q, k, v, w, torch.float64)
    small = n // 5  # 8 = 2 x 4 or 7: the same two branches, small enough for finite differences
    q, k, v, w = inputs((2,), small, small, d=4, m=6, dv=3, seed=8, late_key=False)
    args = [t.requires_grad_() for t in (q * 0.7, k * 0.7, v)]
    assert gradcheck(lambda a, b, c: blockwise(a, b, c, w, 2 * small), args)
    a, b = torch.randn(3, n, 5, generator=gen(9), dtype=torch.float64), torch.randn(3, n, 2, generator=gen(10),
                                                                                   dtype=torch.float64)
    torch.testing.assert_close(fb._gram(a, b), a.transpose(1, 2) @ b, rtol=1e-13, atol=1e-13)




def test_block_plan_covers_every_row_once_in_contiguous_blocks():
    for slices, n, rows in [(3, 10, 1), (3, 10, 4), (3, 10, 10), (3, 10, 25), (5, 7, 100), (1, 9, 9)]:
        seen = torch.zeros(slices, n, dtype=torch.int64)
        for l0, l1, a, b in fb._plan(slices, n, rows):
            assert (l1 - l0) * (b - a) <= max(rows, 1)
            assert l1 - l0 == 1 or (a, b) == (0, n)  # contiguous in a (slices, n, .) tensor
            seen[l0:l1, a:b] += 1
        assert bool((seen == 1).all())


def test_default_block_rows():
    """CPU: 2 MiB of features a block (8192 rows at m = 64, float32); CUDA: 1/8 of the features
    within 32-256 MiB (N = 2^20, 8 heads: 8 blocks of 2^20 rows; under 32 MiB in all, one block)."""
    assert fb.default_block_rows(8 * 2**20, 64, 4, "cpu") == 8192
    assert fb.default_block_rows(100, 64, 4, "cpu") == 8192
    assert fb.default_block_rows(8 * 2**20, 64, 4, "cuda") == 2**20
    assert fb.default_block_rows(8 * 2**20, 64, 4, torch.device("cuda", 0)) == 2**20
    assert fb.default_block_rows(2**16, 64, 4, "cuda") == 2**17
    assert fb.default_block_rows(2**16, 64, 8, "cpu") == 4096


# ------------------------------------------------------------------------------ memory

#: B = 1, H = 8, d = m = 64; N per device: a CUDA block holds at least 32 MiB of features
#: (fast.favor_blockwise), so N = 2^17 there makes the 8 blocks that CPU's 2 MiB blocks make at 2^12
MEM_LEAD, MEM_D = (1, 8), 64
MEM_N = {"cpu": 4096, "cuda": 2**17}
#: issue 21 item 6: favor_attention's extra memory at most this multiple of the features-given path's
MEMORY_RATIO = 1.25


def test_saved_tensors_are_the_inputs_and_the_small_state():
    """Under autograd favor_attention (mask=None) saves q, k, v, the scaled projection W' (m d), den
    (N per slice) and S, z, C (m (d + 1) + 1 per slice): no (N, m) features. The previous formula
    saves both feature matrices (2 N m per slice) on top: the bound fails it (power)."""
    n = MEM_N["cpu"]
    q, k, v, w = inputs(MEM_LEAD, n, n, d=MEM_D, m=MEM_D, dv=MEM_D, dtype=torch.float32, late_key=False)
    for t in (q, k, v):
        t.requires_grad_()
    slices, m = math.prod(MEM_LEAD), w.shape[0]
    inputs_bytes = sum(t.numel() * 4 for t in (q, k, v))
    bound = inputs_bytes + 4 * (m * MEM_D + slices * n + slices * (m * (MEM_D + 1) + 1))
    got, out = saved_bytes(lambda: favor_attention(q, k, v, w))
    assert inputs_bytes <= got <= bound, (got, bound)
    old, _ = saved_bytes(lambda: previous_formula(q, k, v, w))
    assert old > bound + 2 * slices * n * m * 4 * 0.99


def peak_extra_bytes(fn, device) -> int:
    """Peak bytes allocated while fn() runs, over what was allocated before. CUDA: the caching
    allocator's peak statistic. CPU: the profiler's allocation events (every allocation and free
    of torch's CPU allocator, with its size), summed in time order: deterministic, unlike RSS."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        if e.device_type() == torch.autograd.DeviceType.CPU:
            live += e.nbytes()
            peak = max(peak, live)
    return peak


def _peaks(device, train):
    """(favor_attention, the previous formula, masked_linear_attention with the features given):
    peak extra bytes of one forward (train: forward and backward) at B = 1, H = 8, N = MEM_N,
    d = m = 64, float32. The features given are the previous formula's, computed beforehand."""
    n = MEM_N[device]
    q, k, v, w = inputs(MEM_LEAD, n, n, d=MEM_D, m=MEM_D, dv=MEM_D, dtype=torch.float32, device=device,
                        late_key=False)
    phi_q, phi_k = favor_features(q, k, w)
    g = torch.randn(v.shape, generator=gen(7)).to(device)
    calls = {"favor": ((q, k, v), lambda: favor_attention(q, k, v, w)),
             "previous": ((q, k, v), lambda: previous_formula(q, k, v, w)),
             "given": ((phi_q, phi_k, v), lambda: masked_linear_attention(phi_q, phi_k, v))}
    peaks = {}
    for name, (args, fn) in calls.items():
        for t in args:
            t.requires_grad_(train)
            t.grad = None

        def run():
            out = fn()
            if train:
                out.backward(g)

        run()  # warm-up: one-time allocations (the profiler, BLAS buffers) are not the call's
        for t in args:
            t.grad = None
        peaks[name] = peak_extra_bytes(run, device)
        for t in args:
            t.requires_grad_(False)
            t.grad = None
    return peaks


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_peak_memory_is_within_the_features_given_path(device, train):
    """The issue's target: favor_attention's extra memory at most 1.25 times that of
    masked_linear_attention with the features given (forward, and forward + backward with the
    gradients of q, k, v vs of phi_q, phi_k, v). Measured here (CPU): 0.63 and 0.75. The previous
    formula holds phi_q and phi_k whole and fails it (2.0 forward, 1.33 train): power."""
    peaks = _peaks(device, train)
    assert peaks["given"] > MEM_N[device] * 8 * MEM_D * 4  # not vacuous: at least the output
    assert peaks["favor"] <= MEMORY_RATIO * peaks["given"], peaks
    assert peaks["previous"] > MEMORY_RATIO * peaks["given"], peaks
