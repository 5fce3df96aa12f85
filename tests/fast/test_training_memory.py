"""Training memory of masked_linear_attention stays O(N (m + d)) (fast/algebra.py, issue 8 item 4),
and the gradients of the memory-saving paths are right.

Saved-tensor bytes are counted with torch.autograd.graph.saved_tensors_hooks around the forward
pass: every tensor that autograd saves for backward passes the pack hook. Each distinct STORAGE is
counted once, at its full size (storage.nbytes()): views of one storage (slices of phi_k, a
transposed v, the inputs themselves) are one storage; a saved slice counts the whole tensor it
views. The hook keeps a reference to every saved tensor, so no storage is freed and reused
(which could hide one) during the count. The inputs phi_q, phi_k, v (saved by every path) count.

Bound: 2 N (m + d) * 4 bytes + C_PER_TOKEN * N for float32. The paths save phi_q, phi_k (N m
each), v (N d), the numerator (N d, kept by the division) and O(N) extras: the denominator (4 B
per token) and, for padding, the key weights (4 B per token). C_PER_TOKEN = 16 leaves one more
float32 per token of slack; the old code saved every block of the numerator (>= 6 N m d bytes at
these sizes), 7.9x (low-rank) to 42x (Toeplitz) this bound.
"""
from __future__ import annotations

import math

import pytest
import scipy.sparse as sp
import torch
from torch.autograd import gradcheck, gradgradcheck

from fast import (BlockToeplitzMask, CausalMask, DenseMask, HypercubeDiffusionMask, LowRankMask, PackingMask,
                  PaddingMask, SparseMask, ToeplitzMask, masked_linear_attention)
from fast.algebra import blocked_numerator, divide, masked_products
from tests.helpers import gen, positive, randn, rel_frobenius, saved_bytes

N_MEM, M_MEM, D_MEM = 4096, 64, 16
C_PER_TOKEN = 16


def _mem_inputs(batch=()):
    g = gen(0)
    pq = positive((*batch, N_MEM, M_MEM), g, torch.float32).requires_grad_()
    pk = positive((*batch, N_MEM, M_MEM), g, torch.float32).requires_grad_()
    v = randn((*batch, N_MEM, D_MEM), g, torch.float32).requires_grad_()
    return pq, pk, v


def _bound(n=N_MEM, m=M_MEM, d=D_MEM) -> int:
    return 2 * n * (m + d) * 4 + C_PER_TOKEN * n


def _learnable_log_coefficients(n):
    return (-torch.arange(-(n - 1), n, dtype=torch.float32).abs() / 50.0).requires_grad_()


