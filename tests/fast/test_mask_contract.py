"""The mask contract (fast/operator.py: MaskOperator, its adapter as_operator) and fast.as_mask_operator
(fast/masks/explicit.py).

Equivalence with the dense NumPy reference uses the registry's metric (relative Frobenius) with
tests.helpers.EQUIV_TOL; sparse products are exact sums in another order (float64 round-off).
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch import nn

import fast
import reference.attention as ref_attention
from fast import (CausalMask, DenseMask, MaskOperator, PackingMask, PaddingMask, SparseMask, ToeplitzMask,
                  as_mask_operator, favor_attention, masked_linear_attention)
from fast.operator import OperatorAdapter, SymmetricMaskOperator, as_operator, default_key_stabilizer
from tests.helpers import EQUIV_TOL, gen, np_, positive, randn, rel_frobenius, unit_rows

N = 9


def _inputs(batch=(), n=N, m=3, d=2, seed=0):
    g = gen(seed)
    return positive((*batch, n, m), g), positive((*batch, n, m), g), randn((*batch, n, d), g)


def _dense(n=N, seed=1, batch=()):
    return positive((*batch, n, n), gen(seed))


def _reference(pq, pk, v, dense):
    return ref_attention.masked_kernel_attention(np_(pq), np_(pk), np_(v), np.asarray(dense, dtype=np.float64))


class UserMask:
    """A user's operator: n and matmul only, no base class."""

    def __init__(self, dense):
        self.dense, self.n = dense, dense.shape[-1]

    def matmul(self, x):
        return self.dense @ x


# ------------------------------------------------------------------------ the base class


def test_duck_typed_operators_are_wrapped_once_by_the_adapter():
    """isinstance is nominal; anything with n and a callable matmul is wrapped once (as_operator),
    and the wrapper is a MaskOperator whose products are the object's."""
    user = UserMask(_dense())
    assert not isinstance(user, MaskOperator) and not issubclass(UserMask, MaskOperator)
    assert isinstance(CausalMask(4), MaskOperator) and issubclass(CausalMask, MaskOperator)
    op = as_operator(user)
    assert isinstance(op, OperatorAdapter) and isinstance(op, MaskOperator) and op.wrapped is user
    assert as_operator(op) is op and as_mask_operator(op) is op  # never wrapped twice
    causal = CausalMask(4)
    assert as_operator(causal) is causal
    x = randn((2, N, 3), gen(7))
    assert torch.equal(op.matmul(x), user.matmul(x))
    assert not isinstance(torch.ones(3, 3), MaskOperator)  # a tensor has matmul but no n

    class NoMatmul:
        n = 3

    with pytest.raises(TypeError, match=r"mask \(.*NoMatmul\) has no callable matmul"):
        as_operator(NoMatmul())


def test_existing_masks_subclass_the_base_and_keep_their_specialised_forms():
    for cls in (CausalMask, PackingMask, PaddingMask, ToeplitzMask, fast.BlockToeplitzMask, fast.LowRankMask,
                fast.HypercubeDiffusionMask, DenseMask, SparseMask):
        assert issubclass(cls, MaskOperator), cls
    assert MaskOperator.attend is None and PackingMask.attend is None and fast.LowRankMask.attend is None
    assert CausalMask.attend is not None and PaddingMask.attend is not None and ToeplitzMask.attend is not None


def test_matmat_is_abstract():
    class Incomplete(MaskOperator):
        n = 3

    with pytest.raises(TypeError, match="_matmat"):
        Incomplete()


class Tril(MaskOperator):
    """A subclass implementing the product only: every capability takes its default."""

    def __init__(self, n=N, bad=None):
        self.n, self.bad = n, bad

    def _matmat(self, x):
        y = torch.cumsum(x, dim=-2)
        if self.bad == "rows":
            return y[..., :-1, :]
        if self.bad == "width":
            return y[..., :1]
        if self.bad == "list":
            return y.tolist()
        if self.bad == "lead":
            return y.expand(5, *y.shape) if y.dim() == 2 else y[:1]
        return y


