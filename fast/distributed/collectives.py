"""The collectives the sharded drivers use, on torch.distributed, differentiable, and counted.

Every byte a sharded function sends goes through this module, so one place knows the group (the
default is torch.distributed's WORLD), checks that the ranks agree on shapes before any collective
that would otherwise hang, and records the traffic for ``count_communication``.

Counting convention (per rank, per collective): an all-reduce counts the size of the tensor it
reduces (numel x element size), an all-gather the size of the rank's own part. This is what the
rank hands to the collective; what the backend moves on the wire depends on its algorithm (a ring
all-reduce moves about 2 (W - 1) / W times the tensor), a constant factor that does not depend on N.
Backward passes are counted too, under the same names with ``phase="backward"``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist

__all__ = ["CommunicationLog", "CommunicationRecord", "count_communication", "world_of", "all_reduce_sum",
           "all_reduce_max", "all_gather_stack", "agree"]

_ACTIVE: list["CommunicationLog"] = []  # the logs open in this process (nested count_communication blocks)


@dataclass(frozen=True)
class CommunicationRecord:
    """One collective as this rank saw it: ``function`` (the public sharded function that called
    it), ``collective`` ("all_reduce_sum", "all_reduce_max", "all_gather"), ``phase`` ("forward" or
    "backward"), ``nbytes`` (this rank's bytes under the module's convention) and ``shape``.

    >>> from fast.distributed.collectives import CommunicationRecord
    >>> CommunicationRecord("f", "all_gather", "forward", 64, (8,)).nbytes
    64
    """

    function: str
    collective: str
    phase: str
    nbytes: int
    shape: tuple[int, ...]


@dataclass
class CommunicationLog:
    """The collectives this rank ran inside a ``count_communication()`` block.

    ``records``: the CommunicationRecord of every collective; ``calls``: how many public sharded
    calls ran. ``bytes_sent(phase=None, collective=None)`` sums nbytes over the matching records;
    ``bytes_per_call(phase="forward")`` divides the forward bytes by ``calls`` (the figure that must
    not grow with N: O(H m d) per call for the sequence drivers).

    >>> from fast.distributed.collectives import CommunicationLog, CommunicationRecord
    >>> log = CommunicationLog()
    >>> log.records.append(CommunicationRecord("f", "all_reduce_sum", "forward", 80, (10,)))
    >>> log.calls = 1
    >>> log.bytes_sent(), log.bytes_per_call()
    (80, 80.0)
    """

    records: list[CommunicationRecord] = field(default_factory=list)
    calls: int = 0

    def bytes_sent(self, phase: str | None = None, collective: str | None = None) -> int:
        """Total nbytes of the records with this phase and collective (None: any)."""
        return sum(r.nbytes for r in self.records
                   if (phase is None or r.phase == phase) and (collective is None or r.collective == collective))

    def bytes_per_call(self, phase: str = "forward") -> float:
        """bytes_sent(phase) / calls (0.0 before any call)."""
        return self.bytes_sent(phase) / self.calls if self.calls else 0.0


@contextlib.contextmanager
def count_communication() -> Iterator[CommunicationLog]:
    """Record every collective the sharded functions run on this rank inside the block.

    Yields a CommunicationLog (module doc: the counting convention). Nested blocks each record.
    Costs a list append per collective.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast.distributed import count_communication, sharded_linear_attention
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> with count_communication() as log:
    ...     out = sharded_linear_attention(torch.rand(5, 3), torch.rand(5, 3), torch.rand(5, 2))
    >>> log.calls, log.bytes_sent(collective="all_reduce_sum")   # the (m, d + 1) float32 state
    (1, 36)
    >>> dist.destroy_process_group()
    """
    log = CommunicationLog()
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


def note_call() -> None:
    """Count one public sharded call in every open log (the drivers call it once per call).

    >>> from fast.distributed.collectives import count_communication, note_call
    >>> with count_communication() as log:
    ...     note_call()
    >>> log.calls
    1
    """
    for log in _ACTIVE:
        log.calls += 1


def _record(function: str, collective: str, phase: str, t: torch.Tensor) -> None:
    for log in _ACTIVE:
        log.records.append(CommunicationRecord(function, collective, phase, t.numel() * t.element_size(),
                                               tuple(t.shape)))


def world_of(group: object = None, what: str = "this function") -> tuple[int, int]:
    """(rank, world size) of ``group`` (None: torch.distributed's default group, WORLD).

    RuntimeError naming what to call when torch.distributed is not available or not initialised.

    >>> import os, tempfile, torch.distributed as dist
    >>> from fast.distributed.collectives import world_of
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> world_of()
    (0, 1)
    >>> dist.destroy_process_group()
    """
    if not dist.is_available():
        raise RuntimeError(f"{what} needs torch.distributed, which this torch build does not include")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{what} needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(backend) first (\"gloo\" for CPU tensors, \"nccl\" for CUDA), "
            "e.g. under `torchrun --nproc-per-node=K script.py`, or with init_method/rank/world_size given")
    return dist.get_rank(group), dist.get_world_size(group)


class _AllReduceSum(torch.autograd.Function):
    """y = sum over ranks of x. Every rank's loss reads y, so dL/dx_r = sum_r' dL_r'/dy: the
    gradient is all-reduced too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, function: str) -> torch.Tensor:
        ctx.group, ctx.function = group, function
        y = x.detach().clone().contiguous()
        _record(function, "all_reduce_sum", "forward", y)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = grad.detach().clone().contiguous()
        _record(ctx.function, "all_reduce_sum", "backward", g)
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g, None, None