MEMORY_MASKS = {
    # generic path (no attend): a low-rank mask and a learnable dense mask given as a tensor
    "lowrank-generic": lambda: LowRankMask(torch.rand(N_MEM, 8, generator=gen(1)),
                                           torch.rand(8, N_MEM, generator=gen(2))),
    "packing-generic": lambda: PackingMask(torch.arange(N_MEM) // 100),
    # Toeplitz attend with a learnable table (exp of learnable logits: a non-leaf parameter)
    "toeplitz-learnable": lambda: ToeplitzMask.from_log_coefficients(_learnable_log_coefficients(N_MEM)),
    "block-toeplitz-learnable": lambda: BlockToeplitzMask.from_log_table(
        (64, 64), (-torch.rand(127, 127, generator=gen(3))).requires_grad_()),
    # the specialised attends
    "causal": lambda: CausalMask(N_MEM),
    "padding": lambda: PaddingMask(torch.arange(N_MEM) < N_MEM - 100),
}


@pytest.mark.parametrize("kind", list(MEMORY_MASKS))
def test_saved_tensor_bytes_are_linear(kind):
    """N = 4096, m = 64, d = 16, float32: saved bytes below 2 N (m + d) * 4 + 16 N (see module doc)."""
    pq, pk, v = _mem_inputs()
    mask = MEMORY_MASKS[kind]()
    got, out = saved_bytes(lambda: masked_linear_attention(pq, pk, v, mask))
    assert got <= _bound(), (got, _bound())
    # the count is not vacuous: the inputs themselves are saved (3 of the 5 N-sized tensors)
    assert got >= (2 * M_MEM + D_MEM) * N_MEM * 4
    assert out.requires_grad  # (backward from what was saved: test_gradients_match_the_dense_twin)


def test_saved_tensor_bytes_power_plain_autograd_exceeds_the_bound():
    """Power check: the same products through plain autograd (the old path: every block's columns
    and mixed columns kept) are far above the bound, so the measurement can fail."""
    pq, pk, v = _mem_inputs()
    mask = MEMORY_MASKS["lowrank-generic"]()

    def plain():
        den = (pq * mask.matmul(pk)).sum(-1)
        return divide(blocked_numerator(pq, pk, v, mask.matmul, 4), den)

    got, _ = saved_bytes(plain)
    assert got > 5 * _bound()


def test_saved_tensor_bytes_with_batch_and_heads():
    """Leading dims: the bound scales with B H (here B = 2, H = 2 at N = 1024)."""
    g = gen(4)
    n = 1024
    pq = positive((2, 2, n, M_MEM), g, torch.float32).requires_grad_()
    pk = positive((2, 2, n, M_MEM), g, torch.float32).requires_grad_()
    v = randn((2, 2, n, D_MEM), g, torch.float32).requires_grad_()
    mask = ToeplitzMask.from_log_coefficients(_learnable_log_coefficients(n))
    got, _ = saved_bytes(lambda: masked_linear_attention(pq, pk, v, mask))
    assert got <= 4 * _bound(n)


# ------------------------------------------------------------ gradients against the dense twin

N_GRAD, M_GRAD, D_GRAD = 2048, 3, 2


def dense_twin(pq, pk, v, dense):
    """out_i = sum_j M_ij (q_i . k_j) v_j / sum_j M_ij (q_i . k_j), all N x N, float64."""
    a = (pq @ pk.transpose(-1, -2)) * dense
    return (a @ v) / a.sum(-1, keepdim=True)


def _toeplitz_dense(coeffs, n):
    idx = torch.arange(n)[:, None] - torch.arange(n)[None, :] + (n - 1)
    return coeffs[idx]


def _grid_toeplitz_dense(table, shape):
    n1, n2 = shape
    node = torch.arange(n1 * n2)
    x1, x2 = node // n2, node % n2
    return table[x1[:, None] - x1[None, :] + n1 - 1, x2[:, None] - x2[None, :] + n2 - 1]


def _hypercube_dense(lam, n):
    x = torch.arange(n)[:, None] ^ torch.arange(n)[None, :]
    dist = sum((x >> b) & 1 for b in range(n.bit_length() - 1))
    return torch.tanh(lam) ** dist.to(torch.float64)


def _case(kind, g):
    """(mask from params, dense M from params, [learnable params], batch shape)."""
    n = N_GRAD
    if kind == "generic-dense":
        p = [positive((n, n), g)]
        return lambda p: DenseMask(p[0]), lambda p: p[0], p, ()
    if kind == "generic-lowrank":
        p = [positive((n, 4), g), positive((4, n), g)]
        return lambda p: LowRankMask(p[0], p[1]), lambda p: p[0] @ p[1], p, ()
    if kind == "generic-lowrank-symmetric":  # right = left^T: dependent parameters, counted once
        p = [positive((n, 4), g)]
        return lambda p: LowRankMask(p[0], p[0].transpose(-1, -2)), lambda p: p[0] @ p[0].T, p, ()
    if kind == "generic-sparse":
        a = sp.random(n, n, density=0.01, format="csr", random_state=7) + sp.eye(n)
        dense = torch.as_tensor(a.toarray())
        return lambda p: SparseMask(a), lambda p: dense, [], ()
    if kind == "toeplitz-fixed":  # no parameter: the M / M^T backward (reversed table)
        coeffs = positive((2 * n - 1,), g)
        return lambda p: ToeplitzMask(coeffs), lambda p: _toeplitz_dense(coeffs, n), [], ()
    if kind == "block-toeplitz-fixed":
        shape, table = (32, 64), positive((63, 127), g)
        return lambda p: BlockToeplitzMask(shape, table), lambda p: _grid_toeplitz_dense(table, shape), [], (2,)
    if kind == "generic-lowrank-fixed":
        left, right = positive((n, 4), g), positive((4, n), g)
        return lambda p: LowRankMask(left, right), lambda p: left @ right, [], (2,)
    if kind == "toeplitz-table":
        p = [positive((2 * n - 1,), g)]
        return lambda p: ToeplitzMask(p[0]), lambda p: _toeplitz_dense(p[0], n), p, ()
    if kind == "toeplitz-log-table":  # the table exp(b) is a non-leaf; the gradient reaches b
        p = [randn((2 * n - 1,), g, scale=0.5)]
        return (lambda p: ToeplitzMask.from_log_coefficients(p[0]),
                lambda p: _toeplitz_dense(torch.exp(p[0]), n), p, ())
    if kind == "block-toeplitz-log-table":
        shape = (32, 64)
        p = [randn((63, 127), g, scale=0.5)]
        return (lambda p: BlockToeplitzMask.from_log_table(shape, p[0]),
                lambda p: _grid_toeplitz_dense(torch.exp(p[0]), shape), p, ())
    if kind == "causal":
        return lambda p: CausalMask(n), lambda p: torch.ones(n, n, dtype=torch.float64).tril(), [], (2,)
    if kind == "causal-ragged":  # chunk does not divide N
        return lambda p: CausalMask(n, chunk=37), lambda p: torch.ones(n, n, dtype=torch.float64).tril(), [], ()
    if kind == "packing":
        ids = torch.randint(0, 5, (2, n), generator=g)
        dense = (ids[..., :, None] == ids[..., None, :]).double()
        return lambda p: PackingMask(ids), lambda p: dense, [], (2,)
    if kind == "padding":
        km = torch.rand(2, n, generator=g) < 0.7
        km[..., 0] = True
        dense = km[:, None, :].double().expand(2, n, n)
        return lambda p: PaddingMask(km), lambda p: dense, [], (2,)
    if kind == "hypercube":
        p = [torch.tensor(0.7, dtype=torch.float64)]
        return lambda p: HypercubeDiffusionMask(n, p[0]), lambda p: _hypercube_dense(p[0], n), p, ()
    raise ValueError(kind)


GRAD_KINDS = ["generic-dense", "generic-lowrank", "generic-lowrank-symmetric", "generic-lowrank-fixed", "generic-sparse",
              "toeplitz-fixed", "block-toeplitz-fixed", "toeplitz-table", "toeplitz-log-table",
              "block-toeplitz-log-table", "causal", "causal-ragged", "packing", "padding", "hypercube"]


@pytest.mark.parametrize("kind", GRAD_KINDS)
def test_gradients_match_the_dense_twin(kind):
    """N = 2048, float64: d loss / d (phi_q, phi_k, v, mask parameters) for loss = sum(out * W).

    Both sides are float64 computations of the same function that differ in summation order
    (and FFT round-off: u log2(n_fft) |table| |x|, Higham Sec. 24.1); with positive features and
    a positive mask there is no cancellation, so relative errors are ~1e-15 x a few hundred at
    most; 1e-10 (tests.helpers.EQUIV_TOL) leaves that margin and fails on any wrong term
    (a missing block or chunk moves a gradient by O(1/N_blocks) >= 1e-3).
    """
    g = gen(11)
    make, dense_of, params, batch = _case(kind, g)
    pq, pk = positive((*batch, N_GRAD, M_GRAD), g), positive((*batch, N_GRAD, M_GRAD), g)
    v, w = randn((*batch, N_GRAD, D_GRAD), g), randn((*batch, N_GRAD, D_GRAD), g)

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (pq, pk, v, *params)]
        (fn(leaves) * w).sum().backward()
        return [t.grad for t in leaves]

    # block_cols=2 < m d: several blocks in the generic path
    got = grads(lambda t: masked_linear_attention(t[0], t[1], t[2], make(t[3:]), block_cols=2))
    want = grads(lambda t: dense_twin(t[0], t[1], t[2], dense_of(t[3:])))
    for name, a, b in zip(["phi_q", "phi_k", "v"] + [f"param{i}" for i in range(len(params))], got, want):
        assert a is not None, name
        assert rel_frobenius(a, b) <= 1e-10, (name, rel_frobenius(a, b))


