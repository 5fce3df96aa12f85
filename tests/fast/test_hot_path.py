"""The hot path of issue 11: validation without extra passes over the data, one host read per call,
the features' sign keyword, the fused FAVOR+ construction, ELU+1, the unmasked Functions, and the
causal scan's chunk rule and loops.

Non-finite inputs are no longer scanned up front: they are found from reductions the call forms
anyway (den, the state kv, squared norms) or one aminmax read pass, and named only on that rare
path. These tests plant NaN and inf in every argument on every path (unmasked, the attend paths of
causal and padding, the generic path, a key that no query sees) and check that the ValueError
still names the argument; they count host reads and isfinite calls with a TorchFunctionMode.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fast
from fast import (CausalMask, DenominatorError, DenseMask, PackingMask, PaddingMask, SparseMask, favor_attention,
                  favor_features, masked_linear_attention, softmax_attention)
from fast.masks import sequence as S
from tests.helpers import GenericMask, assert_unchanged, gen, positive, randn

FEW = settings(max_examples=25, deadline=None)
N = 12


def _sparse_hidden_key(n: int) -> SparseMask:
    """A causal SparseMask whose last key no query sees (its column is empty, so a sparse matmul
    never reads that key: only the read pass over phi_k and v finds a NaN there)."""
    dense = torch.tril(torch.ones(n, n, dtype=torch.float64))
    dense[:, n - 1] = 0.0
    dense[n - 1, n - 2] = 1.0  # the last query still sees a key
    return SparseMask(dense.to_sparse())


MASKS = {
    "none": lambda n: None,
    "causal": lambda n: CausalMask(n, chunk=4),
    "causal-default-chunk": lambda n: CausalMask(n),
    "padding": lambda n: PaddingMask(torch.arange(n) < n - 3),
    "packing": lambda n: PackingMask(torch.arange(n) // 5),
    "generic": lambda n: GenericMask(CausalMask(n, chunk=4)),
    "dense": lambda n: DenseMask(torch.tril(torch.ones(n, n, dtype=torch.float64))),
    "sparse-hidden-key": _sparse_hidden_key,
}


def _with(t: torch.Tensor, value: float, at: tuple[int, ...]) -> torch.Tensor:
    t = t.clone()
    t[at] = value
    return t


def _features(n=N, m=4, d=3, lead=(2,), seed=0, dtype=torch.float64):
    g = gen(seed)
    return positive((*lead, n, m), g, dtype), positive((*lead, n, m), g, dtype), randn((*lead, n, d), g, dtype)


# -------------------------------------------------------------- non-finite inputs are still named


@pytest.mark.parametrize("kind", sorted(MASKS))
@pytest.mark.parametrize("name", ["phi_q", "phi_k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("promise", [None, True])
def test_masked_linear_attention_names_a_non_finite_argument(kind, name, value, promise):
    """NaN or inf anywhere (here: the last token, which the sparse mask hides from every query) in
    any argument, on every path: ValueError naming it, never an output, never DenominatorError."""
    phi_q, phi_k, v = _features()
    args = {"phi_q": phi_q, "phi_k": phi_k, "v": v}
    args[name] = _with(args[name], value, (1, N - 1, 0))
    with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
        masked_linear_attention(args["phi_q"], args["phi_k"], args["v"], MASKS[kind](N),
                                features_nonnegative=promise)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("name", ["phi_k", "v"])
@pytest.mark.parametrize("j", [0, 3, 4, N - 1])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_causal_attend_reaches_every_key_so_the_driver_skips_their_read_pass(chunk, name, j, value):
    """CausalMask.attend_reaches_keys: the driver reads no pass over phi_k and v for finiteness, so
    a non-finite entry must show in num or den, also where every query's feature 0 is 0 (0 * inf is
    NaN) and with the FAVOR+ key constants: it is still named (the PyTorch scan; the kernel's twin
    of this test is in test_causal_triton.py)."""
    assert CausalMask(N).attend_reaches_keys and not PaddingMask(torch.arange(N) < N).attend_reaches_keys
    phi_q, phi_k, v = _features()
    phi_q = phi_q.clone()
    phi_q[..., 0] = 0.0
    args = {"phi_k": phi_k, "v": v}
    args[name] = _with(args[name], value, (1, j, 0))
    mask = CausalMask(N, chunk=chunk)
    with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
        masked_linear_attention(phi_q, args["phi_k"], args["v"], mask)
    num, den = mask.attend(phi_q, args["phi_k"], args["v"], key_log_scale=torch.randn(2, N, 1, dtype=torch.float64))
    assert not (torch.isfinite(num).all() and torch.isfinite(den).all())


@pytest.mark.parametrize("kind", ["padding", "dense"])
def test_a_non_finite_value_is_named_before_the_no_key_policy(kind):
    """A fully padded sample (its queries see no key) with NaN in v: the ValueError comes first,
    with no_key="raise" and "zero" alike."""
    phi_q, phi_k, v = _features(lead=())
    v = _with(v, math.nan, (0, 0))
    mask = (PaddingMask(torch.zeros(N, dtype=torch.bool)) if kind == "padding"
            else DenseMask(torch.zeros(N, N, dtype=torch.float64)))
    for policy in ("raise", "zero"):
        with pytest.raises(ValueError, match="^v contains non-finite"):
            masked_linear_attention(phi_q, phi_k, v, mask, no_key=policy)


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "packing", "generic", "sparse-hidden-key"])
@pytest.mark.parametrize("name", ["q", "k", "v", "projection"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_favor_attention_names_a_non_finite_argument(kind, name, value):
    g = gen(1)
    args = {"q": randn((2, N, 4), g), "k": randn((2, N, 4), g), "v": randn((2, N, 3), g),
            "projection": fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)}
    at = (3, 1) if name == "projection" else (1, N - 1, 2)
    args[name] = _with(args[name], value, at)
    with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
        favor_attention(args["q"], args["k"], args["v"], args["projection"], MASKS[kind](N))


@pytest.mark.parametrize("kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("name", ["q", "k", "projection"])
def test_favor_features_names_a_non_finite_argument(kind, name):
    g = gen(2)
    args = {"q": randn((2, N, 4), g), "k": randn((2, N, 4), g),
            "projection": fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)}
    args[name] = _with(args[name], math.nan, (0, 0) if name == "projection" else (0, 5, 1))
    with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
        favor_features(args["q"], args["k"], args["projection"], MASKS[kind](N))


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("logits", [False, True])
def test_softmax_attention_names_a_non_finite_argument(name, logits):
    g = gen(3)
    args = {"q": randn((2, 5, 4), g), "k": randn((2, 6, 4), g), "v": randn((2, 6, 3), g)}
    args[name] = _with(args[name], math.nan, (1, 2, 0))
    mask = torch.zeros(5, 6, dtype=torch.float64) if logits else None
    with pytest.raises(ValueError, match=f"^{name} contains non-finite values"):
        softmax_attention(args["q"], args["k"], args["v"], mask)


@pytest.mark.parametrize("kind", ["none", "causal", "generic"])
def test_finite_inputs_that_overflow_are_a_denominator_error_not_a_value_error(kind):
    """Power for the diagnosis: the rare path names an argument only when one is non-finite."""
    phi_q, phi_k, v = _features(dtype=torch.float32)
    with pytest.raises(DenominatorError, match="not finite"):
        masked_linear_attention(phi_q * 1e30, phi_k * 1e30, v, MASKS[kind](N))


# ------------------------------------------------------------- one host read, no finiteness scans


class _Record(TorchFunctionMode):
    """Counts host reads (bool, item, int, float, tolist of a tensor) and calls by name."""

    READS = {"__bool__", "item", "__int__", "__float__", "tolist", "__index__"}

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.calls: dict[str, int] = {}
        self.scanned: list[int] = []  # sizes of the tensors isfinite ran on

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.READS:
            self.reads += 1
        if name == "isfinite" and args and isinstance(args[0], torch.Tensor):
            self.scanned.append(args[0].numel())
        return func(*args, **(kwargs or {}))


def _record(call) -> _Record:
    rec = _Record()
    with rec:
        call()
    return rec


#: the masks are built before the calls are recorded (a DenseMask reads its entries once, when built)
_CAUSAL, _PADDING = CausalMask(N, chunk=4), PaddingMask(torch.arange(N) < N - 2)
_DENSE = DenseMask(torch.tril(torch.ones(N, N)))
_GENERIC = GenericMask(CausalMask(N, chunk=4))  # sign unknown: the relative floor, from |phi|
CALLS = {
    "linear": lambda a: masked_linear_attention(*a["phi"]),
    "linear-promised": lambda a: masked_linear_attention(*a["phi"], features_nonnegative=True),
    "causal": lambda a: masked_linear_attention(*a["phi"], _CAUSAL),
    "padding": lambda a: masked_linear_attention(*a["phi"], _PADDING),
    "generic": lambda a: masked_linear_attention(*a["phi"], _GENERIC),
    "dense": lambda a: masked_linear_attention(*a["phi"], _DENSE),
    "favor": lambda a: favor_attention(*a["qkv"], a["w"]),
    "favor-causal": lambda a: favor_attention(*a["qkv"], a["w"], _CAUSAL),
    "favor-padding": lambda a: favor_attention(*a["qkv"], a["w"], _PADDING),
    "favor-features": lambda a: favor_features(a["qkv"][0], a["qkv"][1], a["w"]),
    "softmax": lambda a: softmax_attention(*a["qkv"]),
}


def _inputs(requires_grad=False):
    g = gen(4)
    phi = [positive((2, N, 4), g, torch.float32), positive((2, N, 4), g, torch.float32),
           randn((2, N, 3), g, torch.float32)]
    qkv = [randn((2, N, 4), g, torch.float32) for _ in range(3)]
    for t in phi + qkv:
        t.requires_grad_(requires_grad)
    return {"phi": phi, "qkv": qkv, "w": fast.gaussian_projection(8, 4, generator=g)}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("grad", [False, True])
def test_one_host_read_and_no_finiteness_scan_per_call(call, grad):
    """Every driver reads the device once (its combined flag) and never scans its (N, .) inputs with
    isfinite on valid input: finiteness comes from den, kv, squared norms or an aminmax pass
    (module doc). (PaddingMask's stabiliser tests its per-slice constants: a few numbers.)"""
    a = _inputs(grad)
    rec = _record(lambda: CALLS[call](a))
    # DenseMask's nonnegative is a property that reads its matrix (fast/masks/explicit.py): one more
    assert rec.reads == (2 if call == "dense" else 1), rec.calls
    assert all(size < N for size in rec.scanned), rec.scanned
    assert rec.calls.get("all", 0) == 0


def test_the_host_read_counter_sees_reads():
    """Power for the test above: the old style (an isfinite scan per argument, a bool each) is seen."""
    a = _inputs()
    rec = _record(lambda: [bool(torch.isfinite(t).all()) for t in a["phi"]])
    assert rec.reads == 3 and rec.calls["isfinite"] == 3 and min(rec.scanned) >= N


class _Copies(TorchDispatchMode):
    """Records conversions of floating tensors (aten._to_copy) at the dispatcher (a bool key mask
    made float is not one of the inputs)."""

    def __init__(self):
        super().__init__()
        self.conversions = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].is_floating_point():
            self.conversions += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("call", ["linear", "causal", "generic", "favor", "favor-causal", "favor-padding"])
