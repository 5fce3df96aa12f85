"""Argument plumbing the sharded drivers share: shape checks that allow a rank without rows, the
agreement of the ranks on their arguments before any collective, and the compute dtype."""
from __future__ import annotations

import torch
import torch.distributed as dist

from fast.distributed.collectives import agree, note_call, world_of
from fast.validation import FLOAT_DTYPES, compute_dtype, finite_flag, raise_if_non_finite

__all__ = ["check_rows", "check_slices", "agreed", "work_dtype", "with_ones"]


def check_rows(name: str, x: object) -> torch.Tensor:
    """``x`` when it is a floating tensor (..., n, c), n >= 0 (a rank may hold no rows), c >= 1;
    TypeError / ValueError naming ``name`` otherwise. O(1).

    >>> import torch
    >>> from fast.distributed.arguments import check_rows
    >>> tuple(check_rows("v", torch.ones(0, 3)).shape)
    (0, 3)
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (..., n_local, c), got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    if x.dim() < 2 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., n_local, c) with c >= 1, got {tuple(x.shape)}")
    return x


def check_slices(names: tuple[str, str, str], a: torch.Tensor, b: torch.Tensor, v: torch.Tensor,
                  same_width: bool = True) -> None:
    """Three row slices (..., n, c) of one rank: the same leading dims and n (c may differ between
    the third and the others; the first two share it when ``same_width``), one device. O(1).

    >>> import torch
    >>> from fast.distributed.arguments import check_slices
    >>> check_slices(("q", "k", "v"), torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, 1))
    Traceback (most recent call last):
    ...
    ValueError: q, k, v must share their leading dims and n_local (each rank holds the same rows of all ...
    """
    for name, t in zip(names, (a, b, v)):
        check_rows(name, t)
    if a.shape[:-1] != b.shape[:-1] or b.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"{', '.join(names)} must share their leading dims and n_local (each rank holds the same "
                         f"rows of all three), got {tuple(a.shape)}, {tuple(b.shape)}, {tuple(v.shape)}")
    if same_width and a.shape[-1] != b.shape[-1]:
        raise ValueError(f"{names[0]} and {names[1]} must have the same width, got {a.shape[-1]} and {b.shape[-1]}")
    if not (a.device == b.device == v.device):
        raise ValueError(f"{', '.join(names)} must be on one device, got {a.device}, {b.device}, {v.device}")


def group_device(group: object, like: object) -> torch.device | None:
    """Where the agreement's small tensor lives: ``like``'s device, else CUDA for NCCL, else None (CPU).

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> from fast.distributed.arguments import group_device
    >>> group_device(None, torch.ones(1))
    device(type='cpu')
    >>> dist.destroy_process_group()
    """
    if isinstance(like, torch.Tensor):
        return like.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return None


def agreed(function: str, group: object, like: object, validate) -> tuple[int, int, list[int]]:
    """(rank, world, every rank's n_local) after ``validate()`` -> (n_local, descriptor) ran on
    every rank and the ranks compared their descriptors; a rank whose validate raised re-raises its
    error, the others raise ValueError naming it (so no rank is left waiting in a collective). One
    all-gather of a few int64.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> from fast.distributed.arguments import agreed
    >>> agreed("f", None, None, lambda: (4, [2, 3]))
    (0, 1, [4])
    >>> dist.destroy_process_group()
    """
    rank, world = world_of(group, function)
    error, n, descriptor = None, 0, []
    try:
        n, descriptor = validate()
    except (TypeError, ValueError) as exc:
        error = exc
    counts = agree(function, n, descriptor, "their arguments", group, group_device(group, like), error=error)
    note_call()
    return rank, world, counts


def work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the sharded drivers compute in: the promoted dtype, half precisions as float32.

    >>> import torch
    >>> from fast.distributed.arguments import work_dtype
    >>> work_dtype(torch.ones(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float16))
    torch.float32
    """
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return compute_dtype(dtype)


def check_finite(**tensors: torch.Tensor | None) -> None:
    """ValueError naming the first named tensor that holds NaN or inf (fast.validation's
    raise_if_non_finite), found with one aminmax pass per tensor (fast.validation.finite_flag, one
    host read) and the per-tensor search only when that fails: isfinite(x).all() on every argument
    cost a sharded call about as much as the attention itself (N = 2^16, H = 8, d = 64, one thread).
    O(numel).

    >>> import torch
    >>> from fast.distributed.arguments import check_finite
    >>> check_finite(q=torch.ones(2), k=None, v=torch.tensor([float("nan")]))
    Traceback (most recent call last):
    ...
    ValueError: v contains non-finite values (NaN or inf)
    """
    given = [t.detach() for t in tensors.values() if t is not None]
    if given and not bool(finite_flag(*given)):
        raise_if_non_finite(**tensors)


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """[v | 1] (..., n, d + 1): the last column of phi_q^T phi_k^T [v | 1] is the denominator.

    >>> import torch
    >>> from fast.distributed.arguments import with_ones
    >>> with_ones(torch.zeros(2, 1)).tolist()
    [[0.0, 1.0], [0.0, 1.0]]
    """
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
