"""The Triton causal scan (fast.kernels.causal_scan) against its twin, the PyTorch scan, and the
float64 reference, on a CPU through Triton's interpreter; the dispatch rule (fast.kernels.dispatch).

TRITON_INTERPRET=1 must be set before triton is imported, so the kernel runs in one subprocess
(MASKBENCH_CAUSAL_KERNEL=force: CausalMask.attend takes the kernel on CPU tensors there) that
prints its measurements as JSON; the tests below judge them. Sizes are small (the interpreter
runs each program in Python): N ragged against the chunk (full chunks of 32 and a partial one,
or several chunks of 16 for m = 256; N = 1), m != d, m, d in {16, 32, 64}, d wider than one value
block, float32, bfloat16 and float64, and the token axis cut into segments scanned in parallel
(fast.kernels.causal_scan.SEGMENTS forced: on a CPU there is one).

Tolerances are bounds, not fits (docs/methods.md): every output is a sum of at most
K = N + m + 2 C products of nonnegative factors, so in a working precision with unit roundoff u
its error is at most K u times the same sum taken over absolute values ("absref", computed in
float64 from |phi_q|, |phi_k|, |v| and |g|); a bfloat16 result adds its own rounding to nearest,
u = 2^-8 relative. On a GPU the products may take TF32 operands (rounded to 2^-11 relative; the
CUDA test's bound adds five such roundings: a product's two operands, each up to twice rounded).
Skipped where triton is not installed (pip install triton; it is in the dev extras).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from fast import CausalMask
from fast.kernels import dispatch
from tests.helpers import run_interpreted

HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed (pip install triton; dev extras)")

SCRIPT = r"""
import json, math
import numpy as np
import torch
import fast
from fast import CausalMask, masked_linear_attention, favor_attention
from fast.kernels import dispatch
import fast.kernels.causal_scan as kernel_module
from fast.kernels.causal_scan import causal_scan, kernel_blocks
from reference.attention import masked_kernel_attention
from reference.masks.sequence import causal_mask

assert dispatch.CAUSAL_KERNEL == "force"
u = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float64": 2.0 ** -53}


def dense(q, k, v, c, g=None, gd=None):
    # (num, den) and, given (g, gd), (dq, dk, dv): float64 NumPy from the definition
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    n = q.shape[-2]
    c = np.zeros(q.shape[:-1]) if c is None else np.asarray(c, dtype=np.float64)
    r = np.maximum.accumulate(c, axis=-1)
    w = causal_mask(n) * np.exp(np.minimum(c[..., None, :] - r[..., :, None], 0.0))
    a = w * (q @ np.swapaxes(k, -1, -2))
    out = [a @ v, a.sum(-1)]
    if g is not None:
        g, gd = np.asarray(g, dtype=np.float64), np.asarray(gd, dtype=np.float64)
        ds = w * (g @ np.swapaxes(v, -1, -2) + gd[..., :, None])
        out += [ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(a, -1, -2) @ g]
    return out