def test_float32_inputs_are_never_converted(call):
    """No dtype copy when the dtype is already right (the compute dtype of float32 is float32)."""
    a = _inputs()
    with _Copies() as rec:
        CALLS[call](a)
    assert rec.conversions == 0


def test_the_conversion_counter_sees_conversions():
    with _Copies() as rec:
        torch.ones(3).to(torch.float64)
    assert rec.conversions == 1


# ------------------------------------------------------------------------ features_nonnegative


@pytest.mark.parametrize("value", ["yes", 1, 0, 1.0, torch.tensor(True), "True"])
def test_features_nonnegative_must_be_none_true_or_false(value):
    phi_q, phi_k, v = _features()
    with pytest.raises(ValueError, match="features_nonnegative must be None .* True .* False"):
        masked_linear_attention(phi_q, phi_k, v, features_nonnegative=value)
    with pytest.raises(ValueError, match="features_nonnegative"):
        fast.linear_attention(phi_q, phi_k, v, features_nonnegative=value)


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "generic", "dense"])
def test_the_promise_changes_nothing_for_nonnegative_features(kind):
    phi_q, phi_k, v = _features()
    mask = MASKS[kind](N)
    base = masked_linear_attention(phi_q, phi_k, v, mask)
    for promise in (True, False):
        assert torch.equal(masked_linear_attention(phi_q, phi_k, v, mask, features_nonnegative=promise), base)


