"""The sharded-attention cases that distributed/<id> runs on gloo ranks, and their one-process twins.

A case is one sharded function of fast.distributed with one mask: its inputs are drawn on the
WHOLE sequence (or node set) from the seed, identically on every rank and in the checking process
(no data is sent); each rank keeps its contiguous slice along N (fast.distributed.shard_bounds)
and calls the sharded function on it, the checking process calls the one-process function of
fast/ on the whole. Both backpropagate L = <G, out> (G drawn with the inputs), so each rank's
output and input gradients must equal the rows [start, stop) of the one-process ones.

Shapes (small: the check is about the collectives, not speed): sequences (B, H, N, c) = (2, 2,
N_SEQ, c) with m = 8 features and d = 4 values; graphs of GRAPH_SIZES nodes (N_NODES in all), one
of them across two rank boundaries at four ranks; packing segments of SEGMENT_SIZES tokens, one
across every rank boundary; padding a per-sample key mask (B, 1, N) with padded keys on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

#: tokens of the sequence cases: not a multiple of 2 or 4 ranks (uneven shards), > the causal
#: scan's chunk on every rank (the local scan crosses chunks)
N_SEQ = 150
#: nodes of the graph cases, and the sizes of their graphs (in order): at 2 ranks (rows 0-44,
#: 45-89) the second graph spans the boundary; at 4 ranks (boundaries 23, 46, 68) it spans two and
#: the fourth one more
N_NODES = 90
GRAPH_SIZES = (7, 41, 3, 30, 9)
#: the packing case's segment lengths over N_SEQ: a segment crosses the boundary at 2 ranks (75)
#: and each one at 4 ranks (38, 76, 113); segments of 1 and 2 tokens too
SEGMENT_SIZES = (5, 60, 2, 40, 1, 30, 12)
BATCH, HEADS, M, D_QK, D_V = 2, 2, 8, 6, 4
#: Gumbel samples of the gumbel case
SAMPLES = 3


@dataclass(frozen=True)
class Case:
    """One sharded function and mask.

    make(seed, dtype) -> dict of whole-problem tensors; ``grad`` names the ones whose gradients are
    compared (leaves); ``sliced`` maps every input cut along N to the dim it is cut along; the
    others go to every rank whole. single(inputs) -> out on the whole problem (fast/'s one-process
    function); sharded(inputs) -> the rank's rows (fast.distributed, default process group).
    """

    id: str
    title: str
    make: Callable[[int, torch.dtype], dict]
    single: Callable[[dict], torch.Tensor]
    sharded: Callable[[dict], torch.Tensor]
    grad: tuple[str, ...]
    sliced: dict


def _gen(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 26, salt]).generate_state(1)[0]))


def _seq(seed: int, dtype: torch.dtype, salt: int, positive: bool) -> dict:
    """q, k (B, H, N, D_QK) or positive features phi_q, phi_k (B, H, N, M), v (B, H, N, D_V)."""
    g = _gen(seed, salt)
    width = M if positive else D_QK
    q = torch.randn(BATCH, HEADS, N_SEQ, width, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, HEADS, N_SEQ, width, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, HEADS, N_SEQ, D_V, generator=g, dtype=torch.float64)
    if positive:  # ELU + 1 features, as a linear-attention user forms them
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    out = {"q": q, "k": k, "v": v}
    if not positive:
        out["projection"] = torch.randn(M, D_QK, generator=g, dtype=torch.float64)
    return {name: t.to(dtype) for name, t in out.items()}


def _segments(sizes: tuple[int, ...]) -> torch.Tensor:
    """Sorted labels 0, 1, ... repeated sizes[i] times (PyG batch vectors, packing's segment ids)."""
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def _padding(seed: int) -> torch.Tensor:
    """(B, 1, N) bool: sample b keeps a drawn subset of its keys (about 70%), at least one."""
    g = _gen(seed, 5)
    keep = torch.rand(BATCH, 1, N_SEQ, generator=g) < 0.7
    keep[..., 0] = True
    return keep


def _nodes(seed: int, dtype: torch.dtype, salt: int) -> dict:
    g = _gen(seed, salt)
    out = {"q": torch.randn(N_NODES, D_QK, generator=g, dtype=torch.float64),
           "k": torch.randn(N_NODES, D_QK, generator=g, dtype=torch.float64),
           "v": torch.randn(N_NODES, D_V, generator=g, dtype=torch.float64),
           "projection": torch.randn(M, D_QK, generator=g, dtype=torch.float64),
           "noise": -torch.log(-torch.log(torch.rand(SAMPLES, N_NODES, generator=g, dtype=torch.float64)))}
    out = {name: t.to(dtype) for name, t in out.items()}
    out["batch"] = _segments(GRAPH_SIZES)
    return out


def _dist():
    import fast.distributed as fd  # imported where used: the checking process needs it only for the cases

    return fd


def _cases() -> list[Case]:
    import fast
    from fast.latent.nodeformer import kernelized_gumbel_softmax, kernelized_softmax
    from fast.latent.simple_attention import difformer_attention, sgformer_attention

    seq = {"q": -2, "k": -2, "v": -2}
    nodes = {"q": -2, "k": -2, "v": -2, "batch": -1}

    def linear(mask_single, mask_local, salt):
        return dict(make=lambda s, dt: {**_seq(s, dt, salt, True), **_extra(s, salt)},
                    single=lambda x: fast.masked_linear_attention(x["q"], x["k"], x["v"], mask_single(x)),
                    sharded=lambda x: _dist().sharded_linear_attention(x["q"], x["k"], x["v"], mask_local(x)))

    def favor(mask_single, mask_local, salt):
        return dict(make=lambda s, dt: _seq(s, dt, salt, False),
                    single=lambda x: fast.favor_attention(x["q"], x["k"], x["v"], x["projection"], mask_single(x)),
                    sharded=lambda x: _dist().sharded_favor_attention(x["q"], x["k"], x["v"], x["projection"],
                                                                        mask_local(x)))

    def _extra(seed, salt):
        return {"segments": _segments(SEGMENT_SIZES), "key_mask": _padding(seed)}

    none = lambda x: None  # noqa: E731
    causal = lambda x: fast.CausalMask(x["q"].shape[-2])  # noqa: E731
    return [
        Case("linear", CASE_TITLES["linear"], **linear(none, none, 1),
             grad=("q", "k", "v"), sliced=seq),
        Case("linear-causal", CASE_TITLES["linear-causal"], **linear(causal, causal, 2),
             grad=("q", "k", "v"), sliced=seq),
        Case("packing", CASE_TITLES["packing"],
             **linear(lambda x: fast.PackingMask(x["segments"]), lambda x: x["segments"], 3),  # sharded: global labels
             grad=("q", "k", "v"), sliced={**seq, "segments": -1}),
        Case("padding", CASE_TITLES["padding"],
             **linear(lambda x: fast.PaddingMask(x["key_mask"]), lambda x: fast.PaddingMask(x["key_mask"]), 4),
             grad=("q", "k", "v"), sliced={**seq, "key_mask": -1}),
        Case("favor", CASE_TITLES["favor"], **favor(none, none, 6), grad=("q", "k", "v"), sliced=seq),
        Case("favor-causal", CASE_TITLES["favor-causal"], **favor(causal, causal, 7), grad=("q", "k", "v"), sliced=seq),
        Case("kernelized-softmax", CASE_TITLES["kernelized-softmax"],
             make=lambda s, dt: _nodes(s, dt, 8),
             single=lambda x: kernelized_softmax(x["q"], x["k"], x["v"], x["projection"], batch=x["batch"]),
             sharded=lambda x: _dist().sharded_kernelized_softmax(x["q"], x["k"], x["v"], x["projection"],
                                                                  batch=x["batch"]),
             grad=("q", "k", "v"), sliced=nodes),
        Case("gumbel", CASE_TITLES["gumbel"],
             make=lambda s, dt: _nodes(s, dt, 9),
             single=lambda x: kernelized_gumbel_softmax(x["q"], x["k"], x["v"], x["projection"], noise=x["noise"],
                                                        batch=x["batch"]),
             sharded=lambda x: _dist().sharded_kernelized_gumbel_softmax(x["q"], x["k"], x["v"], x["projection"],
                                                                         noise=x["noise"], batch=x["batch"]),
             grad=("q", "k", "v"), sliced={**nodes, "noise": -1}),
        Case("sgformer", CASE_TITLES["sgformer"],
             make=lambda s, dt: _nodes(s, dt, 10),
             single=lambda x: sgformer_attention(x["q"], x["k"], x["v"], batch=x["batch"]),
             sharded=lambda x: _dist().sharded_sgformer_attention(x["q"], x["k"], x["v"], batch=x["batch"]),
             grad=("q", "k", "v"), sliced=nodes),
        Case("difformer", CASE_TITLES["difformer"],
             make=lambda s, dt: _nodes(s, dt, 11),
             single=lambda x: difformer_attention(x["q"], x["k"], x["v"], batch=x["batch"]),
             sharded=lambda x: _dist().sharded_difformer_attention(x["q"], x["k"], x["v"], batch=x["batch"]),
             grad=("q", "k", "v"), sliced=nodes),
    ]


#: the fast.distributed function each case calls
CASE_FUNCTIONS = {"linear": "sharded_linear_attention", "linear-causal": "sharded_linear_attention",
                  "packing": "sharded_linear_attention", "padding": "sharded_linear_attention",
                  "favor": "sharded_favor_attention", "favor-causal": "sharded_favor_attention",
                  "kernelized-softmax": "sharded_kernelized_softmax",
                  "gumbel": "sharded_kernelized_gumbel_softmax", "sgformer": "sharded_sgformer_attention",
                  "difformer": "sharded_difformer_attention"}
#: the cases' ids and titles, in the order distributed/<id> lists them
CASE_TITLES = {
    "linear": "masked linear attention, no mask",
    "linear-causal": "masked linear attention, CausalMask",
    "packing": "masked linear attention, packing: global segment labels, segments across ranks",
    "padding": "masked linear attention, PaddingMask (B, 1, N)",
    "favor": "FAVOR+, no mask",
    "favor-causal": "FAVOR+, CausalMask",
    "kernelized-softmax": "NodeFormer kernelized softmax over a sharded PyG batch",
    "gumbel": "NodeFormer kernelized Gumbel-softmax (noise given) over a sharded PyG batch",
    "sgformer": "SGFormer global attention over a sharded PyG batch",
    "difformer": "DIFFormer global attention over a sharded PyG batch",
}
CASE_IDS = tuple(CASE_TITLES)
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def available() -> list[str]:
    """The ids of the cases whose fast.distributed function exists in this checkout (CASE_IDS order).

        >>> from verify.sharding import available
        >>> "linear" in available()
        True
    """
    try:
        fd = _dist()
    except ImportError:
        return []
    return [cid for cid in CASE_IDS if hasattr(fd, CASE_FUNCTIONS[cid])]


def cases() -> dict[str, Case]:
    """Every case by id (CASE_IDS order).

        >>> from verify.sharding import cases, CASE_IDS
        >>> tuple(cases()) == CASE_IDS
        True
    """
    return {c.id: c for c in _cases()}


def _cotangent(seed: int, case_id: str, shape, dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed, 1000 + CASE_IDS.index(case_id)), dtype=torch.float64).to(dtype)


