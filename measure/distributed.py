"""Scaling of sequence-sharded attention on gloo ranks of this machine (issue 26 item 3).

What is timed: one forward and backward call of fast.distributed.sharded_favor_attention without a
mask (FAVOR+, the issue's motivating case) on (B, H, N_local, d) = (1, SHAPE["H"], N_local,
SHAPE["d"]) inputs with m = SHAPE["m"] features, each rank holding its contiguous slice, float32,
one torch thread per rank (verify.ranks starts one process per rank, as torchrun would).

- weak scaling: TOKENS_PER_RANK = 2^16 tokens on each of 1, 2, 4 ranks (N = 2^16 .. 2^18);
  efficiency t(1) / t(P);
- strong scaling: STRONG_N = 2^18 tokens split over 1, 2, 4 ranks; efficiency t(1) / (P t(P)).

On the 1-rank launch, fast.favor_attention (one process, no torch.distributed) is timed on the
same tokens too (``single_process``): the cost of the sharded function itself on one rank.

Each repeat starts all ranks together (a barrier) and takes the slowest rank's time; one warm-up
call first. A point records every repeat, their median, min and max, and the efficiency from the
medians with an interval from the extremes (docs/methods.md: the spread is reported, never
hidden). With P ranks on fewer than P cores the ranks share cores: on a 2-core machine the 4-rank
points measure oversubscription, not scaling (the report says so, from ``cpus``).

Communication: bytes each rank sent (fast.distributed.count_communication) in one forward and
backward call of the non-causal and of the causal FAVOR+ at N = 2^12 .. 2^18 on 2 and 4 ranks:
the state all-reduce (non-causal) and the states' all-gather (causal) are O(H m d) whatever N,
so each curve must be flat.

World size 1 on CUDA (NCCL) where a GPU is present: the same call at N = STRONG_N, recorded in
``cuda``; skipped otherwise (``cuda_note``).

On a GPU cluster the same functions run under torchrun with NCCL, one process per GPU:

    torchrun --nnodes=$NODES --nproc-per-node=$GPUS_PER_NODE --rdzv-backend=c10d \\
        --rdzv-endpoint=$HEAD_NODE:29500 your_training_script.py

where the script calls ``torch.distributed.init_process_group("nccl")`` and passes its slice of
the sequence (fast.distributed.shard_bounds) to the sharded functions.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from results.schema import CommunicationPoint, DistributedScaling, ScalingPoint

#: tokens each rank holds in the weak-scaling runs
TOKENS_PER_RANK = 2**16
#: total tokens of the strong-scaling runs
STRONG_N = 2**18
WORLDS = (1, 2, 4)
#: the bytes sweep: N = 2^12 .. 2^18 on these world sizes
BYTES_NS = tuple(2**e for e in range(12, 19))
BYTES_WORLDS = (2, 4)
SHAPE = {"B": 1, "H": 2, "m": 32, "d": 32}
#: timed repeats after one warm-up call (quick, full)
REPEATS = {True: 3, False: 7}
THREADS_PER_RANK = 1
#: seconds one launch may run before its ranks are killed
LAUNCH_TIMEOUT = 600.0
FUNCTION = "sharded_favor_attention (no mask), forward + backward, float32"

Status = Callable[[str], None]


def _inputs(n_local: int, seed: int, device: str = "cpu"):
    import torch

    g = torch.Generator().manual_seed(seed)
    b, h, m, d = SHAPE["B"], SHAPE["H"], SHAPE["m"], SHAPE["d"]
    q, k, v = (torch.randn(b, h, n_local, d, generator=g).to(device).requires_grad_(True) for _ in range(3))
    projection = torch.randn(m, d, generator=torch.Generator().manual_seed(0)).to(device)
    return q, k, v, projection


def _call(q, k, v, projection, mask=None, single: bool = False) -> None:
    import fast
    import fast.distributed as fd

    out = (fast.favor_attention if single else fd.sharded_favor_attention)(q, k, v, projection, mask)
    out.sum().backward()


def _timed(n: int, repeats: int, rank: int, world: int, device: str = "cpu", single: bool = False) -> list[float]:
    """This rank's seconds per call on its slice of n tokens: one warm-up, then ``repeats`` calls,
    each started together with the other ranks (a barrier). single: fast.favor_attention, the
    one-process function, instead of the sharded one (world 1)."""
    import torch
    import torch.distributed as dist

    import fast.distributed as fd

    start, stop = fd.shard_bounds(n, rank, world)
    q, k, v, projection = _inputs(stop - start, 1 + rank, device)
    out = []
    for i in range(repeats + 1):
        q.grad = k.grad = v.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        _call(q, k, v, projection, single=single)
        if device != "cpu":
            torch.cuda.synchronize()
        if i:
            out.append(time.perf_counter() - t0)
    return out


def rank_scaling(payload: dict) -> dict:
    """One rank's part of a launch (verify.ranks runs it): weak and strong timings, and the bytes
    it sent per call over BYTES_NS (non-causal and causal) where the world is in BYTES_WORLDS."""
    import torch.distributed as dist

    import fast
    import fast.distributed as fd

    rank, world = dist.get_rank(), dist.get_world_size()
    device = payload.get("device", "cpu")
    repeats = payload["repeats"]
    answer: dict = {"weak": _timed(payload["tokens_per_rank"] * world, repeats, rank, world, device),
                    "strong": _timed(payload["strong_n"], repeats, rank, world, device), "bytes": {}}
    if world == 1:  # the one-process function on the same tokens: what sharding costs on one rank
        answer["single"] = {"weak": _timed(payload["tokens_per_rank"], repeats, 0, 1, device, single=True),
                            "strong": _timed(payload["strong_n"], repeats, 0, 1, device, single=True)}
    if world in payload["bytes_worlds"]:
        for name, mask in (("favor", None), ("favor-causal", "causal")):
            for n in payload["bytes_ns"]:
                start, stop = fd.shard_bounds(n, rank, world)
                q, k, v, projection = _inputs(stop - start, 1 + rank)
                with fd.count_communication() as log:
                    _call(q, k, v, projection, None if mask is None else fast.CausalMask(stop - start))
                answer["bytes"][(name, n)] = log.bytes_sent()  # forward and backward
    return answer


def _point(kind: str, world: int, n: int, per_rank: list[list[float]], base: "ScalingPoint | None") -> ScalingPoint:
    """A point from each rank's seconds per repeat: the slowest rank of each repeat."""
    seconds = [max(ts) for ts in zip(*per_rank)]
    p = ScalingPoint(kind, world, n, seconds, statistics.median(seconds), min(seconds), max(seconds))
    if base is not None:
        scale = 1 if kind == "weak" else world  # strong: P ranks should take 1/P of the time
        p.efficiency = base.median / (scale * p.median)
        p.efficiency_low = base.low / (scale * p.high)
        p.efficiency_high = base.high / (scale * p.low)
    return p