def test_base_class_defaults():
    op = Tril()
    assert op.attend is None and not op.nonnegative and not op.rescales_keys
    assert not op.has_rmatmul and not op.has_abs_matmul
    x = randn((N, 2), gen(8))
    assert op.roundoff_bound(x) is None
    with pytest.raises(NotImplementedError, match="Tril offers no rmatmul"):
        op.rmatmul(x)
    with pytest.raises(NotImplementedError, match="Tril offers no abs_matmul"):
        op.abs_matmul(x)
    assert list(op.parameters()) == []
    z = randn((2, N, 4), gen(9))
    assert torch.equal(op.key_stabilizer(z), z.amax(dim=(-2, -1), keepdim=True))
    rows = op.row_key_stabilizer()  # the default stabiliser as a function of the rows' maxima
    assert torch.equal(rows(z.amax(-1, keepdim=True)), op.key_stabilizer(z))


def test_symmetric_operator_rmatmul_is_matmul():
    class SymTril(SymmetricMaskOperator):
        n = N

        def _matmat(self, x):
            return x + x.sum(-2, keepdim=True)

    op = SymTril()
    x = randn((N, 2), gen(10))
    assert op.has_rmatmul and torch.equal(op.rmatmul(x), op.matmul(x))


@pytest.mark.parametrize("method", ["matmul", "rmatmul", "abs_matmul", "roundoff_bound"])
def test_public_products_reject_a_wrong_input_naming_the_method(method):
    op = DenseMask(_dense() - 0.5)
    with pytest.raises(ValueError, match=rf"mask.{method}\(x\): x must have N=9 tokens on axis -2, got shape "
                                         r"\(8, 2\) \(mask is DenseMask\)"):
        getattr(op, method)(torch.ones(8, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match=rf"mask.{method}\(x\): x must be a torch.Tensor, got list"):
        getattr(op, method)([[1.0]] * N)
    with pytest.raises(TypeError, match=rf"mask.{method}\(x\): x must be a floating tensor"):
        getattr(op, method)(torch.ones(N, 2, dtype=torch.int64))


@pytest.mark.parametrize("bad, exc, match", [
    ("rows", ValueError, r"mask.matmul\(x\) must return shape \(\.\.\., N, c\) = \(\.\.\., 9, 2\) .* got \(8, 2\) .*Tril"),
    ("width", ValueError, r"mask.matmul\(x\) must return shape .* got \(9, 1\)"),
    ("list", TypeError, r"mask.matmul\(x\) must return a torch.Tensor, got list \(mask is Tril\)"),
])
def test_public_matmul_rejects_a_wrong_subclass_output_naming_the_method(bad, exc, match):
    with pytest.raises(exc, match=match):
        Tril(bad=bad).matmul(randn((N, 2), gen(11)))


def test_public_matmul_accepts_an_output_batched_by_the_mask_and_casts_to_x_dtype():
    """The output's leading dims are x's broadcast against the mask's (a batched mask); its dtype
    is x's (a product computed in another dtype is cast back)."""
    y = Tril(bad="lead").matmul(randn((N, 2), gen(12)))
    assert y.shape == (5, N, 2)

    class Wider(Tril):
        def _matmat(self, x):
            return super()._matmat(x).double()

    x = randn((N, 2), gen(13), torch.float32)
    assert Wider().matmul(x).dtype == torch.float32


def test_key_stabilizer_default_is_the_per_slice_max_for_every_operator():
    z = randn((2, 3, 5, 4), gen(2))
    expected = z.amax(dim=(-2, -1), keepdim=True)
    assert torch.equal(default_key_stabilizer(z), expected)
    user = as_operator(UserMask(_dense(n=5)))
    assert torch.equal(user.key_stabilizer(z), expected)  # no key_stabilizer: the default
    assert user.row_key_stabilizer() is not None
    assert torch.equal(DenseMask(torch.ones(5, 5)).key_stabilizer(z), expected)  # base-class default
    seg = PackingMask(torch.tensor([0, 0, 1, 1, 1]))
    assert type(seg).key_stabilizer is not MaskOperator.key_stabilizer  # an override is used ...
    assert seg.row_key_stabilizer() is None  # ... on z itself


def test_row_key_stabilizer_follows_the_key_stabilizer_in_use():
    """The row form stands for the key_stabilizer of the class that declares it: CausalMask's
    running max of the rows' maxima; a subclass or an instance that replaces key_stabilizer gets
    None (its stabiliser is called on z)."""
    z = randn((2, N, 4), gen(14))
    causal = CausalMask(N)
    rows = causal.row_key_stabilizer()
    assert torch.equal(rows(z.amax(-1, keepdim=True)), causal.key_stabilizer(z))

    class OwnStabiliser(CausalMask):
        def key_stabilizer(self, z):
            return z.amax(-1, keepdim=True)

    assert OwnStabiliser(N).row_key_stabilizer() is None
    patched = CausalMask(N)
    patched.key_stabilizer = lambda z: z.amax(-1, keepdim=True)
    assert patched.row_key_stabilizer() is None
    assert as_operator(RowMaxKeys(_dense())).row_key_stabilizer() is None  # a duck's own stabiliser


def test_favor_attention_calls_a_user_key_stabilizer():
    """favor_attention uses the operator's key_stabilizer for every operator, including user ones."""
    calls = []

    class Stabilised(UserMask):
        def key_stabilizer(self, z):
            calls.append(tuple(z.shape))
            return z.amax(dim=(-2, -1), keepdim=True) + 1.0  # any constant cancels

    g = gen(3)
    q, k, v = unit_rows((2, N, 4), g), unit_rows((2, N, 4), g), randn((2, N, 2), g)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    dense = _dense()
    got = favor_attention(q, k, v, w, Stabilised(dense))
    assert calls == [(2, N, 8)]
    assert rel_frobenius(got, favor_attention(q, k, v, w, dense)) <= 1e-12


class RowMaxKeys(UserMask):
    """rescales_keys (C1): per-key constants c_j = max_a z_ja, undone inside attend."""

    rescales_keys = True

    def __init__(self, dense):
        super().__init__(dense)
        self.seen = []

    def key_stabilizer(self, z):
        return z.amax(-1, keepdim=True)  # (..., N, 1): one constant per key

    def attend(self, phi_q, phi_k, v, key_log_scale=None):
        self.seen.append(key_log_scale)
        if key_log_scale is not None:
            # the true features up to exp(-r) with r the largest constant: exp(c_j - r) <= 1
            r = key_log_scale.amax(dim=(-2, -1), keepdim=True)
            phi_k = phi_k * torch.exp(key_log_scale - r)
        a = (phi_q @ phi_k.mT) * self.dense
        return a @ v, a.sum(-1)


def test_favor_attention_passes_key_log_scale_to_operators_that_rescale_keys():
    """favor_attention hands an operator with rescales_keys what its key_stabilizer returned, detached
    and expanded to (..., N, 1); favor_features keeps the per-slice max for it (masked_linear_attention
    never passes key_log_scale), so both agree with the plain dense mask."""
    g = gen(4)
    q, k, v = unit_rows((2, N, 4), g, norm=2.0), unit_rows((2, N, 4), g, norm=2.0), randn((2, N, 2), g)
    q, k = q.requires_grad_(), k.requires_grad_()
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    dense = _dense()
    op = RowMaxKeys(dense)
    got = favor_attention(q, k, v, w, op)
    (c,) = op.seen
    assert c is not None and c.shape == (2, N, 1) and not c.requires_grad
    assert len(set(c.flatten().tolist())) > 1  # per key, not one constant
    expected = favor_attention(q, k, v, w, dense)
    assert rel_frobenius(got, expected) <= 1e-12
    phi_q, phi_k = fast.favor_features(q, k, w, op)
    torch.testing.assert_close(phi_k, fast.favor_features(q, k, w, dense)[1], rtol=0, atol=0)
    assert rel_frobenius(masked_linear_attention(phi_q, phi_k, v, op), expected) <= 1e-12
    assert op.seen[1:] == [None]
    got.sum().backward()  # the constants are detached: gradients flow through the features only
    assert bool(torch.isfinite(q.grad).all()) and bool(torch.isfinite(k.grad).all())


def test_rescales_keys_without_attend_is_ignored():
    """rescales_keys without an attend cannot undo per-key constants: the default stabiliser is used."""

    class NoAttend(UserMask):
        rescales_keys = True

        def key_stabilizer(self, z):  # pragma: no cover - must not be called
            raise AssertionError("called")

    g = gen(5)
    q, k, v = unit_rows((N, 4), g), unit_rows((N, 4), g), randn((N, 2), g)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    dense = _dense()
    assert rel_frobenius(favor_attention(q, k, v, w, NoAttend(dense)), favor_attention(q, k, v, w, dense)) <= 1e-12


def test_declared_capabilities():
    """The capabilities are attributes with safe defaults, for subclasses and wrapped duck types."""
    user = as_operator(UserMask(_dense()))
    assert not user.nonnegative and not user.has_abs_matmul and user.roundoff_bound(randn((N, 2), gen(6))) is None
    assert not user.rescales_keys and user.attend is None and not user.has_rmatmul
    assert DenseMask(_dense()).nonnegative and not DenseMask(-_dense()).nonnegative
    assert DenseMask(torch.ones(3, 3, dtype=torch.bool)).nonnegative
    assert DenseMask(_dense()).has_abs_matmul and DenseMask(_dense()).has_rmatmul
    x = randn((N, 2), gen(6))
    signed = _dense() - 0.6
    torch.testing.assert_close(DenseMask(signed).abs_matmul(x), signed.abs() @ x, rtol=1e-14, atol=0)
    sparse = SparseMask(sp.csr_matrix(signed.numpy()))
    assert not sparse.nonnegative
    torch.testing.assert_close(sparse.abs_matmul(x), signed.abs() @ x, rtol=1e-14, atol=0)
    assert as_operator(RowMaxKeys(_dense())).rescales_keys and as_operator(RowMaxKeys(_dense())).attend is not None

    class Weird(UserMask):
        nonnegative = torch.ones(3)  # not a truth value: not a guarantee

    class Method(UserMask):
        def nonnegative(self):  # a method by mistake: not a guarantee
            return True

    assert not as_operator(Weird(_dense())).nonnegative and not as_operator(Method(_dense())).nonnegative


def test_adapter_forwards_every_capability_the_object_has():
    signed = _dense() - 0.6

    class Full(UserMask):
        nonnegative = False

        def rmatmul(self, x):
            return self.dense.mT @ x

        def abs_matmul(self, x):
            return self.dense.abs() @ x

        def roundoff_bound(self, x):
            return torch.zeros(x.shape[-1], dtype=x.dtype)

    op = as_operator(Full(signed))
    x = randn((N, 2), gen(15))
    assert op.has_rmatmul and op.has_abs_matmul
    assert torch.equal(op.rmatmul(x), signed.mT @ x) and torch.equal(op.abs_matmul(x), signed.abs() @ x)
    assert torch.equal(op.roundoff_bound(x), torch.zeros(2, dtype=x.dtype))


def test_parameters_default_scan():
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    c = torch.ones(3)  # no grad: not a parameter

    d = torch.ones(3, requires_grad=True)

    class Op(MaskOperator):
        def __init__(self):
            self.n, self.a, self.c, self.items, self.inner = 3, a, c, [b, c], CausalMask(3)
            self.duck = UserMask(d[:, None] * torch.ones(3))  # a nested duck-typed operator: scanned too

        def _matmat(self, x):
            return x

    op = Op()
    assert {id(t) for t in op.parameters()} == {id(a), id(b), id(op.duck.dense)}
    user = UserMask(torch.ones(3, 3, requires_grad=True))  # duck-typed: the same default scan
    assert [id(t) for t in as_operator(user).parameters()] == [id(user.dense)]

    class ModuleMask(nn.Module):  # an nn.Module's parameters() satisfies the contract
        def __init__(self):
            super().__init__()
            self.n, self.w = 3, nn.Parameter(torch.ones(3, 3))

        def matmul(self, x):
            return self.w @ x

    mm = ModuleMask()
    assert [id(t) for t in as_operator(mm).parameters()] == [id(mm.w)]
    table = torch.ones(5, requires_grad=True)
    assert [id(t) for t in ToeplitzMask(table).parameters()] == [id(table)]


def test_module_mask_trains_through_the_generic_path():
    pq, pk, v = _inputs()

    class ModuleMask(nn.Module):
        def __init__(self, dense):
            super().__init__()
            self.n, self.w = N, nn.Parameter(dense.clone())

        def matmul(self, x):
            return self.w @ x

    mm = ModuleMask(_dense())
    masked_linear_attention(pq, pk, v, mm).sum().backward()
    w = _dense().requires_grad_()
    a = (pq @ pk.T) * w
    ((a @ v) / a.sum(-1, keepdim=True)).sum().backward()
    assert rel_frobenius(mm.w.grad, w.grad) <= 1e-12


RMATMUL_MASKS = {
    "dense-batched": lambda: DenseMask(randn((2, N, N), gen(20))),
    "sparse": lambda: SparseMask(_sparse_dense()[0]),
    "causal": lambda: CausalMask(N),
    "packing": lambda: PackingMask(torch.tensor([[0, 0, 1, 1, 1, 2, 0, 2, 2], [1] * 9])),
    "padding": lambda: PaddingMask(torch.arange(N) < 6),
    "toeplitz": lambda: ToeplitzMask(randn((2 * N - 1,), gen(21))),
    "block-toeplitz-cls": lambda: fast.BlockToeplitzMask((2, 4), randn((3, 7), gen(22)), cls_token=True),
    "lowrank": lambda: fast.LowRankMask(randn((N, 2), gen(23)), randn((2, N), gen(24))),
    "hypercube": lambda: fast.HypercubeDiffusionMask(8, 0.4),
    # a weighted forest of two trees (parents 0 0 1 -1 3 3 4 4 5): symmetric masks, rmatmul = matmul
    "tree-exp": lambda: fast.TreeExpMask(_forest(weighted=True), -0.4, 0.1),
    "tree-diam": lambda: fast.TreeDiamMask(_forest(), randn((N,), gen(26))),
    "tree-dc": lambda: fast.TreeDCMask(_forest(), randn((N,), gen(27)), dense_threshold=2),
}


def _forest(weighted: bool = False) -> fast.Forest:
    parent = [-1, 0, 0, 1, -1, 4, 4, 5, 5]
    return fast.Forest.from_parent(parent, [0.5, 1.0, 1.5, 0.7, 0.0, 1.2, 0.9, 1.1, 0.6] if weighted else None)


@pytest.mark.parametrize("kind", list(RMATMUL_MASKS))
def test_rmatmul_is_the_transpose(kind):
    """rmatmul(x) == M^T x with M read off matmul (M = matmul(I)), for every mask that offers it."""
    op = RMATMUL_MASKS[kind]()
    assert op.has_rmatmul
    n = op.n
    dense = op.matmul(torch.eye(n, dtype=torch.float64).expand(2, n, n))  # (2, N, N): batched masks need x's batch
    x = randn((2, n, 3), gen(25))
    assert rel_frobenius(op.rmatmul(x), dense.mT @ x) <= 1e-12
    assert rel_frobenius(op.matmul(x), dense @ x) <= 1e-12


# ------------------------------------------------------------------------ as_mask_operator: accepted


def test_operator_is_returned_as_is_and_a_duck_wrapped():
    op = CausalMask(N)
    assert as_mask_operator(op) is op
    user = UserMask(_dense())
    wrapped = as_mask_operator(user)
    assert isinstance(wrapped, OperatorAdapter) and wrapped.wrapped is user and wrapped.n == N


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_tensor(dtype):
    pq, pk, v = (t.to(dtype) for t in _inputs())
    dense = _dense()
    op = as_mask_operator(dense.to(dtype))
    assert isinstance(op, DenseMask) and op.n == N
    got = masked_linear_attention(pq, pk, v, dense.to(dtype))
    assert got.dtype == dtype
    assert rel_frobenius(got, _reference(pq, pk, v, np_(dense))) <= EQUIV_TOL[dtype]


def test_batched_dense_tensor_broadcasts_over_heads():
    pq, pk, v = _inputs(batch=(2, 3))
    dense = _dense(batch=(2, 1))
    got = masked_linear_attention(pq, pk, v, dense)
    assert got.shape == (2, 3, N, 2)
    assert rel_frobenius(got, _reference(pq, pk, v, np_(dense))) <= EQUIV_TOL[torch.float64]


def test_bool_tensor_and_numpy_array_are_dense_masks():
    pq, pk, v = _inputs()
    tril = torch.ones(N, N, dtype=torch.bool).tril()
    causal = masked_linear_attention(pq, pk, v, CausalMask(N))
    assert rel_frobenius(masked_linear_attention(pq, pk, v, tril), causal) <= 1e-12
    assert isinstance(as_mask_operator(tril.numpy()), DenseMask)
    assert rel_frobenius(masked_linear_attention(pq, pk, v, tril.numpy().astype(np.float64)), causal) <= 1e-12


def _sparse_dense(n=N, seed=4):
    a = sp.random(n, n, density=0.3, format="coo", random_state=seed)
    a = a + sp.eye(n)  # every row sees itself: denominators stay positive
    return a.tocsr(), torch.as_tensor(a.toarray())


@pytest.mark.parametrize("form", ["torch-coo", "torch-csr", "torch-csr-int64", "torch-csc", "scipy-csr",
                                  "scipy-coo-dup"])
def test_sparse_inputs(form):
    a, dense = _sparse_dense()
    if form == "torch-coo":
        mask = dense.to_sparse()
    elif form == "torch-csr":
        mask = dense.to_sparse_csr()
    elif form == "torch-csr-int64":
        c = dense.to_sparse_csr()
        mask = torch.sparse_csr_tensor(c.crow_indices().long(), c.col_indices().long(), c.values(), c.shape,
                                       check_invariants=True)
    elif form == "torch-csc":
        mask = dense.to_sparse_csc()
    elif form == "scipy-csr":
        mask = a
    else:  # COO with duplicate entries: they are summed
        coo = a.tocoo()
        mask = sp.coo_matrix((np.concatenate([coo.data / 2, coo.data / 2]),
                              (np.concatenate([coo.row, coo.row]), np.concatenate([coo.col, coo.col]))), shape=a.shape)
    op = as_mask_operator(mask)
    assert isinstance(op, SparseMask) and op.n == N
    x = randn((2, N, 3), gen(5))
    assert rel_frobenius(op.matmul(x), dense @ x) <= 1e-14
    pq, pk, v = _inputs(batch=(2,))
    assert rel_frobenius(masked_linear_attention(pq, pk, v, mask), _reference(pq, pk, v, np_(dense))) <= 1e-10


def test_sparse_mask_builds_int32_csr_once_and_its_transpose_for_backward():
    a, dense = _sparse_dense()
    op = SparseMask(a)
    x = randn((N, 2), gen(6)).requires_grad_()
    with torch.no_grad():
        op.matmul(x)
    assert list(op._csr) == [("cpu", torch.float64, False, False)]  # no transpose without backward
    csr = op.csr(torch.device("cpu"), torch.float64)
    assert csr.layout == torch.sparse_csr and csr.crow_indices().dtype == torch.int32
    assert torch.equal(op.csr(torch.device("cpu"), torch.float64, transpose=True).to_dense(), dense.T)
    assert torch.autograd.gradcheck(op.matmul, (x,))
    assert op.csr(torch.device("cpu"), torch.float64) is csr  # cached, not rebuilt


def test_half_precision_through_dense_and_sparse():
    pq, pk, v = (t.to(torch.bfloat16) for t in _inputs())
    a, dense = _sparse_dense()
    for mask in (dense, a):
        out = masked_linear_attention(pq, pk, v, mask)
        assert out.dtype == torch.bfloat16
        ref = masked_linear_attention(pq.double(), pk.double(), v.double(), mask)
        assert rel_frobenius(out, ref) <= 2 * torch.finfo(torch.bfloat16).eps


def test_user_operator_without_base_class():
    pq, pk, v = _inputs()
    dense = _dense()
    got = masked_linear_attention(pq, pk, v, UserMask(dense))
    assert rel_frobenius(got, _reference(pq, pk, v, np_(dense))) <= EQUIV_TOL[torch.float64]


def test_user_operator_with_its_own_attend():
    pq, pk, v = _inputs()
    dense = _dense()

    class WithAttend(UserMask):
        calls = 0

        def attend(self, phi_q, phi_k, v):
            WithAttend.calls += 1
            a = (phi_q @ phi_k.transpose(-1, -2)) * self.dense
            return a @ v, a.sum(-1)

    got = masked_linear_attention(pq, pk, v, WithAttend(dense))
    assert WithAttend.calls == 1
    assert rel_frobenius(got, _reference(pq, pk, v, np_(dense))) <= EQUIV_TOL[torch.float64]


# ------------------------------------------------------------------------ as_mask_operator: refused


class OnlyMatmul:
    def matmul(self, x):
        return x


class OnlyN:
    n = N


class NotCallable:
    n = N
    matmul = 3


class WrongShape(UserMask):
    def matmul(self, x):
        return (self.dense @ x)[..., :-1, :]


class WrongWidth(UserMask):
    def matmul(self, x):
        return (self.dense @ x)[..., :1]


class NotATensor(UserMask):
    def matmul(self, x):
        return (self.dense @ x).tolist()


class BadAttend(UserMask):
    def attend(self, phi_q, phi_k, v):
        return phi_q @ phi_k.transpose(-1, -2) @ v  # one tensor, not (num, den)


class BadN(UserMask):
    def __init__(self, dense, n):
        super().__init__(dense)
        self.n = n


BAD = {
    "string": ("causal", TypeError, r"mask must be a MaskOperator \(with n and matmul\), .* got str"),
    "list": ([[1.0]], TypeError, "mask must be a MaskOperator .* got list"),
    "object-array": (np.array([["a"]], dtype=object), TypeError, "mask as a NumPy array must hold real numbers"),
    "no-n": (OnlyMatmul(), TypeError, r"mask \(.*OnlyMatmul\) has no n \(the number of tokens N\)"),
    "no-matmul": (OnlyN(), TypeError, r"mask \(.*OnlyN\) has no callable matmul"),
    "matmul-not-callable": (NotCallable(), TypeError, "mask.matmul must be a method"),
    "n-zero": (BadN(_dense(), 0), ValueError, "mask.n must be a positive integer"),
    "n-str": (BadN(_dense(), "9"), TypeError, "mask.n must be a positive int .* got str '9'"),
    "n-none": (BadN(_dense(), None), TypeError, "mask.n must be a positive int .* got NoneType"),
    "n-float": (BadN(_dense(), 9.0), TypeError, "mask.n must be a positive int .* got float"),
    "not-square": (torch.ones(N, N + 1), ValueError, r"mask must be a square matrix .* got shape \(9, 10\)"),
    "vector": (torch.ones(N), ValueError, "mask must be a square matrix"),
    "complex": (torch.ones(N, N, dtype=torch.complex64), TypeError, "mask must hold real"),
    "nan": (torch.full((N, N), float("nan")), ValueError, "mask contains non-finite"),
    "sparse-3d": (torch.ones(2, N, N).to_sparse(), ValueError, "mask must be a 2-D sparse matrix"),
    "sparse-nan": (sp.csr_matrix(np.full((N, N), np.nan)), ValueError, "mask contains non-finite"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_masks_raise_errors_naming_mask(case):
    mask, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        as_mask_operator(mask)
    pq, pk, v = _inputs()
    with pytest.raises(exc, match=match):  # the drivers report the same
        masked_linear_attention(pq, pk, v, mask)


def test_as_mask_operator_checks_n_when_given():
    assert as_mask_operator(_dense(), n=N).n == N
    with pytest.raises(ValueError, match="mask is for N=9 tokens, expected N=8"):
        as_mask_operator(_dense(), n=8)


def test_wrong_n_for_the_inputs():
    pq, pk, v = _inputs()
    with pytest.raises(ValueError, match="mask is for N=8 tokens but phi_q, phi_k have N=9"):
        masked_linear_attention(pq, pk, v, UserMask(_dense(n=8)))


@pytest.mark.parametrize("cls, exc, match", [
    (WrongShape, ValueError,
     r"mask.matmul\(x\) must return shape \(\.\.\., N, c\) = \(\.\.\., 9, (\d)\) .* got \(8, \1\)"),
    (WrongWidth, ValueError, r"mask.matmul\(x\) must return shape .*WrongWidth"),
    (NotATensor, TypeError, r"mask.matmul\(x\) must return a torch.Tensor, got list"),
    (BadAttend, ValueError, r"mask.attend must return \(num"),
])
def test_user_operator_returning_the_wrong_thing(cls, exc, match):
    pq, pk, v = _inputs()
    with pytest.raises(exc, match=match):
        masked_linear_attention(pq, pk, v, cls(_dense()))
    with pytest.raises(exc, match=match):  # also without autograd (no parameter probe)
        with torch.no_grad():
            masked_linear_attention(pq, pk, v, cls(_dense()))


# ------------------------------------------------------------------------ the driver names no mask


def _imports(module) -> list[tuple[str, str]]:
    """(module, name) of every ``from module import name`` and ``import module`` in a module's source."""
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def test_the_driver_imports_no_concrete_mask():
    """fast/attention.py reads what a mask offers off the contract (fast.operator): it imports no
    MaskOperator subclass and, from fast.masks, only the entry point as_mask_operator."""
    import importlib

    from fast import attention

    for module, name in _imports(attention):
        if module.startswith("fast.masks"):
            assert (module, name) == ("fast.masks.explicit", "as_mask_operator"), (module, name)
        if module.startswith("fast") and name:
            value = getattr(importlib.import_module(module), name)
            assert not (isinstance(value, type) and issubclass(value, MaskOperator) and value is not MaskOperator), name


def test_the_algebra_imports_the_contract_not_the_masks():
    from fast import algebra

    modules = {module for module, _ in _imports(algebra)}
    assert "fast.operator" in modules and not any(m.startswith("fast.masks") for m in modules)
