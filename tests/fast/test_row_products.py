"""fast.algebra.rows_dot and weighted_rows: the matrix-vector products of linear attention
(den_i = phi_q_i . z, and sum_i g_i phi_q_i in its backward) as GEMMs with one output ROW.

torch's einsum ran 3-D operands as GEMMs with one output column, 4-19x slower on the CPU
(docs/methods.md, "Matrix-vector products"). Values are checked against the float64 sums written
out; the orientation is checked on the dispatched aten calls, so a return to the column form fails
here rather than only in a benchmark.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fast.algebra import rows_dot, weighted_rows
from tests.helpers import gen

SHAPES = [(), (3,), (2, 3), (1, 2, 5)]  # leading dims: 2-D to 5-D operands


class _Gemms(TorchDispatchMode):
    """Records every mm / bmm call: its output's (rows, cols) and its operands' strides."""

    def __init__(self):
        super().__init__()
        self.outputs, self.strides = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
            self.outputs.append(tuple(out.shape[-2:]))
            self.strides += [a.stride() for a in args if isinstance(a, torch.Tensor)]
        return out


#: for x (..., 7, 4): (helper, its sum written out, the vector's width, the result's width)
HELPERS = {
    "rows_dot": (rows_dot, lambda x, z: (x * z.unsqueeze(-2)).sum(-1), 4, 7),
    "weighted_rows": (weighted_rows, lambda x, g: (x * g.unsqueeze(-1)).sum(-2), 7, 4),
}


@pytest.mark.parametrize("name", HELPERS)
@pytest.mark.parametrize("lead", SHAPES)
def test_each_helper_is_its_sum_written_out(lead, name):
    helper, written_out, vector, result = HELPERS[name]
    g = gen(0)
    x, z = torch.randn(*lead, 7, 4, generator=g), torch.randn(*lead, vector, generator=g)
    want = written_out(x.double(), z.double())
    got = helper(x, z)
    assert got.shape == (*lead, result) and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_leading_dims_broadcast_as_einsums_did():
    g = gen(2)
    x, z, w = torch.randn(3, 7, 4, generator=g), torch.randn(4, generator=g), torch.randn(1, 7, generator=g)
    torch.testing.assert_close(rows_dot(x, z), torch.einsum("...nm,...m->...n", x, z))
    torch.testing.assert_close(weighted_rows(x, w), torch.einsum("...nm,...n->...m", x, w))


def test_empty_operands():
    assert rows_dot(torch.zeros(2, 0, 4), torch.zeros(2, 4)).shape == (2, 0)
    assert torch.equal(weighted_rows(torch.zeros(2, 0, 4), torch.zeros(2, 0)), torch.zeros(2, 4))


def test_gradients_flow():
    g = gen(3)
    x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rows_dot, (x, z))
    assert torch.autograd.gradcheck(weighted_rows, (x, w))


@pytest.mark.parametrize("lead", SHAPES)
def test_every_gemm_has_one_output_row_not_one_column(lead):
    """The 3-D case is the one einsum took as (..., N, 1) outputs: each product here is (1, N) or (1, m)."""
    x = torch.rand(*lead, 64, 8)
    with _Gemms() as seen:
        rows_dot(x, torch.rand(*lead, 8))
        weighted_rows(x, torch.rand(*lead, 64))
    assert seen.outputs, "no GEMM dispatched"
    assert all(rows == 1 for rows, _ in seen.outputs), seen.outputs


def test_an_expanded_vector_reaches_the_gemm_with_real_strides():
    """autograd hands the gradient of den.sum() over as an expanded 1 (stride 0); the CPU GEMM took
    30x longer on such an operand, so the helpers make the vector contiguous first (same values)."""
    x = torch.rand(2, 3, 32, 16)
    ones_n, ones_m = torch.ones(()).expand(2, 3, 32), torch.ones(()).expand(2, 3, 16)
    with _Gemms() as seen:
        got_w, got_d = weighted_rows(x, ones_n), rows_dot(x, ones_m)
    assert seen.strides and all(0 not in s for s in seen.strides), seen.strides
    torch.testing.assert_close(got_w, x.sum(-2))
    torch.testing.assert_close(got_d, x.sum(-1))