def test_true_skips_the_sign_test_and_none_runs_it():
    """Power: the sign test is amin over phi_q and phi_k; True runs no amin at all."""
    phi_q, phi_k, v = _features()
    tested = _record(lambda: masked_linear_attention(phi_q, phi_k, v))
    promised = _record(lambda: masked_linear_attention(phi_q, phi_k, v, features_nonnegative=True))
    assert tested.calls.get("amin", 0) == 2
    assert promised.calls.get("amin", 0) == 0


def test_signed_features_with_the_default_are_tested_and_guarded():
    """Identity (signed) features with None: the test fails on the device, the rare path computes
    the relative floor and returns what False returns."""
    g = gen(5)
    phi_q, phi_k, v = randn((N, 4), g), randn((N, 4), g).abs() + 0.5, randn((N, 3), g)
    phi_q = phi_q.abs() * torch.tensor([1.0, 1.0, 1.0, -0.1], dtype=torch.float64)  # signed, no cancellation
    assert torch.equal(masked_linear_attention(phi_q, phi_k, v),
                       masked_linear_attention(phi_q, phi_k, v, features_nonnegative=False))


def test_a_broken_promise_that_shows_is_a_value_error():
    """True with features whose denominators come out negative: the rare path tests the sign and
    names features_nonnegative."""
    g = gen(6)
    phi_q, phi_k, v = -positive((N, 4), g), positive((N, 4), g), randn((N, 3), g)
    with pytest.raises(ValueError, match="features_nonnegative=True promised"):
        masked_linear_attention(phi_q, phi_k, v, features_nonnegative=True)
    assert masked_linear_attention(phi_q, phi_k, v).shape == (N, 3)  # the default tests and divides


