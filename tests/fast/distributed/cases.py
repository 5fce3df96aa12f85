"""The comparisons the distributed tests run on every rank: the sharded function on the rank's
slice against the single-process function on the whole input, forward and the input gradients.
Each returns {case name: largest relative Frobenius error over the output and the gradients}."""
from __future__ import annotations

import torch

import fast
import fast.distributed as fd

B, H, D, M = 2, 2, 4, 8


def _rel(a: torch.Tensor, b: torch.Tensor, whole: torch.Tensor) -> float:
    """|a - b|_F / |whole|_F: the rank's slice b against the scale of the whole tensor, as a slice's
    own gradient may vanish (a query alone in its segment outputs its own value, whatever q is)."""
    a, b = a.detach(), b.detach()
    if b.numel() == 0:
        return 0.0
    scale = float(torch.linalg.vector_norm(whole.detach().double()))
    return float(torch.linalg.vector_norm((a - b).double())) / max(scale, 1e-300)


def _compare(single, sharded, inputs: list[torch.Tensor], start: int, stop: int, seed: int) -> float:
    """single(*inputs) on the whole sequence against sharded(*slices) on rows [start, stop) (axis -2):
    the output and the gradients of <out, G> for a fixed random G."""
    g = torch.Generator().manual_seed(seed)
    full = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = single(*full)
    weight = torch.randn(out.shape, generator=g, dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), full)
    part = [x.detach()[..., start:stop, :].clone().requires_grad_(True) for x in inputs]
    mine = sharded(*part)
    errors = [_rel(mine, out.detach()[..., start:stop, :], out)]
    mine_grads = torch.autograd.grad((mine * weight[..., start:stop, :]).sum(), part, allow_unused=True)
    for a, b in zip(mine_grads, grads):
        a = torch.zeros_like(b[..., start:stop, :]) if a is None else a
        errors.append(_rel(a, b[..., start:stop, :], b))
    return max(errors)


def sequence_cases(rank: int, world: int, payload) -> dict[str, float]:
    n, dtype = payload["n"], payload["dtype"]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(3))
    w = fast.gaussian_projection(M, D, generator=g, dtype=dtype)
    start, stop = fd.shard_bounds(n, rank, world)
    phi = fast.EluPlusOne()
    ids = torch.arange(n) * 3 // n * 2 + 5  # three segments (labels 5, 7, 9) crossing rank boundaries
    ids[-1] = 5  # one token of the first segment at the end: segments need not be contiguous
    key_mask = torch.rand(B, 1, n, generator=g) < 0.7
    key_mask[..., 0] = True
    errors = {}
    masks = {"none": (None, None), "causal": (fast.CausalMask(n), "causal"),
             "packing": (fast.PackingMask(ids), ids[start:stop]),
             "padding": (fast.PaddingMask(key_mask), key_mask[..., start:stop])}
    for name, (whole, local) in masks.items():
        errors[f"linear/{name}"] = _compare(
            lambda a, b, c: fast.masked_linear_attention(phi(a), phi(b), c, whole),
            lambda a, b, c: fd.sharded_linear_attention(phi(a), phi(b), c, local), [q, k, v], start, stop, 2)
        errors[f"favor/{name}"] = _compare(
            lambda a, b, c: fast.favor_attention(a, b, c, w, whole),
            lambda a, b, c: fd.sharded_favor_attention(a, b, c, w, local), [q, k, v], start, stop, 3)
    return errors


def all_cases(rank: int, world: int, payload) -> dict[str, dict[str, float]]:
    """sequence_cases and node_cases per dtype: {str(dtype): {case: error}} (one spawn for all)."""
    out = {}
    for dtype in payload["dtypes"]:
        one = {"n": payload["n"], "dtype": dtype}
        out[str(dtype)] = {**sequence_cases(rank, world, one), **node_cases(rank, world, one)}
    return out


def bad_shape_on_rank_one(rank: int, world: int, payload) -> None:
    """Rank 1 passes v with another width: it raises its own error, the others name it."""
    x = torch.rand(4, 3)
    fd.sharded_linear_attention(x, x, torch.rand(5 if rank == 1 else 4, 3))