def scaling(quick: bool, worlds: tuple[int, ...] = WORLDS, status: Status = lambda msg: None,
            timeout: float = LAUNCH_TIMEOUT, tokens_per_rank: int = TOKENS_PER_RANK, strong_n: int = STRONG_N,
            bytes_ns: tuple[int, ...] = BYTES_NS, bytes_worlds: tuple[int, ...] = BYTES_WORLDS) -> DistributedScaling:
    """Weak and strong scaling over ``worlds`` gloo ranks, bytes per rank against N, and world 1 on
    CUDA where available (module docstring; the sizes are arguments so that tests run small ones).
    One launch per world size; the first world is the efficiencies' baseline. Raises verify.ranks'
    RankError when a launch fails or runs past ``timeout`` seconds (its ranks are killed)."""
    import torch

    from verify.ranks import run_ranks

    begin = time.perf_counter()
    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    repeats = REPEATS[quick]
    payload = {"repeats": repeats, "tokens_per_rank": tokens_per_rank, "strong_n": strong_n,
               "bytes_ns": tuple(bytes_ns), "bytes_worlds": tuple(bytes_worlds)}
    res = DistributedScaling(mode="quick" if quick else "full", function=FUNCTION, shape=dict(SHAPE),
                             worlds=list(worlds), tokens_per_rank=tokens_per_rank, strong_n=strong_n,
                             repeats=repeats, threads_per_rank=THREADS_PER_RANK, cpus=os.cpu_count() or 1)
    base: dict[str, ScalingPoint] = {}
    for world in worlds:
        status(f"distributed: {world} rank(s)")
        answers = run_ranks("measure.distributed:rank_scaling", world, payload, timeout=timeout,
                            threads=THREADS_PER_RANK)
        for kind, n in (("weak", tokens_per_rank * world), ("strong", strong_n)):
            p = _point(kind, world, n, [a[kind] for a in answers], base.get(kind))
            base.setdefault(kind, p)
            res.points.append(p)
        if "single" in answers[0] and not res.single_process:
            res.single_process = {kind: list(ts) for kind, ts in answers[0]["single"].items()}
        for name, n in answers[0]["bytes"]:
            res.communication.append(CommunicationPoint(name, world, n, [int(a["bytes"][(name, n)]) for a in answers]))
    if torch.cuda.is_available():
        status("distributed: world size 1 on CUDA (NCCL)")
        answers = run_ranks("measure.distributed:rank_scaling", 1,
                            {**payload, "device": "cuda", "bytes_worlds": ()}, timeout=timeout,
                            threads=THREADS_PER_RANK, backend="nccl")
        seconds = answers[0]["strong"]
        res.cuda = {"device": torch.cuda.get_device_name(0), "n": strong_n, "seconds": seconds,
                    "median": statistics.median(seconds), "weak_seconds": answers[0]["weak"]}
    else:
        res.cuda_note = "no CUDA device on this machine: world size 1 on CUDA not run"
    res.seconds = round(time.perf_counter() - begin, 2)
    if load:
        res.load = [round(load[0], 2), round(os.getloadavg()[0], 2)]
    return res