def test_a_broken_promise_that_does_not_show_divides_by_round_off():
    """The documented limit of True: keys 0.1, 0.2, -0.3 cancel to 5.55e-17 > 0, a positive
    normal denominator, so nothing sends the call to the rare path and it returns ~1e16 outputs,
    where the default (or False) refuses them. Pins what a caller promises."""
    keys = torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64)[:, None].expand(3, 4).clone()
    queries, v = torch.ones(2, 4, dtype=torch.float64), randn((3, 2), gen(7))
    with pytest.raises(DenominatorError, match="round-off"):
        masked_linear_attention(queries, keys, v)
    out = masked_linear_attention(queries, keys, v, features_nonnegative=True)
    assert float(out.abs().max()) > 1e14


# ------------------------------------------------------------------ the FAVOR+ construction


def _favor_reference(x, w, is_query, half_scale=True):
    """FavorPlus's pre-issue-11 construction: z = x W^T - |x|^2 / 2, exp(z - c) with c detached."""
    z = x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)
    c = z.amax(-1, keepdim=True) if is_query else z.amax(dim=(-2, -1), keepdim=True)
    return torch.exp(z - c.detach()) / math.sqrt(w.shape[0])


@pytest.mark.parametrize("is_query", [True, False])
def test_favor_plus_values_and_gradients_are_the_old_ones(is_query):
    """Values to round-off and gradients equal (float64): the norm term's gradient is kept for
    queries although their value no longer forms it."""
    g = gen(8)
    w = fast.gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    x = randn((2, 7, 4), g, scale=1.5).requires_grad_()
    cot = randn((2, 7, 6), g)
    got = fast.FavorPlus(w)(x, is_query=is_query)
    ref = _favor_reference(x, w, is_query)
    assert_unchanged(got.detach(), ref.detach())
    (g_got,) = torch.autograd.grad(got, x, cot)
    (g_ref,) = torch.autograd.grad(ref, x, cot)
    assert_unchanged(g_got, g_ref)