def case(n, m, d, dtype, stable, seed, segments=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(2, n, m, generator=gen, dtype=torch.float64)
    k = torch.rand(2, n, m, generator=gen, dtype=torch.float64)
    v = torch.randn(2, n, d, generator=gen, dtype=torch.float64)
    gn = torch.randn(2, n, d, generator=gen, dtype=torch.float64)
    gd = torch.randn(2, n, generator=gen, dtype=torch.float64)
    # constants spanning 60 (exp(60) overflows float32; beyond factor_range: the narrow route's limit)
    c = (torch.rand(2, n, generator=gen, dtype=torch.float64) * 60 - 30) if stable else None
    q, k, v, gn, gd = (t.to(dtype) for t in (q, k, v, gn, gd))
    cc = None if c is None else c.to(dtype)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    kernel_module.SEGMENTS = segments  # None: one segment per slice on a CPU
    num, den = causal_scan(qq, kk, vv, None if cc is None else cc.unsqueeze(-1))
    grads = torch.autograd.grad((num, den), (qq, kk, vv), (gn, gd))
    scanned = kernel_module.segment_plan(-(-n // kernel_blocks(m, d)[0]), 2, q.device)[0]
    kernel_module.SEGMENTS = None
    got = [num, den, *grads]
    # the twin, the PyTorch scan, in the same dtype (dispatch switched off)
    dispatch.CAUSAL_KERNEL = "off"
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    mask = CausalMask(n)
    tn, td = mask.attend(qq, kk, vv) if cc is None else mask.attend(qq, kk, vv, key_log_scale=cc.unsqueeze(-1))
    twin = [tn, td, *torch.autograd.grad((tn, td), (qq, kk, vv), (gn, gd))]
    dispatch.CAUSAL_KERNEL = "force"
    cn = None if cc is None else cc.double().numpy()
    exact = dense(q.double().numpy(), k.double().numpy(), v.double().numpy(), cn, gn.double().numpy(),
                  gd.double().numpy())
    absref = dense(q.double().abs().numpy(), k.double().abs().numpy(), v.double().abs().numpy(), cn,
                   gn.double().abs().numpy(), gd.double().abs().numpy())
    kk_terms = n + m + 2 * 64  # chunks of at most 64 tokens, forward and backward
    name = str(dtype).replace("torch.", "")
    bound = (kk_terms * u[name]) if dtype != torch.bfloat16 else u[name] + kk_terms * 2.0 ** -24
    out = {"n": n, "m": m, "d": d, "dtype": name, "stable": stable, "dtypes": [str(t.dtype) for t in got],
           "segments": scanned}
    for label, mine, ref, ab, tw in zip(("num", "den", "dq", "dk", "dv"), got, exact, absref, twin):
        err = np.abs(mine.detach().double().numpy() - ref)
        twin_err = np.abs(tw.detach().double().numpy() - ref)
        out[label] = {"ratio": float((err / (bound * ab + 1e-300)).max()), "finite": bool(torch.isfinite(mine).all()),
                      "twin_ratio": float((twin_err / (bound * ab + 1e-300)).max()),
                      "max_err": float(err.max())}
    return out


res = {"cases": []}
for args in [(80, 16, 16, torch.float32, False, 1), (80, 16, 16, torch.float32, True, 2),
             (75, 20, 80, torch.float32, True, 3), (70, 32, 24, torch.bfloat16, False, 4),
             (70, 32, 24, torch.bfloat16, True, 5), (40, 64, 32, torch.float64, True, 6),
             (37, 256, 40, torch.float32, True, 7), (1, 16, 16, torch.float32, True, 10),
             (70, 64, 64, torch.float32, False, 11),
             # segments scanned in parallel from the totals of the ones before (after) them
             (300, 20, 80, torch.float32, True, 12, 3), (300, 16, 16, torch.bfloat16, False, 13, 3),
             (200, 32, 24, torch.float64, True, 14, 7), (90, 256, 40, torch.float32, True, 15, 3)]:
    res["cases"].append(case(*args))

# gradcheck (float64, finite differences of the kernel's forward vs its backward kernel), plain and stabilised
gen = torch.Generator().manual_seed(8)
n = 21
q, k = (torch.rand(1, n, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
v = torch.randn(1, n, 2, generator=gen, dtype=torch.float64, requires_grad=True)
c = torch.randn(1, n, 1, generator=gen, dtype=torch.float64) * 3
res["gradcheck"] = bool(torch.autograd.gradcheck(lambda a, b, x: causal_scan(a, b, x), (q, k, v)))
res["gradcheck_stable"] = bool(torch.autograd.gradcheck(lambda a, b, x: causal_scan(a, b, x, c), (q, k, v)))
# double backward through CausalMask.attend: the kernel forward, the PyTorch scan's differentiable backward
mask = CausalMask(n)
res["gradgradcheck"] = bool(torch.autograd.gradgradcheck(lambda a, b, x: mask.attend(a, b, x, key_log_scale=c),
                                                         (q, k, v)))

# the driver and FAVOR+ on the kernel against the PyTorch scan (dispatch off), float32
gen = torch.Generator().manual_seed(9)
n, m, d = 90, 16, 8
pq, pk = (torch.rand(2, n, m, generator=gen) for _ in range(2))
v = torch.randn(2, n, d, generator=gen)
qr, kr = (torch.randn(2, n, 8, generator=gen) for _ in range(2))
w = torch.randn(m, 8, generator=gen)
kernel_out = masked_linear_attention(pq, pk, v, CausalMask(n))
favor_kernel = favor_attention(qr * 3, kr * 3, v, w, mask=CausalMask(n))
dispatch.CAUSAL_KERNEL = "off"
twin_out = masked_linear_attention(pq, pk, v, CausalMask(n))
favor_twin = favor_attention(qr * 3, kr * 3, v, w, mask=CausalMask(n))
dispatch.CAUSAL_KERNEL = "force"
ref = masked_kernel_attention(pq.double().numpy(), pk.double().numpy(), v.double().numpy(), causal_mask(n))
res["driver"] = {"vs_reference": float(np.abs(kernel_out.double().numpy() - ref).max()),
                 "vs_twin": float((kernel_out - twin_out).abs().max()),
                 "favor_vs_twin": float((favor_kernel - favor_twin).abs().max() / favor_twin.abs().max()),
                 "scale": float(np.abs(ref).max())}

# FAVOR+'s route on the kernel (CausalMask.attend_optimistic): the plain kernel where a narrow
# slice has one constant; a wide call (a loud late key: constants spanning past float32's exponent
# range) redone by the decayed kernel, which the mask keeps to; with narrow_constants False (per-key
# running maxima) the decayed kernel at once. Each route's outputs and gradients against
# the PyTorch scan's (dispatch off); the wide call against float64.
routes = []
plain_scan = kernel_module.causal_scan


def spy(phi_q, phi_k, v, c=None, **kw):
    routes.append(c is not None)
    return plain_scan(phi_q, phi_k, v, c, **kw)


kernel_module.causal_scan = spy
gen = torch.Generator().manual_seed(12)
n = 70
qr, kr, vr = (torch.randn(2, n, 8, generator=gen) for _ in range(3))
w = torch.randn(16, 8, generator=gen)
favor = {}
for label in ("plain", "decayed", "twin"):
    dispatch.CAUSAL_KERNEL = "off" if label == "twin" else "force"
    mask = CausalMask(n)
    mask.narrow_constants = label != "decayed"
    xs = [t.clone().requires_grad_() for t in (qr, kr, vr)]
    routes.clear()
    out = favor_attention(*xs, w, mask=mask)
    out.sum().backward()
    favor[label] = [out.detach()] + [x.grad for x in xs]
    favor[label + "_routes"] = list(routes)
dispatch.CAUSAL_KERNEL = "force"
w_loud = w.clone()
w_loud[0] = 20.0 * w[0] / w[0].norm()  # z_j = 20 t / 8^(1/4) - t^2 / (2 sqrt 8) at k_j = t w_0 / |w_0|: ~198 at t = 30
k_loud = kr.clone()
k_loud[:, n // 2 + 1] = 1.5 * w_loud[0]
mask = CausalMask(n)
routes.clear()
loud = favor_attention(qr, k_loud, vr, w_loud, mask=mask)
loud_routes, loud_wide = list(routes), mask._wide
routes.clear()
favor_attention(qr, k_loud, vr, w_loud, mask=mask)
dispatch.CAUSAL_KERNEL = "off"
loud_ref = favor_attention(qr.double(), k_loud.double(), vr.double(), w_loud.double(), mask=CausalMask(n))
dispatch.CAUSAL_KERNEL = "force"
kernel_module.causal_scan = plain_scan
rel_max = lambda a, b: float((a - b).abs().max() / b.abs().max())
res["favor_routes"] = {
    "routes": {label: favor[label + "_routes"] for label in ("plain", "decayed")},
    "vs_twin": {label: [rel_max(a, b) for a, b in zip(favor[label], favor["twin"])]
                for label in ("plain", "decayed")},
    "loud_routes": loud_routes, "loud_wide": loud_wide, "loud_again": list(routes),
    "loud_vs_float64": rel_max(loud.double(), loud_ref),
    "loud_span": float(max(float(c[..., -1] - c[..., 0]) for c in CausalMask(n).key_stabilizer(
        (k_loud / 8 ** 0.25) @ w_loud.t() - 0.5 * (k_loud * k_loud).sum(-1, keepdim=True) / 8 ** 0.5).squeeze(-1))),
}

# CausalMask.attend_reaches_keys: a non-finite phi_k_j or v_j makes the kernel's num or den
# non-finite, also where phi_q is 0 in that feature at every query (0 * inf is NaN), at a chunk's
# first and last token, inside one, at N - 1, with and without the stabiliser, one segment or three
reach = []
n, m, d = 70, 16, 8
for seg in (None, 3):
    kernel_module.SEGMENTS = seg
    for stable in (False, True):
        for name in ("phi_k", "v"):
            for j in (0, 5, 31, 32, n - 1):
                for value in (math.inf, -math.inf, math.nan):
                    gen = torch.Generator().manual_seed(10)
                    q, k = (torch.rand(1, n, m, generator=gen) + 0.5 for _ in range(2))
                    v = torch.randn(1, n, d, generator=gen)
                    q[..., 0] = 0.0
                    (k if name == "phi_k" else v)[0, j, 0] = value
                    c = torch.randn(1, n, 1, generator=gen) * 3 if stable else None
                    num, den = causal_scan(q, k, v, c)
                    reach.append(bool(not (torch.isfinite(num).all() and torch.isfinite(den).all())))
kernel_module.SEGMENTS = None
res["reach"] = reach

# the driver on bfloat16 features (attend_takes_half): the kernel reads them as they are and sums in
# float32; against the float64 reference on the same bfloat16 values, and against the route of
# float32 copies on the PyTorch scan (dispatch off), outputs and gradients; double backward (the
# twin's backward on float32 copies of the bfloat16 inputs) against the first-order gradients
gen = torch.Generator().manual_seed(11)
n, m, d = 90, 16, 8
leaves = [(torch.rand(2, n, m, generator=gen) + 0.1).to(torch.bfloat16) for _ in range(2)]
leaves.append(torch.randn(2, n, d, generator=gen).to(torch.bfloat16))
g = torch.randn(2, n, d, generator=gen)
half = {}
for mode in ("force", "off"):
    dispatch.CAUSAL_KERNEL = mode
    xs = [t.clone().requires_grad_() for t in leaves]
    out = masked_linear_attention(*xs, CausalMask(n))
    (out.float() * g).sum().backward()
    half[mode] = [out.detach().double()] + [x.grad.double() for x in xs]
    half[mode + "_dtypes"] = [str(t.dtype) for t in [out] + [x.grad for x in xs]]
dispatch.CAUSAL_KERNEL = "force"
xs = [t.clone().requires_grad_() for t in leaves]
out = masked_linear_attention(*xs, CausalMask(n))
first = torch.autograd.grad((out.float() * g).sum(), xs, create_graph=True)
ref = masked_kernel_attention(*(t.double().numpy() for t in leaves), causal_mask(n))
rel = lambda a, b: float((a - b).norm() / b.norm())
res["half"] = {"vs_reference": float(np.abs(half["force"][0].numpy() - ref).max() / np.abs(ref).max()),
               "vs_copies": [rel(a, b) for a, b in zip(half["force"], half["off"])],
               "dtypes": half["force_dtypes"], "copies_dtypes": half["off_dtypes"],
               "double_vs_first": [rel(a.detach().double(), b) for a, b in zip(first, half["force"][1:])],
               "double_has_graph": all(t.requires_grad for t in first)}
print("RESULT " + json.dumps(res))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(SCRIPT)


@needs_triton
def test_kernel_forward_and_backward_within_the_rounding_bound_of_the_float64_reference(interpreted):
    for case in interpreted["cases"]:
        for label in ("num", "den", "dq", "dk", "dv"):
            got = case[label]
            assert got["finite"], (case["n"], case["m"], case["d"], case["dtype"], case["stable"], label)
            assert got["ratio"] <= 1.0, (case["n"], case["m"], case["d"], case["dtype"], case["stable"], label, got)


@needs_triton
def test_some_cases_scan_several_segments(interpreted):
    assert {case["segments"] for case in interpreted["cases"]} == {1, 3, 7}


@needs_triton
def test_kernel_outputs_keep_the_input_dtype(interpreted):
    for case in interpreted["cases"]:
        assert case["dtypes"] == [f"torch.{case['dtype']}"] * 5


@needs_triton
def test_bound_is_tight_enough_to_fail_the_pytorch_scan_in_bfloat16(interpreted):
    # the twin rounds every intermediate to bfloat16; the kernel accumulates in float32: the bound
    # the kernel meets must be one the bfloat16 PyTorch scan does not (else it tests nothing)
    twins = [case[label]["twin_ratio"] for case in interpreted["cases"] if case["dtype"] == "bfloat16"
             for label in ("num", "dq")]
    assert max(twins) > 1.0


@needs_triton
def test_stabilised_kernel_stays_finite_where_the_constants_span_past_float32(interpreted):
    wide = [case for case in interpreted["cases"] if case["stable"] and case["dtype"] == "float32"]
    assert wide and all(case[label]["finite"] for case in wide for label in ("num", "den", "dq", "dk", "dv"))


@needs_triton
def test_kernel_gradcheck_and_double_backward_in_float64(interpreted):
    assert interpreted["gradcheck"]
    assert interpreted["gradcheck_stable"]
    assert interpreted["gradgradcheck"]


@needs_triton
def test_driver_and_favor_on_the_kernel_match_the_pytorch_scan(interpreted):
    got = interpreted["driver"]
    # float32 ratios of sums of <= N + m + 2C positive terms: a few thousand u of the output's scale
    assert got["vs_reference"] <= 4096 * 2.0 ** -24 * got["scale"], got
    assert got["vs_twin"] <= 4096 * 2.0 ** -24 * got["scale"], got
    assert got["favor_vs_twin"] <= 4096 * 2.0 ** -24, got


@needs_triton
def test_favor_takes_the_plain_kernel_on_narrow_slices_and_redoes_a_wide_call_with_the_decayed_one(interpreted):
    """CausalMask.attend_optimistic on the kernel: the plain kernel (no constants) where the keys'
    constants are one per (narrow) slice, forward and backward; narrow_constants False (per-key
    running maxima): the decayed kernel. Both
    within float32 round-off of the PyTorch scan (a few thousand u, as above; the gradients are
    differences of such sums, so relative to their largest entry 16x that). A loud late key spans
    the constants past float32's exponent range (over 87, so the one-reference factors of the early
    keys are 0): the flag fails, the decayed kernel redoes it and equals float64, and the mask keeps
    to the decayed kernel."""
    got = interpreted["favor_routes"]
    assert got["routes"] == {"plain": [False], "decayed": [True]}, got
    for label, errs in got["vs_twin"].items():
        assert errs[0] <= 4096 * 2.0 ** -24 and max(errs[1:]) <= 16 * 4096 * 2.0 ** -24, (label, errs)
    assert got["loud_span"] > 87.0, got
    assert got["loud_routes"] == [False, True] and got["loud_wide"] and got["loud_again"] == [True], got
    assert got["loud_vs_float64"] <= 1e-4, got


@needs_triton
def test_a_non_finite_key_or_value_always_reaches_the_kernels_outputs(interpreted):
    """What CausalMask.attend_reaches_keys promises the driver (it then skips its read passes over
    phi_k and v), for the kernel: 2 x 2 x 2 x 5 x 3 planted entries, every one seen."""
    assert len(interpreted["reach"]) == 120 and all(interpreted["reach"])


@needs_triton
def test_driver_reads_bfloat16_features_in_the_kernel_and_keeps_float32_sums(interpreted):
    """attend_takes_half: the driver's bfloat16 route through the kernel (no float32 copies) against
    the float64 reference on the same bfloat16 values and against the route of float32 copies on
    the PyTorch scan. Both sum in float32 and round once to bfloat16 at the end: the outputs differ
    by at most two such roundings (2^-8 each, relative) plus float32 round-off; the gradients, which
    are rounded to bfloat16 once too, likewise. Double backward runs the twin on float32 copies."""
    got = interpreted["half"]
    assert got["dtypes"] == got["copies_dtypes"] == ["torch.bfloat16"] * 4
    assert got["vs_reference"] <= 2.0 ** -8 + 2.0 ** -16, got
    assert max(got["vs_copies"]) <= 2 * 2.0 ** -8, got
    assert got["double_has_graph"] and max(got["double_vs_first"]) <= 2 * 2.0 ** -8, got


# ------------------------------------------------------------------------------ dispatch (no kernel run)


def test_auto_keeps_the_pytorch_scan_on_cpu_tensors(monkeypatch):
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "auto")
    x = torch.ones(2, 8, 4)
    assert dispatch.use_causal_kernel(x, x, x) is False


def test_off_and_a_bad_switch_value(monkeypatch):
    x = torch.ones(8, 4)
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "off")
    assert dispatch.use_causal_kernel(x, x, x) is False
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "sometimes")
    with pytest.raises(ValueError, match="CAUSAL_KERNEL"):
        dispatch.use_causal_kernel(x, x, x)


def test_force_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "force")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.ones(8, 4)
    assert dispatch.use_causal_kernel(x, x, x) is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.use_causal_kernel(x, x, x) is HAVE_TRITON


@needs_triton
@pytest.mark.parametrize("args, match", [
    ((torch.ones(4, 300), torch.ones(4, 300), torch.ones(4, 2)), "m"),
    ((torch.ones(4, 3), torch.ones(4, 3), torch.ones(4, 2, dtype=torch.float64)), "dtype"),
    ((torch.ones(4, 3), torch.ones(5, 3), torch.ones(4, 2)), "leading dims"),
])
def test_causal_scan_names_bad_arguments(args, match):
    from fast.kernels.causal_scan import causal_scan
    with pytest.raises(ValueError, match=match):
        causal_scan(*args)


@needs_triton
def test_causal_scan_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    from fast.kernels.causal_scan import causal_scan
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.ones(4, 3)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        causal_scan(x, x, x)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_attend_takes_the_kernel_and_matches_the_pytorch_scan(monkeypatch, dtype):
    gen = torch.Generator().manual_seed(0)
    n, m, d = 1000, 64, 64
    q, k = (torch.rand(2, n, m, generator=gen).to("cuda", dtype) for _ in range(2))
    v = torch.randn(2, n, d, generator=gen).to("cuda", dtype)
    c = (torch.randn(2, n, 1, generator=gen) * 20).to("cuda", dtype)
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "auto")
    assert dispatch.use_causal_kernel(q, k, v)
    mask = CausalMask(n)
    kernel = [mask.attend(q, k, v), mask.attend(q, k, v, key_log_scale=c)]
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "off")
    exact = [mask.attend(q.double(), k.double(), v.double()),
             mask.attend(q.double(), k.double(), v.double(), key_log_scale=c.double())]
    absref = [mask.attend(q.double(), k.double(), v.double().abs()),
              mask.attend(q.double(), k.double(), v.double().abs(), key_log_scale=c.double())]
    # the interpreter cases' bound (module doc): K = N + m + 2C terms (C <= 64) in float32, a
    # bfloat16 result's rounding, and five TF32 roundings where the kernel takes TF32 operands
    tf32 = 2.0 ** -11 if dtype == torch.bfloat16 or torch.backends.cuda.matmul.allow_tf32 else 0.0
    bound = (2.0 ** -8 if dtype == torch.bfloat16 else 0.0) + 5 * tf32 + (n + m + 128) * 2.0 ** -24
    for (num, den), (en, ed), (an, ad) in zip(kernel, exact, absref):
        assert num.dtype == dtype and den.dtype == dtype
        assert ((num.double() - en).abs() <= bound * an).all()
        assert ((den.double() - ed).abs() <= bound * ad).all()
