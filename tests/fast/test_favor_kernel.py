"""The Triton FAVOR+ features (fast.kernels.favor_features) against their twin,
fast.features.favor_exponentials, on a CPU through Triton's interpreter; the dispatch rule
(fast.kernels.dispatch.use_feature_kernel).

TRITON_INTERPRET=1 must be set before triton is imported, so the kernels run in one subprocess
(MASKBENCH_CAUSAL_KERNEL=force) that prints its measurements as JSON; the tests judge them. Cases:
m in one block of columns (16, 64, 70: padded to 128) and in two (200: blocks of 128, the second
partial), d from 5 (padded to 16) to 64, rows not a multiple of the 64 per program, batched leading dims, the keys' constants
from a running maximum (CausalMask) and from one slice maximum (the default), float32 and float64.

Tolerances are bounds (docs/methods.md): the kernels form the same sums as the twin in another
order, so an exponent differs by at most a few (d + 2) u |x| |w| and a feature by that relative
amount; with |x w^T| <= 40 here that is below 2^-12 in float32 and 2^-40 in float64. Gradients:
the twin's, likewise. gradcheck and gradgradcheck run on features normalised per row (phi /
sum_a phi_a), where the constants the features are shifted by cancel: finite differences of the
raw features see a moved maximum that the analytic gradient (constants held fixed, as in
attention, where they cancel too) rightly ignores. Skipped where triton is not installed.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from fast.kernels import dispatch
from tests.helpers import run_interpreted

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install triton; dev extras)")

SCRIPT = r"""
import json
import torch
from fast import CausalMask, PaddingMask, favor_attention, gaussian_projection
from fast.features import favor_exponentials, slice_max
from fast.kernels import dispatch
from fast.kernels.favor_features import favor_kernel_features
from fast.masks.sequence import _running_max

import fast.kernels.favor_features as kernel_module

assert dispatch.CAUSAL_KERNEL == "force"
rel = lambda a, b: float((a - b).norm() / b.norm())
res = {"cases": []}
kernel_grads = []  # (keys, need_x, need_w) of each backward the gradient kernel ran
grads_by_kernel = kernel_module._kernel_grads


def spy(g_phi, x, w, phi, half, need_x, need_w):
    kernel_grads.append((half is not None, need_x, need_w))
    return grads_by_kernel(g_phi, x, w, phi, half, need_x, need_w)


kernel_module._kernel_grads = spy
gen = torch.Generator().manual_seed(0)
for lead, n, d, m, dtype in [((2,), 70, 5, 200, torch.float64), ((1, 2), 130, 16, 64, torch.float32),
                             ((3,), 9, 8, 16, torch.float64), ((2,), 65, 64, 70, torch.float32)]:
    q = torch.randn(*lead, n, d, generator=gen, dtype=dtype) * 2
    k = torch.randn(*lead, n, d, generator=gen, dtype=dtype) * 2
    w = torch.randn(m, d, generator=gen, dtype=dtype) * d ** -0.25
    half = 0.5 * d ** -0.5
    for name, fn in (("running", _running_max), ("slice", slice_max)):
        a = [t.clone().requires_grad_() for t in (q, k, w)]
        pq, pk, c, nk = favor_kernel_features(a[0], a[1], a[2], a[2], half, fn)
        b = [t.clone().requires_grad_() for t in (q, k, w)]
        rq = favor_exponentials(b[0], b[2], half, is_query=True, query_norm=False)[0]
        rk, rc, rn = favor_exponentials(b[1], b[2], half, is_query=False, row_stabilizer=fn)
        gq, gk = torch.randn(pq.shape, generator=gen, dtype=dtype), torch.randn(pk.shape, generator=gen, dtype=dtype)
        ((pq * gq).sum() + (pk * gk).sum()).backward()
        ((rq * gq).sum() + (rk * gk).sum()).backward()
        res["cases"].append({"dtype": str(dtype).split(".")[1], "m": m, "d": d, "constants": name,
                             "diff": [rel(pq.detach(), rq.detach()), rel(pk.detach(), rk.detach()), rel(c, rc),
                                      rel(nk, rn.detach())] + [rel(x.grad, y.grad) for x, y in zip(a, b)],
                             "largest": float(max(pq.max(), pk.max())), "smallest": float(min(pq.min(), pk.min())),
                             "dtypes": [str(t.dtype) for t in (pq, pk)]})

res["case_kernel_grads"] = list(kernel_grads)