def test_favor_query_features_peak_at_exactly_one():
    g = gen(9)
    w = fast.gaussian_projection(16, 8, generator=g)
    x = randn((3, 50, 8), g, torch.float32, scale=3.0)
    e = fast.FavorPlus(w).exponentials(x, is_query=True)
    assert torch.equal(e.amax(-1), torch.ones(3, 50))
    k = fast.FavorPlus(w).exponentials(x, is_query=False)
    torch.testing.assert_close(k.amax(dim=(-2, -1)), torch.ones(3), rtol=1e-5, atol=0)


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "packing"])
def test_favor_features_gradients_match_the_unfused_construction(kind):
    """favor_features (the scale folded into W and the norm term) against the unfused FAVOR+ of
    q / d^(1/4), k / d^(1/4) with the mask's key constants: values and gradients (float64)."""
    g = gen(10)
    d = 4
    w = fast.gaussian_projection(8, d, generator=g, dtype=torch.float64)
    q, k = randn((2, N, d), g).requires_grad_(), randn((2, N, d), g).requires_grad_()
    op = MASKS[kind](N)
    s = d ** -0.25
    ref_q = _favor_reference(q * s, w, True)
    zk = (k * s) @ w.T - 0.5 * ((k * s) ** 2).sum(-1, keepdim=True)
    if op is None or kind == "causal":  # favor_features: the per-slice max for rescales_keys masks
        ck = zk.amax(dim=(-2, -1), keepdim=True)
    else:
        ck = op.key_stabilizer(zk)
    ref_k = torch.exp(zk - ck.detach()) / math.sqrt(8)
    phi_q, phi_k = favor_features(q, k, w, op)
    assert_unchanged(phi_q.detach(), ref_q.detach())
    assert_unchanged(phi_k.detach(), ref_k.detach())
    cq, ck2 = randn(phi_q.shape, g), randn(phi_k.shape, g)
    got = torch.autograd.grad((phi_q * cq).sum() + (phi_k * ck2).sum(), (q, k))
    ref = torch.autograd.grad((ref_q * cq).sum() + (ref_k * ck2).sum(), (q, k))
    for a, b in zip(got, ref):
        assert_unchanged(a, b)


def test_favor_bfloat16_scale_stays_in_the_compute_dtype():
    """The folded scale is applied to the float32 projection: bfloat16 q, k give the float32
    features of the same (bfloat16-valued) inputs."""
    g = gen(11)
    w = fast.gaussian_projection(16, 8, generator=g)
    q, k = (randn((2, 20, 8), g, torch.float32, scale=8.0).bfloat16() for _ in range(2))
    a, b = favor_features(q, k, w)
    c, e = favor_features(q.float(), k.float(), w)
    assert a.dtype == torch.float32 and torch.equal(a, c) and torch.equal(b, e)


# ------------------------------------------------------------------------------------ ELU + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elu_plus_one_is_torch_elu_plus_one(dtype):
    g = gen(12)
    x = torch.cat([randn((500,), g, dtype, scale=3.0), torch.tensor([0.0, -0.0, -200.0, 80.0], dtype=dtype)])
    x.requires_grad_()
    got = fast.EluPlusOne()(x)
    ref = F.elu(x) + 1
    torch.testing.assert_close(got, ref, rtol=4 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)
    assert bool((got >= 0).all())
    cot = randn(x.shape, g, dtype)
    torch.testing.assert_close(torch.autograd.grad(got, x, cot)[0], torch.autograd.grad(ref, x, cot)[0],
                               rtol=4 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)