def test_gradient_twin_detects_a_dropped_block():
    """Power check: leaving out one feature block's gradient moves phi_k's gradient far beyond 1e-10."""
    g = gen(12)
    n = 256
    pq, pk, v, w = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g), randn((n, 2), g)
    leaves = [t.clone().requires_grad_() for t in (pq, pk, v)]
    mask = CausalMask(n)
    tril = DenseMask(torch.ones(n, n, dtype=torch.float64).tril())
    (masked_linear_attention(*leaves, tril, block_cols=2) * w).sum().backward()
    good = leaves[1].grad.clone()
    broken = good.clone()
    broken[:, 1] = 0.0
    twin = [t.clone().requires_grad_() for t in (pq, pk, v)]
    (masked_linear_attention(*twin, mask) * w).sum().backward()
    assert rel_frobenius(good, twin[1].grad) <= 1e-10
    assert rel_frobenius(broken, twin[1].grad) > 1e-3


# ------------------------------------------------------------ the Function itself, small N


class Recording(DenseMask):
    """A DenseMask that records (product, columns, grad mode) of every M @ x and M^T @ x."""

    def __init__(self, matrix):
        super().__init__(matrix)
        self.calls = []

    def matmul(self, x):
        self.calls.append(("M", x.shape[-1], torch.is_grad_enabled()))
        return super().matmul(x)

    def rmatmul(self, x):
        self.calls.append(("MT", x.shape[-1], torch.is_grad_enabled()))
        return super().rmatmul(x)