class _AllGather(torch.autograd.Function):
    """(W, *x.shape): every rank's x stacked in rank order. The gradient of x_r is the sum over ranks
    of their gradients at slot r: one all-reduce of the (W, ...) gradient, then row r."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, function: str) -> torch.Tensor:
        ctx.group, ctx.function = group, function
        ctx.rank = dist.get_rank(group)
        x = x.detach().contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        _record(function, "all_gather", "forward", x)
        dist.all_gather(parts, x, group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = grad.detach().clone().contiguous()
        _record(ctx.function, "all_reduce_sum", "backward", g)
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g[ctx.rank], None, None


def all_reduce_sum(x: torch.Tensor, group: object = None, function: str = "?") -> torch.Tensor:
    """Sum of x over the ranks of ``group`` (same shape on every rank), differentiable (the gradient
    is all-reduced). Counted as x's bytes. Not in place: x is unchanged.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast.distributed.collectives import all_reduce_sum
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> all_reduce_sum(torch.ones(2)).tolist()
    [1.0, 1.0]
    >>> dist.destroy_process_group()
    """
    return _AllReduceSum.apply(x, group, function)


def all_reduce_max(x: torch.Tensor, group: object = None, function: str = "?") -> torch.Tensor:
    """Entrywise max of x over the ranks (-inf entries allowed), detached: for stabilising constants,
    whose gradient is zero. Counted as x's bytes.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast.distributed.collectives import all_reduce_max
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> all_reduce_max(torch.tensor([1.0, -torch.inf])).tolist()
    [1.0, -inf]
    >>> dist.destroy_process_group()
    """
    y = x.detach().clone().contiguous()
    _record(function, "all_reduce_max", "forward", y)
    dist.all_reduce(y, op=dist.ReduceOp.MAX, group=group)
    return y


def all_gather_stack(x: torch.Tensor, group: object = None, function: str = "?") -> torch.Tensor:
    """(W, *x.shape): every rank's x in rank order (the same shape on every rank), differentiable
    (the gradient of x is the sum of every rank's gradient at this rank's slot). Counted as x's bytes.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast.distributed.collectives import all_gather_stack
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> tuple(all_gather_stack(torch.ones(2, 3)).shape)
    (1, 2, 3)
    >>> dist.destroy_process_group()
    """
    return _AllGather.apply(x, group, function)


_DTYPES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
_WIDTH = 24  # entries of the descriptor each rank sends (shapes of up to ~8 dims for three tensors)


def agree(function: str, local_n: int, descriptor: list[int], what: str, group: object = None,
          device: torch.device | None = None, error: Exception | None = None) -> list[int]:
    """Check that every rank passes the same ``descriptor`` (small ints: leading dims, widths, dtype
    code, mask kind) before a collective whose sizes depend on it: mismatched ranks would otherwise
    hang or read garbage. One all-gather of _WIDTH int64 per rank, which also carries each rank's
    ``local_n`` (its rows along N; not compared) and whether ``error`` (this rank's refusal of its
    arguments, or None) is set. Returns every rank's local_n in rank order. A rank with an error
    raises it; the others raise ValueError naming that rank; ValueError on every rank naming
    ``what`` when the descriptors differ. No rank is left waiting in a later collective.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast.distributed.collectives import agree
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> agree("f", 5, [3, 2], "shapes")
    [5]
    >>> dist.destroy_process_group()
    """
    if len(descriptor) + 3 > _WIDTH:
        raise ValueError(f"{function}: too many dims to compare across ranks ({len(descriptor)} > {_WIDTH - 3})")
    row = torch.full((_WIDTH,), -2, dtype=torch.int64)
    row[0], row[1], row[2] = local_n, error is None, len(descriptor)
    if descriptor:
        row[3:3 + len(descriptor)] = torch.tensor(descriptor, dtype=torch.int64)
    row = row.to(device if device is not None else "cpu")
    parts = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    _record(function, "all_gather", "forward", row)
    dist.all_gather(parts, row, group=group)
    table = torch.stack(parts).cpu()
    if error is not None:
        raise error
    refused = [r for r, ok in enumerate(table[:, 1].tolist()) if not ok]
    if refused:
        raise ValueError(f"{function}: rank(s) {refused} refused their arguments (their error says why); this "
                         "rank's were valid")
    if not bool((table[:, 2:] == table[0, 2:]).all()):
        raise ValueError(f"{function}: the ranks disagree on {what} (every rank must pass the same leading dims, "
                         f"feature widths, dtype and mask kind; only N may differ); per-rank descriptors "
                         f"{table[:, 3:3 + len(descriptor)].tolist()}")
    return table[:, 0].tolist()


def dtype_code(dtype: torch.dtype) -> int:
    """A small int per floating dtype for ``agree`` (0 for anything else).

    >>> import torch
    >>> from fast.distributed.collectives import dtype_code
    >>> dtype_code(torch.float64), dtype_code(torch.int64)
    (4, 0)
    """
    return _DTYPES.get(dtype, 0)