def test_elu_plus_one_keeps_exp_where_expm1_plus_one_cancels():
    """elu(x) + 1 rounds to 0 (float32) or loses every digit (float64) at x = -30, -50; EluPlusOne
    returns exp(x) there, to exp_'s bound (2 |x| + 4) u (fast.features.exp_)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([-30.0, -50.0], dtype=dtype)
        u = torch.finfo(dtype).eps / 2
        got, want = fast.EluPlusOne()(x).double(), torch.exp(x.double())
        assert bool(((got - want).abs() <= (2 * x.double().abs() + 4) * u * want).all()), (got, want)
    assert float(torch.nn.functional.elu(torch.tensor(-30.0)) + 1) == 0.0  # what it avoids


def test_compiled_elu_plus_one_is_the_same_map():
    """The opt-in torch.compile path: same values and gradients (float32), derivative 1 at 0."""
    g = gen(17)
    x = torch.cat([randn((64,), g, torch.float32, scale=3.0), torch.zeros(1)]).requires_grad_()
    eager, compiled = fast.EluPlusOne(), fast.EluPlusOne(compiled=True)
    a, b = eager(x), compiled(x)
    torch.testing.assert_close(b, a)
    cot = randn(x.shape, g, torch.float32)
    torch.testing.assert_close(torch.autograd.grad(b, x, cot)[0], torch.autograd.grad(a, x, cot)[0])
    with pytest.raises(TypeError, match="compiled must be a bool"):
        fast.EluPlusOne(compiled="yes")


def test_elu_plus_one_gradgradcheck():
    x = randn((3, 5), gen(13)).requires_grad_()
    assert gradgradcheck(fast.EluPlusOne(), (x,))


# ------------------------------------------------------------- the unmasked products, quotient


def test_unmasked_gradgradcheck_and_contiguous_feature_gradients():
    """_LinearProducts and _Quotient: second derivatives, and phi_k's gradient arrives contiguous
    (autograd through phi_k^T @ v hands it a transposed one, which slows an elementwise backward)."""
    g = gen(14)
    pq, pk, v = positive((2, 6, 3), g).requires_grad_(), positive((2, 7, 3), g).requires_grad_(), \
        randn((2, 7, 2), g).requires_grad_()
    assert gradcheck(lambda a, b, c: masked_linear_attention(a, b, c), (pq, pk, v))
    assert gradgradcheck(lambda a, b, c: masked_linear_attention(a, b, c), (pq, pk, v))
    seen = []
    x = randn((2, 40, 8), g)
    phi_k = x.exp().requires_grad_()
    hooked = phi_k * 1.0
    hooked.register_hook(lambda grad: seen.append(grad.is_contiguous()))
    masked_linear_attention(x.exp(), hooked, randn((2, 40, 5), g)).sum().backward()
    assert seen == [True]


# -------------------------------------------------------------------------- causal: the chunk


@pytest.mark.parametrize("m, d, chunk, backward", [(16, 16, 16, 32), (32, 32, 32, 32), (64, 64, 64, 64),
                                                   (128, 128, 64, 64), (16, 64, 32, 32), (64, 256, 64, 64),
                                                   (1, 1, 16, 32), (4, 8, 16, 32), (24, 24, 32, 32)])
def test_default_chunk_rule(m, d, chunk, backward):
    assert CausalMask(100).chunk is None
    assert CausalMask(100).chunk_for(m, d) == chunk
    assert CausalMask(100).chunk_for(m, d, backward=True) == backward
    assert CausalMask(100, chunk=7).chunk_for(m, d) == 7
    assert CausalMask(100, chunk=7).chunk_for(m, d, backward=True) == 7


def test_the_plain_scans_backward_takes_its_own_chunk(monkeypatch):
    """m = d = 16: the forward scans chunks of 16 and its backward chunks of 32, and the gradients are
    those of the dense causal form (the chunk is only a choice of C)."""
    n = 70
    mask = CausalMask(n)
    seen = []
    real = CausalMask._chunks
    monkeypatch.setattr(CausalMask, "_chunks", lambda self, *t, chunk: seen.append(chunk) or real(self, *t, chunk=chunk))
    g = gen(17)
    pq, pk, v = (positive((2, n, 16), g).requires_grad_(), positive((2, n, 16), g).requires_grad_(),
                 randn((2, n, 16), g).requires_grad_())
    out = masked_linear_attention(pq, pk, v, mask)
    assert seen == [16]
    a = (pq @ pk.transpose(-1, -2)) * torch.tril(torch.ones(n, n, dtype=torch.float64))
    ref = (a @ v) / a.sum(-1, keepdim=True)
    cot = randn(out.shape, g)
    for x, y in zip(torch.autograd.grad(out, (pq, pk, v), cot), torch.autograd.grad(ref, (pq, pk, v), cot)):
        assert_unchanged(x, y)
    assert seen[1] == 32


@FEW
@given(n=st.integers(1, 150), m=st.sampled_from([1, 4, 16, 32, 64]), d=st.sampled_from([1, 3, 16, 64]),
       seed=st.integers(0, 2**31 - 1))
def test_default_chunk_gives_the_explicit_chunks_result(n, m, d, seed):
    """The default chunk is only a choice of C: the output is the one CausalMask(n, chunk=C) gives,
    and causal attention row by row (the prefix) up to round-off."""
    g = gen(seed)
    pq, pk, v = positive((n, m), g), positive((n, m), g), randn((n, d), g)
    mask = CausalMask(n)
    got = masked_linear_attention(pq, pk, v, mask)
    assert torch.equal(got, masked_linear_attention(pq, pk, v, CausalMask(n, chunk=mask.chunk_for(m, d))))
    a = (pq @ pk.T) * torch.tril(torch.ones(n, n, dtype=torch.float64))
    assert_unchanged(got, (a @ v) / a.sum(-1, keepdim=True))


# ------------------------------------------------------------------- causal: the loop scans


def _sequential(x, level=None, reverse=False):
    out = torch.empty_like(x)
    steps = range(x.shape[-3] - 1, -1, -1) if reverse else range(x.shape[-3])
    prev = None
    for t in steps:
        acc = x[..., t, :, :].clone()
        if prev is not None:
            f = 1.0 if level is None else torch.exp(-(level[..., prev] - level[..., t]).abs())[..., None, None]
            acc = acc + f * out[..., prev, :, :]
        out[..., t, :, :] = acc
        prev = t
    return out


@FEW
@given(n=st.integers(1, 70), reverse=st.booleans(), decayed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_scan_into_is_the_sequential_recurrence(n, reverse, decayed, seed):
    """Both loop levels (blocks of isqrt(n), a ragged tail), forward and reverse, plain and decayed,
    into a new tensor and in place."""
    g = gen(seed)
    x = randn((2, n, 3, 2), g)
    level = torch.cumsum(5.0 * torch.rand(2, n, generator=g, dtype=torch.float64), -1) if decayed else None
    expected = _sequential(x, level, reverse)
    assert_unchanged(S._scan_into(x, torch.empty_like(x), reverse=reverse, level=level), expected)
    y = x.clone()
    assert_unchanged(S._scan_into(y, y, reverse=reverse, level=level), expected)  # in place


@FEW
@given(n=st.integers(1, 70), reverse=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_exclusive_sum_by_loops_and_by_cumsum(n, reverse, seed):
    g = gen(seed)
    x = randn((2, n, 3, 2), g)
    inclusive = _sequential(x, reverse=reverse)
    expected = torch.zeros_like(x)
    if reverse:
        expected[..., :-1, :, :] = inclusive[..., 1:, :, :]
    else:
        expected[..., 1:, :, :] = inclusive[..., :-1, :, :]
    with torch.no_grad():
        by_cumsum = S._exclusive_sum(x, reverse=reverse)
        old = S.SMALL_SCAN
        S.SMALL_SCAN = 0
        try:
            by_loops = S._exclusive_sum(x, reverse=reverse)
        finally:
            S.SMALL_SCAN = old
    assert_unchanged(by_cumsum, expected)
    assert_unchanged(by_loops, expected)


@pytest.mark.parametrize("shape, route", [((1, 2, 256, 16, 16), "products"), ((1, 2, 250, 16, 16), "loops"),
                                          ((1, 2, 16, 64, 64), "loops"), ((1, 2, 256, 16, 1), "cumsum"),
                                          ((1, 2, 16, 16, 16), "cumsum")])
@pytest.mark.parametrize("reverse", [False, True])
def test_exclusive_sum_takes_products_or_loops_for_wide_states(monkeypatch, shape, route, reverse):
    """The chunk states (..., n, m, d) of m = d = 16 at N = 2^12 go through the block products
    (states of at most PRODUCT_SCAN_MAX entries, n a multiple of the block), those of m = d = 64 at
    N = 2^10 (and a ragged n) through the loops, where torch.cumsum's stride m d made it 5-15x slower
    on CPU; the vector states (..., n, m, 1) and tiny tensors through torch.cumsum. Each gives the
    exclusive sums, forward and reverse."""
    calls = []
    for name in ("_scan_into", "_exclusive_by_products"):
        real = getattr(S, name)
        monkeypatch.setattr(S, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    x = randn(shape, gen(16))
    expected = torch.zeros_like(x)
    if reverse:
        expected[..., :-1, :, :] = _sequential(x.flip(-3)).flip(-3)[..., 1:, :, :]
    else:
        expected[..., 1:, :, :] = _sequential(x)[..., :-1, :, :]
    with torch.no_grad():
        got = S._exclusive_sum(x, reverse=reverse)
    want = {"products": ["_exclusive_by_products"], "loops": ["_scan_into"], "cumsum": []}[route]
    assert calls == want
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 16, 48, 256])
@pytest.mark.parametrize("reverse", [False, True])
def test_exclusive_by_products_in_one_block_and_several(n, reverse):
    """One block (n <= 16: no carry), three and sixteen blocks: the exclusive sums, float64."""
    x = randn((2, n, 3, 5), gen(17))
    expected = torch.zeros_like(x)
    if reverse:
        expected[..., :-1, :, :] = _sequential(x.flip(-3)).flip(-3)[..., 1:, :, :]
    else:
        expected[..., 1:, :, :] = _sequential(x)[..., :-1, :, :]
    torch.testing.assert_close(S._exclusive_by_products(x, reverse), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n, chunk", [(37, 1), (100, 3), (64, 4)])
def test_causal_scan_by_the_loops_matches_the_dense_form(monkeypatch, n, chunk):
    """The loop scans (forced below their size threshold) in forward and backward of the plain
    scan: outputs and gradients of the dense causal form."""
    monkeypatch.setattr(S, "SMALL_SCAN", 0)
    g = gen(15)
    pq, pk, v = (positive((2, n, 3), g).requires_grad_(), positive((2, n, 3), g).requires_grad_(),
                 randn((2, n, 2), g).requires_grad_())
    out = masked_linear_attention(pq, pk, v, CausalMask(n, chunk=chunk))
    a = (pq @ pk.transpose(-1, -2)) * torch.tril(torch.ones(n, n, dtype=torch.float64))
    ref = (a @ v) / a.sum(-1, keepdim=True)
    assert_unchanged(out.detach(), ref.detach())
    cot = randn(out.shape, g)
    for x, y in zip(torch.autograd.grad(out, (pq, pk, v), cot), torch.autograd.grad(ref, (pq, pk, v), cot)):
        assert_unchanged(x, y)


def test_favor_causal_attend_without_its_own_read_equals_attend():
    g = gen(16)
    n = 30
    pq, pk, v = positive((2, n, 4), g), positive((2, n, 4), g), randn((2, n, 3), g)
    c = torch.cummax(randn((2, n, 1), g, scale=20.0), dim=-2).values
    mask = CausalMask(n, chunk=4)
    for a, b in zip(mask._attend_scaled(pq, pk, v, c), mask.attend(pq, pk, v, key_log_scale=c)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="key_log_scale contains non-finite"):
        mask.attend(pq, pk, v, key_log_scale=_with(c, math.nan, (0, 3, 0)))


def test_bfloat16_features_reach_an_attend_that_takes_half_without_float32_copies(monkeypatch):
    """attend_takes_half (CausalMask): the driver hands bfloat16 phi_q, phi_k, v to attend as they
    are, with accumulate=True, and attend returns float32 sums (here the PyTorch scan, on float32
    copies it makes itself: the same numbers as the driver's copies gave before). Signed features
    (the guard's floor needs their round-off in float32) and FAVOR+'s key constants keep the
    driver's float32 copies."""
    seen = []
    real = CausalMask.attend

    def spy(self, phi_q, phi_k, v, **kw):
        seen.append(([t.dtype for t in (phi_q, phi_k, v)], kw.get("accumulate", False)))
        num, den = real(self, phi_q, phi_k, v, **kw)
        seen[-1] += ([num.dtype, den.dtype],)
        return num, den

    monkeypatch.setattr(CausalMask, "attend", spy)
    phi_q, phi_k, v = (t.to(torch.bfloat16) for t in _features(dtype=torch.float32))
    out = masked_linear_attention(phi_q, phi_k, v, CausalMask(N))
    assert seen == [([torch.bfloat16] * 3, True, [torch.float32] * 2)] and out.dtype == torch.bfloat16
    want = masked_linear_attention(phi_q.float(), phi_k.float(), v.float(), CausalMask(N)).to(torch.bfloat16)
    assert torch.equal(out, want)  # the same float32 sums, rounded once
    seen.clear()
    masked_linear_attention(phi_q, phi_k, v, CausalMask(N), features_nonnegative=False)
    assert seen == [([torch.float32] * 3, False, [torch.float32] * 2)]
    assert CausalMask(N).attend_takes_half and not fast.as_mask_operator(PaddingMask(torch.arange(N) < N)).attend_takes_half