@pytest.mark.parametrize("learnable", [False, True])
def test_backward_recomputes_one_block_at_a_time(learnable):
    """Forward: M phi_k (m columns) and ceil(m / f) blocks of f d columns. Backward recomputes
    block by block, never the whole numerator at once: with rmatmul and no learnable parameter,
    M and M^T per block without autograd; with a learnable mask, each block's M @ x again under
    autograd (its graph differentiated before the next block is built)."""
    g = gen(13)
    n, m, d = 40, 5, 3
    pq, pk, v = (positive((n, m), g).requires_grad_(), positive((n, m), g).requires_grad_(),
                 randn((n, d), g).requires_grad_())
    mask = Recording(positive((n, n), g).requires_grad_(learnable))
    out = masked_linear_attention(pq, pk, v, mask, block_cols=2 * d)  # 2 features per block
    probes = [("M", 1, True)] * (2 if learnable else 1)  # the parameter probe(s): one column each
    assert mask.calls == probes + [("M", c, False) for c in (m, 2 * d, 2 * d, d)]
    mask.calls.clear()
    out.sum().backward()
    if learnable:
        assert mask.calls == [("M", c, True) for c in (m, 2 * d, 2 * d, d)]
        assert mask.matrix.grad is not None
    else:
        assert mask.calls == [("M", m, False), ("MT", m, False)] + [
            (kind, c, False) for c in (2 * d, 2 * d, d) for kind in ("M", "MT")]


@pytest.mark.parametrize("which", ["dense", "toeplitz", "toeplitz-log"])
def test_gradcheck_masked_products(which):
    """The Function's gradients w.r.t. phi_q, phi_k, v and the mask's parameter (float64, N = 6)."""
    g = gen(14)
    n = 6
    pq, pk, v = (positive((2, n, 3), g).requires_grad_(), positive((2, n, 3), g).requires_grad_(),
                 randn((2, n, 2), g).requires_grad_())
    if which == "dense":
        p = positive((n, n), g).requires_grad_()
        make = DenseMask
    elif which == "toeplitz":
        p = positive((2 * n - 1,), g).requires_grad_()
        make = ToeplitzMask
    else:
        p = randn((2 * n - 1,), g, scale=0.5).requires_grad_()
        make = ToeplitzMask.from_log_coefficients
    assert gradcheck(lambda a, b, c, t: masked_products(a, b, c, make(t), 1), (pq, pk, v, p))


