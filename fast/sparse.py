"""CSR plumbing of fast/, written once: the builder (row_pointers, check_csr, index_dtype,
csr_matrix), transposes and block-diagonal patterns (csr_transpose, block_diagonal_index) and the
product with its backward (csr_matmul, CSRProduct). Every sparse mask (SparseMask, DiffusionMask,
PowerSeriesMask, RWGNK, GRF) and fast.graphs use it. Work O(nnz c) per product with x (n, c).

Indices are int32 while every size is below 2^31: torch's CSR x dense kernels are much faster
with them than COO (docs/methods.md). The backward is written by hand because autograd's own
backward of ``a @ x`` would transpose a sparse ``a`` at every call; the masks build A^T once.
``csr_matrix`` skips torch's O(nnz) invariant check by default (every caller builds sorted,
in-range indices); ``check_invariants=None`` defers to torch's global switch
(``torch.sparse.check_sparse_tensor_invariants``), which Graph.csr and RWGNK's Psi keep.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["CSRProduct", "block_diagonal_index", "check_csr", "csr_matmul", "csr_matrix", "csr_transpose",
           "index_dtype", "row_pointers"]


def index_dtype(*sizes: int) -> torch.dtype:
    """torch.int32 when every size (nnz, n, ...) is below 2^31, else torch.int64: the index dtype of a
    CSR matrix (int32 makes torch's CSR x dense kernels fastest). O(1).

        >>> import torch
        >>> from fast.sparse import index_dtype
        >>> index_dtype(10, 2**20), index_dtype(2**31)
        (torch.int32, torch.int64)
    """
    return torch.int32 if max(sizes, default=0) < 2**31 else torch.int64


def row_pointers(rows: torch.Tensor, n: int) -> torch.Tensor:
    """crow (n + 1,) int64 of entries whose rows (P,) (integer, in [0, n); sorted for a CSR matrix, though
    the counts do not need it) are given: crow[i] = the number of entries in rows < i (exact integer
    prefix sums of the counts). O(P + n).

        >>> import torch
        >>> from fast.sparse import row_pointers
        >>> row_pointers(torch.tensor([0, 0, 2]), 3).tolist()
        [0, 2, 2, 3]
    """
    counts = torch.bincount(rows, minlength=n)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=crow[1:])
    return crow


def check_csr(crow: torch.Tensor, col: torch.Tensor, n_cols: int, name: str = "matrix") -> torch.Tensor:
    """Check a CSR pattern and return its rows (P,) int64: crow (R + 1,) starts at 0, is nondecreasing
    and ends at P = col.numel(); col (P,) holds column indices in [0, n_cols), sorted without
    duplicates within each row. The one structural check of fast/ (fast.graphs.Graph(check=True)).
    ValueError naming ``name`` and the broken invariant; a few host reads. O(P + R).

        >>> import torch
        >>> from fast.sparse import check_csr
        >>> check_csr(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1]), 2).tolist()
        [0, 0, 1]
        >>> check_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), 2)
        Traceback (most recent call last):
        ...
        ValueError: matrix: col must be sorted without duplicates within each row
    """
    if crow.dim() != 1 or crow.numel() < 1 or col.dim() != 1:
        raise ValueError(f"{name}: crow must be 1-D (R + 1,) and col 1-D (P,), got {tuple(crow.shape)}, "
                         f"{tuple(col.shape)}")
    if int(crow[0]) != 0 or int(crow[-1]) != col.numel() or bool((crow[1:] < crow[:-1]).any()):
        raise ValueError(f"{name}: crow must start at 0, be non-decreasing and end at E = {col.numel()} (the stored "
                         f"entries)")
    if col.numel() and (int(col.min()) < 0 or int(col.max()) >= n_cols):
        raise ValueError(f"{name}: col must hold column indices in [0, {n_cols}), got values in "
                         f"[{int(col.min())}, {int(col.max())}]")
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow[1:] - crow[:-1])
    keys = rows * n_cols + col.long()
    if keys.numel() > 1 and not bool((keys[1:] > keys[:-1]).all()):
        raise ValueError(f"{name}: col must be sorted without duplicates within each row")
    return rows


def csr_matrix(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: int | tuple[int, int], *,
               check_invariants: bool | None = False) -> torch.Tensor:
    """The torch sparse CSR tensor with row pointers crow (R + 1,), columns col (P,) and values (P,):
    size n gives (n, n), a pair (R, C). O(1) (O(nnz) with ``check_invariants=True``).

    check_invariants: False (default) trusts the indices (the callers build them sorted and in
    range); True checks them (RuntimeError from torch if not); None follows torch's global switch
    (module doc). torch's "sparse CSR support is in beta" warning is silenced: the CSR x dense
    kernels used are stable.

        >>> import torch
        >>> from fast.sparse import csr_matrix
        >>> a = csr_matrix(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([2.0, 3.0]), 2)
        >>> a.to_dense().tolist()
        [[0.0, 2.0], [3.0, 0.0]]
    """
    shape = (size, size) if isinstance(size, int) else tuple(size)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the CSR x dense kernel is stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=check_invariants)


def csr_transpose(crow: torch.Tensor, col: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor]:
    """(crow_t (n_cols + 1,), col_t (P,), perm (P,) int64): the CSR pattern of A^T for A's pattern
    (crow (R + 1,), col (P,), each row's columns distinct), with A^T's values = A's values[perm].
    Entries of A^T are in (column of A, row of A) order; crow_t and col_t keep crow's and col's dtypes.
    O(P log P).

        >>> import torch
        >>> from fast.sparse import csr_transpose
        >>> crow_t, col_t, perm = csr_transpose(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 0]), 2)
        >>> crow_t.tolist(), col_t.tolist(), perm.tolist()
        ([0, 2, 3], [0, 1, 0], [0, 2, 1])
    """
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow[1:].long() - crow[:-1].long())
    perm = torch.sort(col.long(), stable=True)[1]  # rows are sorted: a stable sort by column orders (column, row)
    crow_t = row_pointers(col.long(), n_cols).to(crow.dtype)
    return crow_t, rows[perm].to(col.dtype), perm


def block_diagonal_index(crow: torch.Tensor, col: torch.Tensor, n: int,
                         slices: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(crow (S n + 1,), col (S P,)) of the block-diagonal (S n, S n) CSR matrix whose S diagonal
    blocks share the pattern (crow (n + 1,), col (P,)) of one (n, n) CSR matrix: block s holds
    rows and columns s n .. s n + n - 1, its entries at positions s P .. s P + P - 1. One SpMM with
    it applies S differently valued copies of the matrix to x (S n, c), a (batch, head) slice per
    block (the per-slice stabilised products). int32 when S max(n, P) < 2^31, else int64. O(S (n + P)).

        >>> import torch
        >>> from fast.sparse import block_diagonal_index
        >>> crow, col = block_diagonal_index(torch.tensor([0, 1, 1]), torch.tensor([1]), 2, 2)
        >>> crow.tolist(), col.tolist()
        ([0, 1, 1, 2, 2], [1, 3])
    """
    nnz = int(col.numel())
    ix = index_dtype(slices * max(n, nnz, 1))
    s = torch.arange(slices, device=crow.device, dtype=torch.int64)[:, None]
    big_crow = torch.cat([(crow[:-1].long()[None, :] + nnz * s).reshape(-1),
                          torch.full((1,), slices * nnz, dtype=torch.int64, device=crow.device)])
    big_col = (col.long()[None, :] + n * s).reshape(-1)
    return big_crow.to(ix), big_col.to(ix)