def _rows(case: Case, inputs: dict, start: int, stop: int) -> dict:
    out = {}
    for name, t in inputs.items():
        dim = case.sliced.get(name)
        out[name] = t if dim is None else t.narrow(dim, start, stop - start)
    return out


def _run(case: Case, inputs: dict, call: Callable[[dict], torch.Tensor], seed: int, n: int,
         rows: tuple[int, int] | None) -> dict:
    """call on inputs (fresh leaves for case.grad), backward of <G, out> with G the rows ``rows``
    (all for None) of the whole problem's cotangent (N = n); float64 copies of out and the grads."""
    leaves = {k: (t.detach().clone().requires_grad_(True) if k in case.grad else t) for k, t in inputs.items()}
    out = call(leaves)
    whole = (*out.shape[:-2], n, out.shape[-1])
    g = _cotangent(seed, case.id, whole, out.dtype)
    if rows is not None:
        g = g.narrow(-2, rows[0], rows[1] - rows[0])
    (out * g).sum().backward()
    grads = {k: leaves[k].grad if leaves[k].grad is not None else torch.zeros_like(leaves[k]) for k in case.grad}
    return {"out": out.detach().double(), "grads": {k: t.detach().double() for k, t in grads.items()}}


def _length(case: Case, inputs: dict) -> int:
    """N of a case: the length of its inputs along the dim they are sliced on."""
    name, dim = next(iter(case.sliced.items()))
    return inputs[name].shape[dim]