def test_gradgradcheck_generic_path_and_padding():
    """Double backward works through the recomputing Function (create_graph) and padding's Function."""
    g = gen(15)
    n = 5
    pq, pk, v = (positive((n, 2), g).requires_grad_(), positive((n, 2), g).requires_grad_(),
                 randn((n, 2), g).requires_grad_())
    dense = DenseMask(positive((n, n), g))
    assert gradgradcheck(lambda a, b, c: masked_linear_attention(a, b, c, dense, block_cols=2), (pq, pk, v))
    pad = PaddingMask(torch.arange(n) < n - 1)
    assert gradgradcheck(lambda a, b, c: masked_linear_attention(a, b, c, pad), (pq, pk, v))


# ------------------------------------------------------------ parameters(): declared, hidden, changed


class Wrapped:
    """A user operator that reads another operator's learnable table through a bound method."""

    def __init__(self, inner, declare: bool):
        self.n, self._matmul, self._inner, self._declare = inner.n, inner.matmul, inner, declare

    def matmul(self, x):
        return self._matmul(x)

    def parameters(self):
        return list(self._inner.parameters()) if self._declare else []


def test_a_hidden_parameter_is_an_error_not_a_lost_gradient():
    g = gen(16)
    n = 7
    b = randn((2 * n - 1,), g, scale=0.5).requires_grad_()
    pq, pk, v = positive((n, 2), g), positive((n, 2), g), randn((n, 2), g)
    with pytest.raises(ValueError, match=r"mask.parameters\(\) does not return .*Wrapped"):
        masked_linear_attention(pq, pk, v, Wrapped(ToeplitzMask.from_log_coefficients(b), declare=False))
    # declared: the gradient reaches b, equal to the one through the Toeplitz attend
    masked_linear_attention(pq, pk, v, Wrapped(ToeplitzMask.from_log_coefficients(b), declare=True)).sum().backward()
    via_wrapper = b.grad.clone()
    b.grad = None
    masked_linear_attention(pq, pk, v, ToeplitzMask.from_log_coefficients(b)).sum().backward()
    assert rel_frobenius(via_wrapper, b.grad) <= 1e-12
    # without grad mode there is nothing to lose: no error
    with torch.no_grad():
        masked_linear_attention(pq, pk, v, Wrapped(ToeplitzMask.from_log_coefficients(b), declare=False))


def test_declaring_the_leaf_behind_what_matmul_reads():
    """parameters() may list the logits b while matmul reads exp(b): backward then goes through the
    (older) exp node once per block, which must stay alive between blocks; the gradient still
    equals the one through the declared table."""
    g = gen(19)
    n = 7
    b = randn((2 * n - 1,), g, scale=0.5).requires_grad_()
    pq, pk, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)

    class LeafDeclared(Wrapped):
        def parameters(self):
            return [b]

    inner = ToeplitzMask.from_log_coefficients(b)
    masked_linear_attention(pq, pk, v, LeafDeclared(inner, declare=True), block_cols=1).sum().backward()
    via_leaf = b.grad.clone()
    b.grad = None
    masked_linear_attention(pq, pk, v, ToeplitzMask.from_log_coefficients(b)).sum().backward()
    assert rel_frobenius(via_leaf, b.grad) <= 1e-12


def test_parameter_changed_in_place_before_backward_is_refused():
    g = gen(17)
    n = 6
    table = positive((2 * n - 1,), g).requires_grad_()
    pq, pk, v = positive((n, 2), g), positive((n, 2), g), randn((n, 2), g)
    mask = ToeplitzMask(table)
    out = masked_linear_attention(pq, pk, v, mask)
    with torch.no_grad():
        table.mul_(2.0)  # an optimiser step before backward
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()


def test_no_grad_forward_keeps_nothing_and_equals_grad_forward():
    g = gen(18)
    n = 50
    pq, pk, v = positive((n, 4), g), positive((n, 4), g), randn((n, 3), g)
    mask = ToeplitzMask.from_log_coefficients(randn((2 * n - 1,), g, scale=0.3).requires_grad_())
    with torch.no_grad():
        cold = masked_linear_attention(pq, pk, v, mask)
    got, warm = saved_bytes(lambda: masked_linear_attention(pq.requires_grad_(), pk, v, mask))
    assert torch.equal(cold, warm.detach())
    assert got > 0 and math.isfinite(got)