# the gradient kernel with few programs (each walks several row blocks, strided) and with one of
# x, w not requiring grad (that output is neither formed nor returned), against the twin
kernel_module.GRAD_PROGRAMS = 2
q, k = (torch.randn(2, 170, 12, generator=gen) for _ in range(2))
w = torch.randn(24, 12, generator=gen) * 12 ** -0.25
strided = {}
for label, grad_x, grad_w in (("both", True, True), ("x only", True, False), ("w only", False, True)):
    kernel_grads.clear()
    a = [t.clone().requires_grad_(flag) for t, flag in ((q, grad_x), (k, grad_x), (w, grad_w))]
    pq, pk = favor_kernel_features(a[0], a[1], a[2], a[2], 0.1, _running_max)[:2]
    b = [t.clone().requires_grad_(flag) for t, flag in ((q, grad_x), (k, grad_x), (w, grad_w))]
    rq = favor_exponentials(b[0], b[2], 0.1, is_query=True, query_norm=False)[0]
    rk = favor_exponentials(b[1], b[2], 0.1, is_query=False, row_stabilizer=_running_max)[0]
    gq, gk = torch.randn(pq.shape, generator=gen), torch.randn(pk.shape, generator=gen)
    ((pq * gq).sum() + (pk * gk).sum()).backward()
    ((rq * gq).sum() + (rk * gk).sum()).backward()
    strided[label] = {"diff": [rel(x.grad, y.grad) for x, y in zip(a, b) if x.requires_grad],
                      "none": [x.grad is None for x in a], "calls": sorted(kernel_grads)}
kernel_module.GRAD_PROGRAMS = 1024
res["strided"] = strided