def single_process(case_id: str, seed: int, dtype: str) -> dict:
    """The one-process output and input gradients of a case, on the whole problem:
    {"out": (..., N, d), "grads": {name: tensor}} in float64 (computed in ``dtype``).

        >>> from verify.sharding import single_process
        >>> single_process("linear", 0, "float64")["out"].shape
        torch.Size([2, 2, 150, 4])
    """
    case = cases()[case_id]
    inputs = case.make(seed, DTYPES[dtype])
    return _run(case, inputs, case.single, seed, _length(case, inputs), None)


def rank_cases(payload: dict) -> dict:
    """The body of one rank (verify.ranks runs it with the gloo group initialised): every case of
    payload["cases"] in every dtype of payload["dtypes"] on this rank's slice; returns {"rank",
    "world", "bounds": {case: (start, stop)}, "runs": {case: {dtype: {"out", "grads"}}},
    "errors": {case: message}, "bytes": {case: {dtype: {"forward": bytes, "backward": bytes}}}} (the
    bytes this rank sent, fast.distributed.count_communication). A case that raises
    is recorded and the next one runs (every rank raises alike on the same inputs)."""
    import traceback

    import torch.distributed as dist

    fd = _dist()
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = payload["seed"]
    answer: dict = {"rank": rank, "world": world, "bounds": {}, "runs": {}, "errors": {}, "bytes": {}}
    for cid in payload["cases"]:
        case = cases()[cid]
        try:
            for name, dtype in DTYPES.items():
                if name not in payload["dtypes"]:
                    continue
                inputs = case.make(seed, dtype)
                n = _length(case, inputs)
                start, stop = fd.shard_bounds(n, rank, world)
                answer["bounds"][cid] = (start, stop)
                with fd.count_communication() as log:
                    run = _run(case, _rows(case, inputs, start, stop), case.sharded, seed, n, (start, stop))
                answer["runs"].setdefault(cid, {})[name] = run
                answer["bytes"].setdefault(cid, {})[name] = {phase: log.bytes_sent(phase) for phase in
                                                             ("forward", "backward")}
        except Exception:  # recorded for the check; the other cases still run
            answer["errors"][cid] = traceback.format_exc(limit=4)
    return answer
