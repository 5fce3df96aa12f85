"""Masks given as explicit matrices, and ``as_mask_operator``, the one entry point of the drivers.

DenseMask: an (N, N) or batched (..., N, N) matrix, M @ x by one (batched) GEMM: O(N^2 c). For
users with a small mask and for tests (a dense twin of any operator); it builds nothing new but
is quadratic by nature.
SparseMask: a sparse (N, N) matrix, M @ x as CSR x dense with int32 indices (faster than COO or
index_add_ gathers, docs/methods.md), O(nnz c); the CSR is built once per device and dtype, its
transpose once when a backward first needs it.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from fast.operator import MaskOperator, as_operator
from fast.sparse import csr_matmul, csr_matrix, csr_transpose, index_dtype
from fast.validation import compute_dtype

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _check_square(name: str, shape: tuple[int, ...], what: str) -> int:
    if len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] == 0:
        raise ValueError(f"{name} must be a square {what} with N >= 1, got shape {tuple(shape)}")
    return int(shape[-1])


def _check_values_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype.is_complex:
        raise TypeError(f"{name} must hold real (floating, integer or bool) values, got {dtype}")


class DenseMask(MaskOperator):
    """M given whole: matrix (N, N) or (..., N, N) (floating, integer or bool; leading dims
    broadcast with x's). ``matmul`` computes in x's compute dtype (half in float32).

    A floating matrix may require grad (a learnable dense mask): parameters() returns it. Through
    masked_linear_attention's generic path this costs O(N^2 m d): a reference and a convenience,
    not a fast mechanism. ``name`` (default "matrix") is the argument errors name: TypeError for
    a sparse or complex matrix, ValueError for a non-square one or NaN / inf entries.

    >>> import torch
    >>> from fast import DenseMask
    >>> op = DenseMask(torch.tensor([[1., 0., 2.], [0., 3., 0.], [4., 0., 5.]]))
    >>> op.matmul(torch.arange(6.).reshape(3, 2)).tolist(), op.nonnegative, op.has_rmatmul
    ([[8.0, 11.0], [6.0, 9.0], [20.0, 29.0]], True, True)
    """

    def __init__(self, matrix: torch.Tensor, *, name: str = "matrix"):
        if not isinstance(matrix, torch.Tensor) or matrix.layout != torch.strided:
            raise TypeError(f"{name} must be a dense torch.Tensor (..., N, N), got {type(matrix).__name__}")
        _check_values_dtype(name, matrix.dtype)
        self.n = _check_square(name, tuple(matrix.shape), "matrix (..., N, N)")
        if matrix.is_floating_point() and not bool(torch.isfinite(matrix.detach()).all()):
            raise ValueError(f"{name} contains non-finite values (NaN or inf)")
        self.matrix = matrix
        self._cast: dict = {}

    def _as(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if self.matrix.requires_grad:  # keep the graph: no cache
            return self.matrix.to(device=device, dtype=dtype)
        key = (str(device), dtype, self.matrix._version)
        if key not in self._cast:  # a bool matrix is cast once per device and dtype, not per call
            self._cast = {k: v for k, v in self._cast.items() if k[2] == key[2]}
            self._cast[key] = self.matrix.to(device=device, dtype=dtype)
        return self._cast[key]

    @property
    def nonnegative(self) -> bool:
        """True when every entry is >= 0 (fast.operator), read from the matrix at each call
        (O(N^2), as the product; a learnable matrix changes between steps); bool matrices are."""
        if self.matrix.dtype == torch.bool:
            return True
        return bool(self.matrix.detach().amin() >= 0)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., N, c) -> (..., N, c), O(N^2 c)."""
        work = compute_dtype(x.dtype)
        return (self._as(x.device, work) @ x.to(work)).to(x.dtype)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """|M| @ x for x (..., N, c) -> (..., N, c) (the guard's entrywise bound of a signed matrix), no gradient."""
        work = compute_dtype(x.dtype)
        with torch.no_grad():
            return (self._as(x.device, work).detach().abs() @ x.detach().to(work)).to(x.dtype)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x for x (..., N, c) -> (..., N, c), O(N^2 c)."""
        work = compute_dtype(x.dtype)
        return (self._as(x.device, work).mT @ x.to(work)).to(x.dtype)


class SparseMask(MaskOperator):
    """M sparse (N, N): a torch sparse tensor (COO, CSR, CSC, ...) or a scipy.sparse matrix.

    Values are constants (no gradient w.r.t. them; x gets one). ``matmul`` takes x (..., N, c) in
    any floating dtype (half computes in float32) and multiplies all leading dims and columns in one
    CSR x dense product, O(nnz c) per (batch, head) slice; ``rmatmul`` and ``abs_matmul`` alike.
    Duplicates are summed. TypeError / ValueError name ``name`` (default "matrix"): not sparse,
    complex, not square (N, N), or NaN / inf values.

    >>> import torch
    >>> from fast import SparseMask
    >>> m = torch.tensor([[1., 0., 2.], [0., 3., 0.], [4., 0., 5.]])
    >>> op, x = SparseMask(m.to_sparse()), torch.arange(6.).reshape(3, 2)
    >>> op.nnz, torch.allclose(op.matmul(x), m @ x), torch.allclose(op.rmatmul(x), m.T @ x)
    (5, True, True)
    """

    def __init__(self, matrix, *, name: str = "matrix"):
        crow, col, values, n = _to_csr_parts(matrix, name)
        self.n = n
        self.nnz = int(values.numel())
        index = index_dtype(self.nnz, n)
        self._crow, self._col, self._values = crow.to(index), col.to(index), values
        self._csr: dict = {}
        #: True when every stored value is >= 0 (fast.operator); the values are constants.
        self.nonnegative = bool((values >= 0).all())

    def _build(self, crow, col, values, device, dtype) -> torch.Tensor:
        return csr_matrix(crow.to(device), col.to(device), values.to(device=device, dtype=dtype), self.n)

    def csr(self, device: torch.device, dtype: torch.dtype, transpose: bool = False,
            absolute: bool = False) -> torch.Tensor:
        """M (or M^T; absolute: |M|) as a torch CSR tensor on ``device`` in ``dtype``, built once and cached."""
        if absolute and transpose:
            raise ValueError("csr: |M|^T is not built (abs_matmul needs |M| only)")
        key = (str(device), dtype, transpose, absolute)
        if key not in self._csr:
            if absolute:
                self._csr[key] = self._build(self._crow, self._col, self._values.abs(), device, dtype)
            elif not transpose:
                self._csr[key] = self._build(self._crow, self._col, self._values, device, dtype)
            else:  # CSR of M^T = CSC of M: the entries sorted by column once
                crow_t, col_t, order = csr_transpose(self._crow, self._col, self.n)
                self._csr[key] = self._build(crow_t, col_t, self._values[order], device, dtype)
        return self._csr[key]

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., N, c) -> (..., N, c), O(nnz c) per leading index."""
        return self._product(x, transpose=False)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x for x (..., N, c) -> (..., N, c), with the CSR of M^T (built once)."""
        return self._product(x, transpose=True)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """|M| @ x for x (..., N, c) -> (..., N, c) (the guard's entrywise bound of a signed matrix), no gradient."""
        with torch.no_grad():
            return self._product(x.detach(), transpose=False, absolute=True)

    def _product(self, x: torch.Tensor, transpose: bool, absolute: bool = False) -> torch.Tensor:
        work = compute_dtype(x.dtype)
        lead, c = x.shape[:-2], x.shape[-1]
        flat = x.to(work).movedim(-2, 0).reshape(self.n, -1)  # (N, batch * c): one product for all
        a = self.csr(x.device, work, transpose=transpose, absolute=absolute)
        if torch.is_grad_enabled() and flat.requires_grad:  # the transpose is built only when a backward needs it
            y = csr_matmul(a, flat, self.csr(x.device, work, transpose=not transpose))
        else:
            y = a @ flat
        return y.reshape(self.n, *lead, c).movedim(0, -2).to(x.dtype)


def _is_scipy_sparse(x: object) -> bool:
    if not type(x).__module__.startswith("scipy.sparse"):
        return False
    import scipy.sparse as sp

    return sp.issparse(x)


def _to_csr_parts(matrix, name: str):
    """(crow int64, col int64, values float64, N) of a square sparse matrix (duplicates summed)."""
    if isinstance(matrix, torch.Tensor) and matrix.layout in _SPARSE_LAYOUTS:
        _check_values_dtype(name, matrix.dtype)
        if matrix.dim() != 2:
            raise ValueError(f"{name} must be a 2-D sparse matrix (N, N), got shape {tuple(matrix.shape)}")
        n = _check_square(name, tuple(matrix.shape), "sparse matrix (N, N)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            m = matrix.detach().cpu()
            m = (m.coalesce() if m.layout == torch.sparse_coo else m.to_sparse_coo().coalesce()).to_sparse_csr()
        crow, col, values = m.crow_indices().long(), m.col_indices().long(), m.values().to(torch.float64)
    elif _is_scipy_sparse(matrix):
        import scipy.sparse as sp

        if np.iscomplexobj(matrix.data if hasattr(matrix, "data") else np.zeros(0)):
            raise TypeError(f"{name} must hold real values, got {matrix.dtype}")
        n = _check_square(name, tuple(matrix.shape), "sparse matrix (N, N)")
        m = sp.csr_matrix(matrix)
        m.sum_duplicates()
        m.sort_indices()
        crow, col = torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64))
        values = torch.from_numpy(np.asarray(m.data, dtype=np.float64))
    else:
        raise TypeError(f"{name} must be a torch sparse tensor or a scipy.sparse matrix, got {type(matrix).__name__}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return crow, col, values, n


def as_mask_operator(mask: object, *, n: int | None = None, name: str = "mask") -> MaskOperator:
    """The operator for ``mask`` (what masked_linear_attention and favor_attention accept):

    - a MaskOperator subclass: as is, or any other object with ``n`` and a callable ``matmul``:
      wrapped once (fast.operator.as_operator), after checking that n is a positive integer;
    - a dense torch.Tensor (N, N) or batched (..., N, N), floating, integer or bool, or a NumPy
      array of the same (accepted as dense; converted with torch.from_numpy): ``DenseMask``;
    - a torch sparse tensor (COO, CSR, CSC, ...; 2-D) or a scipy.sparse matrix: ``SparseMask``.

    n: if given, the operator must be for n tokens. Errors name ``name`` (default "mask"):
    TypeError for anything else, naming what was expected and what came, or what an operator
    lacks (n or matmul), or an n that is not an int (NumPy integers are ints here); ValueError
    for a non-square matrix, an n <= 0 or a wrong N.

    >>> import torch
    >>> from fast import as_mask_operator
    >>> op = as_mask_operator(torch.ones(3, 3).tril())
    >>> type(op).__name__, op.matmul(torch.ones(3, 1)).flatten().tolist()
    ('DenseMask', [1.0, 2.0, 3.0])
    """
    if isinstance(mask, torch.Tensor):
        op: MaskOperator = SparseMask(mask, name=name) if mask.layout in _SPARSE_LAYOUTS else DenseMask(mask, name=name)
    elif isinstance(mask, np.ndarray):
        real = mask.dtype == bool or (np.issubdtype(mask.dtype, np.number) and not np.iscomplexobj(mask))
        if not real:
            raise TypeError(f"{name} as a NumPy array must hold real numbers or bools (N, N), got dtype {mask.dtype}")
        op = DenseMask(torch.from_numpy(np.ascontiguousarray(mask)), name=name)
    elif _is_scipy_sparse(mask):
        op = SparseMask(mask, name=name)
    else:  # an operator, or a duck-typed one (anything else: TypeError naming what is accepted)
        op = as_operator(mask, name=name)
    if n is not None and op.n != n:
        raise ValueError(f"{name} is for N={op.n} tokens, expected N={n}")
    return op