kernel_grads.clear()
q, k = (torch.randn(1, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
w = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
norm = lambda phi: phi / phi.sum(-1, keepdim=True)
f = lambda q, k, w: tuple(norm(p) for p in favor_kernel_features(q, k, w, w, 0.3, _running_max)[:2])
res["gradcheck"] = bool(torch.autograd.gradcheck(f, (q, k, w)))
res["gradgradcheck"] = bool(torch.autograd.gradgradcheck(f, (q, k, w)))


def second(fn):
    a = [t.detach().clone().requires_grad_() for t in (q, k, w)]
    pq, pk = fn(*a)
    gs = torch.autograd.grad(pq.sin().sum() + (pk ** 2).sum(), a, create_graph=True)
    return torch.autograd.grad(sum((g ** 2).sum() for g in gs), a)


kern = second(lambda a, b, c: favor_kernel_features(a, b, c, c, 0.3, _running_max)[:2])
twin = second(lambda a, b, c: (favor_exponentials(a, c, 0.3, is_query=True, query_norm=False)[0],
                               favor_exponentials(b, c, 0.3, is_query=False, row_stabilizer=_running_max)[0]))
res["double_backward"] = [rel(x, y) for x, y in zip(kern, twin)]
res["gradcheck_kernel_grads"] = len(kernel_grads)

# favor_attention on the kernels (features and scan) against the PyTorch twins, causal and padded
n = 90
q, k, v = (torch.randn(2, n, 8, generator=gen) for _ in range(3))
w = gaussian_projection(32, 8, generator=gen)
masks = {"causal": CausalMask(n), "padding": PaddingMask(torch.arange(n) < 80)}
got = {key: favor_attention(q * 2, k * 2, v, w, mask=mask) for key, mask in masks.items()}
dispatch.CAUSAL_KERNEL = "off"
res["driver"] = {key: rel(got[key], favor_attention(q * 2, k * 2, v, w, mask=mask)) for key, mask in masks.items()}
print("RESULT " + json.dumps(res))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(SCRIPT)


@needs_triton
def test_features_constants_and_gradients_match_the_twin(interpreted):
    bound = {"float32": 2.0 ** -12, "float64": 2.0 ** -40}
    assert {(c["m"], c["constants"]) for c in interpreted["cases"]} >= {(200, "running"), (200, "slice"), (70, "running")}
    for case in interpreted["cases"]:
        assert max(case["diff"]) <= bound[case["dtype"]], case
        assert case["dtypes"] == [f"torch.{case['dtype']}"] * 2


@needs_triton
def test_every_feature_is_in_zero_one_with_a_one_per_query(interpreted):
    # the stabilisers' guarantee: exponents <= 0, and each query's largest feature is exp(0) = 1
    for case in interpreted["cases"]:
        assert case["largest"] == 1.0 and case["smallest"] >= 0.0, case


@needs_triton
def test_the_gradient_kernel_ran_where_m_fits_one_block_and_walks_strided_row_blocks(interpreted):
    """The cases above: their backward ran the gradient kernel for m <= 128 (queries and keys, x and
    w both wanted) and the PyTorch operations for m = 200 (2 cases of 2 stabilisers each). With two
    programs over six row blocks (2 slices of 170 rows, 64 rows a block), and with only x or only w wanting a
    gradient, the kernel's gradients are the twin's within the bound above."""
    calls = [tuple(c) for c in interpreted["case_kernel_grads"]]
    assert sorted(calls) == sorted([(False, True, True), (True, True, True)] * 6), calls
    for label, got in interpreted["strided"].items():
        assert max(got["diff"]) <= 2.0 ** -12, (label, got)
    assert interpreted["strided"]["x only"]["none"] == [False, False, True]
    assert interpreted["strided"]["w only"]["none"] == [True, True, False]
    assert interpreted["strided"]["x only"]["calls"] == [[False, True, False], [True, True, False]]
    assert interpreted["strided"]["w only"]["calls"] == [[False, False, True], [True, False, True]]
    assert interpreted["gradcheck_kernel_grads"] > 0  # gradcheck's first-order gradients are the kernel's


@needs_triton
def test_gradcheck_and_double_backward(interpreted):
    assert interpreted["gradcheck"] and interpreted["gradgradcheck"]
    assert max(interpreted["double_backward"]) <= 2.0 ** -40, interpreted["double_backward"]


@needs_triton
def test_favor_attention_on_the_kernels_matches_the_pytorch_twins(interpreted):
    # float32 ratios of sums of <= N + m positive terms: a few thousand u (as test_causal_triton)
    assert max(interpreted["driver"].values()) <= 4096 * 2.0 ** -24, interpreted["driver"]


def test_auto_keeps_the_pytorch_features_on_cpu_and_off_everywhere(monkeypatch):
    x, w = torch.ones(2, 8, 4), torch.ones(16, 4)
    for mode in ("auto", "off"):
        monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", mode)
        assert dispatch.use_feature_kernel(x, w) is False
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "sometimes")
    with pytest.raises(ValueError, match="CAUSAL_KERNEL"):
        dispatch.use_feature_kernel(x, w)


@needs_triton
def test_names_bad_arguments():
    from fast.kernels.favor_features import favor_kernel_features
    x, w = torch.ones(2, 8, 4), torch.ones(16, 4)
    with pytest.raises(ValueError, match="share one dtype"):
        favor_kernel_features(x, x.double(), w, w, 0.5, lambda r: r)
    with pytest.raises(ValueError, match="share d"):
        favor_kernel_features(x, x, torch.ones(16, 5), torch.ones(16, 5), 0.5, lambda r: r)
    with pytest.raises(ValueError, match="must be a floating tensor"):
        favor_kernel_features(x, x.long(), w, w, 0.5, lambda r: r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
def test_cuda_features_and_favor_attention_match_the_twins(monkeypatch):
    """On the GPU (three TF32 products per float32 dot, tf32x3): features, constants and gradients
    (of q, k and the projection: the gradient kernel) against favor_exponentials on the same device, within the bound of the interpreter's test (an
    exponent of |x w^T| <= 40 moved by ~2^-20 relative is ~2^-15 of a feature), and favor_attention
    with a causal mask on the kernels against the PyTorch twins (dispatch off)."""
    from fast import CausalMask, favor_attention, gaussian_projection
    from fast.features import favor_exponentials
    from fast.kernels.favor_features import favor_kernel_features
    from fast.masks.sequence import _running_max

    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "auto")
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, h, n, d, m = 2, 4, 3000, 64, 128
    q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda") for _ in range(3))
    w = gaussian_projection(m, d, generator=torch.Generator().manual_seed(1)).cuda() * d ** -0.25
    assert dispatch.use_feature_kernel(q, w)
    half = 0.5 * d ** -0.5
    a = [t.clone().requires_grad_() for t in (q, k, w)]
    pq, pk, c, _ = favor_kernel_features(a[0], a[1], a[2], a[2], half, _running_max)
    r = [t.clone().requires_grad_() for t in (q, k, w)]
    rq = favor_exponentials(r[0], r[2], half, is_query=True, query_norm=False)[0]
    rk, rc, _ = favor_exponentials(r[1], r[2], half, is_query=False, row_stabilizer=_running_max)
    (pq.sum() + (pk * 2).sum()).backward()
    (rq.sum() + (rk * 2).sum()).backward()
    rel = lambda x, y: float((x - y).norm() / y.norm())
    diffs = [rel(pq.detach(), rq.detach()), rel(pk.detach(), rk.detach()), rel(c, rc),
             rel(a[0].grad, r[0].grad), rel(a[1].grad, r[1].grad), rel(a[2].grad, r[2].grad)]
    assert max(diffs) <= 2.0 ** -12, diffs
    wp = gaussian_projection(m, d, generator=torch.Generator().manual_seed(2)).cuda()
    got = favor_attention(q, k, v, wp, mask=CausalMask(n))
    monkeypatch.setattr(dispatch, "CAUSAL_KERNEL", "off")
    want = favor_attention(q, k, v, wp, mask=CausalMask(n))
    assert rel(got, want) <= 2.0 ** -12