class CSRProduct(torch.autograd.Function):
    """y = A x for a CSR A (R, C) and a dense x (C, c) -> (R, c); backward: A^T g by the prebuilt
    transpose a_t (C, R), itself a CSRProduct (so double backward works). A and A^T are constants
    (no gradient for their values), referenced rather than saved. O(nnz c) each way.

    ``CSRProduct.apply(x, a, a_t)``; ``csr_matmul`` calls it only when x needs a gradient.

        >>> import torch
        >>> from fast.sparse import CSRProduct, csr_matrix
        >>> a = csr_matrix(torch.tensor([0, 1, 1]), torch.tensor([0]), torch.tensor([2.0]), 2)
        >>> x = torch.ones(2, 1, requires_grad=True)
        >>> CSRProduct.apply(x, a, a).sum().backward(); x.grad.tolist()
        [[2.0], [0.0]]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, a: torch.Tensor, a_t: torch.Tensor) -> torch.Tensor:
        ctx.a, ctx.a_t = a, a_t  # constants of the mask, referenced rather than saved
        return a @ x

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return CSRProduct.apply(g, ctx.a_t, ctx.a), None, None


def csr_matmul(a: torch.Tensor, x: torch.Tensor, a_t: torch.Tensor) -> torch.Tensor:
    """a @ x for a CSR a (R, C) and x (C, c) -> (R, c), differentiable in x with backward a_t @ g
    (``CSRProduct``; a_t the CSR of a^T, built once by the caller). Without a gradient to track (grad
    mode off, or x not requiring grad) the plain product: the same bits. O(nnz c).

        >>> import torch
        >>> from fast.sparse import csr_matmul, csr_matrix
        >>> a = csr_matrix(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([2.0, 3.0]), 2)
        >>> csr_matmul(a, torch.tensor([[1.0], [10.0]]), a).tolist()
        [[20.0], [3.0]]
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return CSRProduct.apply(x, a, a_t)
    return a @ x