def hang_on_rank_one(rank: int, world: int, payload) -> None:
    """Rank 1 never calls the collective; rank 0 waits in it."""
    if rank == 1:
        import time
        time.sleep(3600)
    x = torch.rand(4, 3)
    fd.sharded_linear_attention(x, x, x)


def bytes_per_call(rank: int, world: int, payload) -> dict[int, int]:
    """Forward and backward bytes this rank sends per call of sharded_favor_attention, per N."""
    out = {}
    for n in payload["ns"]:
        start, stop = fd.shard_bounds(n, rank, world)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g)[..., start:stop, :].requires_grad_(True) for _ in range(3))
        w = fast.gaussian_projection(M, D, generator=g)
        with fd.count_communication() as log:
            fd.sharded_favor_attention(q, k, v, w, "causal").sum().backward()
        out[n] = log.bytes_sent()
    return out


def node_cases(rank: int, world: int, payload) -> dict[str, float]:
    """The node-sharded graph attentions; graphs span ranks (for N >= 5 label 3 is an empty graph)."""
    n, dtype = payload["n"], payload["dtype"]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(3))
    w = fast.gaussian_projection(M, D, generator=g, dtype=dtype)
    noise = fast.gumbel_noise((2, B, H, n), generator=g, dtype=dtype)
    top = min(4, n - 1)  # one process refuses labels >= N
    # graph 0 has two nodes or more: in one-node graphs the outputs are v whatever q and k, and the
    # gradients of q and k vanish, leaving round-off to compare
    batch = torch.tensor(sorted([0, 0, top] + [int(x) for x in torch.randint(0, top + 1, (n - 3,), generator=g)]))
    if top == 4:
        batch[batch == 3] = 2
    start, stop = fd.shard_bounds(n, rank, world)
    local = batch[start:stop]
    errors = {}
    for name, b, lb, graphs in (("one-graph", None, None, None), ("batch", batch, local, None),
                                ("batch-given-G", batch, local, top + 1)):
        errors[f"kernelized/{name}"] = _compare(
            lambda a, c, d: fast.kernelized_softmax(a, c, d, w, tau=0.5, batch=b),
            lambda a, c, d: fd.sharded_kernelized_softmax(a, c, d, w, tau=0.5, batch=lb, num_graphs=graphs),
            [q, k, v], start, stop, 5)
        errors[f"gumbel/{name}"] = _compare(
            lambda a, c, d: fast.kernelized_gumbel_softmax(a, c, d, w, tau=0.5, noise=noise, batch=b),
            lambda a, c, d: fd.sharded_kernelized_gumbel_softmax(a, c, d, w, tau=0.5, noise=noise[..., start:stop],
                                                                 batch=lb, num_graphs=graphs),
            [q, k, v], start, stop, 6)
        for joint in (None, False):
            errors[f"sgformer/{name}/joint={joint}"] = _compare(
                lambda a, c, d: fast.sgformer_attention(a, c, d, batch=b, joint_heads=joint),
                lambda a, c, d: fd.sharded_sgformer_attention(a, c, d, batch=lb, num_graphs=graphs, joint_heads=joint),
                [q, k, v], start, stop, 7)
            errors[f"difformer/{name}/joint={joint}"] = _compare(
                lambda a, c, d: fast.difformer_attention(a, c, d, batch=b, joint_heads=joint),
                lambda a, c, d: fd.sharded_difformer_attention(a, c, d, batch=lb, num_graphs=graphs,
                                                               joint_heads=joint),
                [q, k, v], start, stop, 8)
    return errors


def widths_differ(rank: int, world: int, payload) -> None:
    """Rank 1 passes features of another width: every rank raises, none waits."""
    m = 4 if rank == 1 else 3
    fd.sharded_linear_attention(torch.rand(4, m), torch.rand(4, m), torch.rand(4, 2))


def on_rank(payload: dict):
    """verify.ranks' entry (it calls ``fn(payload)`` in each rank): the case named
    payload["case"], called as case(rank, world, payload["args"])."""
    import torch.distributed as dist

    return globals()[payload["case"]](dist.get_rank(), dist.get_world_size(), payload["args"])
