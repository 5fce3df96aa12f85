"""Node-sharded global attention of the graph transformers: NodeFormer's kernelized softmax and its
Gumbel form (wu22 Eqs. 5-7), SGFormer's and DIFFormer's simple attention, with the nodes of a
(PyG) batch of graphs cut into contiguous slices across ranks, so one graph may span ranks.

Each rank holds nodes [start, stop) of q, k, v and of ``batch`` (its nodes' GLOBAL graph ids,
sorted; None: all nodes are one graph). Every formula reads the keys only through per-graph sums
(a state per graph), so each rank sums its own nodes' share and one all-reduce adds the shares:
O(G H m d) bytes per rank for G graphs, whatever the number of nodes. NodeFormer's log-space
balance (the keys' maximum exponent per graph and feature) is one all-reduce max of a (..., G, m)
tensor before it; SGFormer's and DIFFormer's Frobenius norms and node counts ride in the one
all-reduce of their states. G is ``num_graphs`` when given (the same on every rank), else agreed
by an all-reduce max of the labels.
"""
from __future__ import annotations

import math

import torch

from fast.algebra import divide
from fast.batching import BatchIndex, check_batch
from fast.distributed.arguments import agreed, check_finite, check_slices, with_ones, work_dtype
from fast.distributed.collectives import all_reduce_max, all_reduce_sum, dtype_code
from fast.latent.nodeformer import check_tau, gumbel_noise
from fast.validation import raise_if_non_finite

__all__ = ["sharded_kernelized_softmax", "sharded_kernelized_gumbel_softmax", "sharded_sgformer_attention",
           "sharded_difformer_attention"]


def _check_local_batch(batch: object, n: int, num_graphs: int | None) -> torch.Tensor | None:
    """The local graph ids (n,) int64, sorted, >= 0 (< num_graphs when given), or None."""
    if num_graphs is not None and (isinstance(num_graphs, bool) or not isinstance(num_graphs, int) or num_graphs < 1):
        raise ValueError(f"num_graphs must be None or a positive int, got {num_graphs!r}")
    if batch is None:
        return None
    if not isinstance(batch, torch.Tensor) or batch.dtype.is_floating_point or batch.dtype == torch.bool:
        raise TypeError(f"batch must be an integer tensor (n_local,) of global graph ids, got {batch!r:.60}")
    if batch.dim() != 1 or batch.shape[0] != n:
        raise ValueError(f"batch must have shape (n_local,) = ({n},), got {tuple(batch.shape)}")
    b = batch.to(torch.int64)
    if n and (bool((b[1:] < b[:-1]).any()) or int(b.min()) < 0):
        raise ValueError("batch must hold sorted graph ids >= 0 (each graph's nodes contiguous; PyG convention)")
    if n and num_graphs is not None and int(b.max()) >= num_graphs:
        raise ValueError(f"batch labels must be < num_graphs = {num_graphs}, got {int(b.max())}")
    return b


def _graphs(batch: torch.Tensor | None, n: int, num_graphs: int | None, device, group,
            function: str) -> tuple[BatchIndex | None, int]:
    """(BatchIndex of the local nodes with G global graphs, or None when n = 0; G)."""
    if batch is None:
        g = 1
        batch = torch.zeros(n, dtype=torch.int64, device=device)
    elif num_graphs is None:
        top = torch.tensor([float(batch.max()) + 1 if n else 0.0], device=device)
        g = int(all_reduce_max(top, group, function)[0])
    else:
        g = num_graphs
    if n == 0:
        return None, max(g, 1)
    return check_batch(batch.to(device), n, num_graphs=max(g, 1)), max(g, 1)


def _per_graph(bi: BatchIndex | None, x: torch.Tensor, g: int) -> torch.Tensor:
    """sum over each graph's local nodes: (..., n, c) -> (..., G, c) (zeros without nodes)."""
    if bi is None:
        return x.new_zeros(*x.shape[:-2], g, x.shape[-1]) + 0 * x.sum()
    return bi.segment_sum(x)


def _outer(bi: BatchIndex | None, a: torch.Tensor, b: torch.Tensor, g: int) -> torch.Tensor:
    """sum over each graph's local nodes of a_u b_u^T: (..., G, m, c)."""
    if bi is None:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return a.new_zeros(*lead, g, a.shape[-1], b.shape[-1]) + 0 * (a.sum() + b.sum())
    return bi.segment_outer(a, b)


def _apply(bi: BatchIndex | None, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """row u = x_u^T state[graph(u)]: (..., n, c)."""
    if bi is None:
        lead = torch.broadcast_shapes(x.shape[:-2], state.shape[:-3])
        return x.new_zeros(*lead, 0, state.shape[-1]) + 0 * state.sum()
    return bi.apply_state(x, state)


def _to_nodes(bi: BatchIndex | None, y: torch.Tensor) -> torch.Tensor:
    """(..., G, c) -> (..., n, c)."""
    return y[..., :0, :] if bi is None else bi.gather(y)


def _sum_all(tensors: list[torch.Tensor], group, function: str) -> list[torch.Tensor]:
    """One all-reduce (sum) for several tensors: flattened, concatenated, split back."""
    flat = all_reduce_sum(torch.cat([t.reshape(-1) for t in tensors]), group, function)
    return [part.reshape(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def _validate_nodes(function, q, k, v, batch, num_graphs, extra: list[int], **named):
    def validate():
        check_slices(("q", "k", "v"), q, k, v, same_width=True)
        _check_local_batch(batch, q.shape[-2], num_graphs)
        check_finite(q=q, k=k, v=v, **named)
        lead = list(q.shape[:-2])
        return q.shape[-2], [len(lead), *lead, q.shape[-1], v.shape[-1], dtype_code(work_dtype(q, k, v)),
                             batch is None, -1 if num_graphs is None else num_graphs, *extra]
    return validate


def _kernelized(q, k, v, projection, tau, batch, num_graphs, group, function, noise=None) -> torch.Tensor:
    """wu22 Eq. 5 (noise None) or the mean over samples of Eq. 7, on the local nodes."""
    n = q.shape[-2]
    work = work_dtype(q, k, v)
    b = _check_local_batch(batch, n, num_graphs)
    bi, g = _graphs(b, n, num_graphs, q.device, group, function)
    s = projection.shape[1] ** -0.25 / math.sqrt(tau)
    wt = (projection.to(work) * s).T
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    zq = qw @ wt  # the queries' -|x|^2/2 cancels in every ratio
    zk = kw @ wt - (0.5 * s * s) * (kw * kw).sum(-1, keepdim=True)
    if noise is not None:  # (K, ..., n): g / tau in log space
        zk = zk.unsqueeze(0) + (noise.to(work) / tau).unsqueeze(-1)
    local = zk.new_full((*zk.shape[:-2], g, zk.shape[-1]), -torch.inf) if bi is None else \
        bi.segment_max(zk.detach())
    top = all_reduce_max(local, group, function)  # (..., G, m): the balance of every graph and feature
    c = _to_nodes(bi, top)
    phi_k = torch.exp(zk - c)
    zq = zq + c
    phi_q = torch.exp(zq - zq.detach().amax(-1, keepdim=True)) if n else zq
    v1 = with_ones(vw)
    if noise is not None:
        v1 = v1.expand(noise.shape[0], *v1.shape)
    state = all_reduce_sum(_outer(bi, phi_k, v1, g), group, function)
    nd = _apply(bi, phi_q, state)
    out = divide(nd[..., :-1], nd[..., -1])
    return (out.mean(0) if noise is not None else out).to(v.dtype)


def sharded_kernelized_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                               tau: float = 1.0, batch=None, num_graphs: int | None = None,
                               group: object = None) -> torch.Tensor:
    """This rank's rows of fast.kernelized_softmax(q, k, v, projection, tau=tau, batch=batch) on all
    ranks' nodes (wu22 Eq. 5), to round-off.

    q, k: (..., n_local, d_qk); v: (..., n_local, d); projection (m, d_qk), the same on every rank;
    batch: None (all nodes one graph) or the local nodes' global graph ids (n_local,), sorted (a graph
    may span ranks); num_graphs: G, or None (agreed by an all-reduce max). -> (..., n_local, d). Work
    O(n_local m d); bytes per rank O(G H m d) (one all-reduce max of (..., G, m), one all-reduce sum
    of (..., G, m, d + 1)). Raises RuntimeError (no process group), TypeError / ValueError naming the
    argument (the other ranks name the rank), DenominatorError for a refused denominator.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import kernelized_softmax
    >>> from fast.distributed import sharded_kernelized_softmax
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> q, k, v, w = torch.randn(4, 6, 4, dtype=torch.float64).unbind(0)
    >>> b = torch.tensor([0, 0, 0, 1, 1, 1])
    >>> bool(torch.allclose(sharded_kernelized_softmax(q, k, v, w, batch=b), kernelized_softmax(q, k, v, w, batch=b)))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_kernelized_softmax"

    def validate():
        tau_ok = check_tau(tau)
        _check_projection(projection, q)
        n, desc = _validate_nodes(function, q, k, v, batch, num_graphs, [], projection=projection)()
        return n, [*desc, *projection.shape, int(tau_ok * 1e6)]

    agreed(function, group, q, validate)
    return _kernelized(q, k, v, projection, check_tau(tau), batch, num_graphs, group, function)


def _check_projection(projection: object, q: torch.Tensor) -> None:
    if not isinstance(projection, torch.Tensor) or not projection.is_floating_point() or projection.dim() != 2 \
            or projection.shape[1] != q.shape[-1] or projection.shape[0] < 1:
        got = tuple(projection.shape) if isinstance(projection, torch.Tensor) else type(projection).__name__
        raise ValueError(f"projection must be a floating (m, d_qk) tensor with d_qk = {q.shape[-1]}, m >= 1, got {got}")


def sharded_kernelized_gumbel_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                                      tau: float = 0.25, samples: int | None = None, noise: torch.Tensor | None = None,
                                      generator: torch.Generator | None = None, training: bool = True, batch=None,
                                      num_graphs: int | None = None, group: object = None) -> torch.Tensor:
    """This rank's rows of fast.kernelized_gumbel_softmax on all ranks' nodes (wu22 Eqs. 6-7).

    The Gumbel noise is per key node: pass ``noise`` (K, *k.shape[:-1]), this rank's slice (along
    the node axis) of the noise one process would use, and the result equals that process's to
    round-off; or a ``generator`` (K = samples, default 10) seeded differently on each rank, which
    draws this rank's slice (fast.gumbel_noise): a valid sample, though not one process's.
    training=False: sharded_kernelized_softmax at the same tau. Shapes, batch, num_graphs, cost
    (K times) and errors as sharded_kernelized_softmax; ValueError naming noise for a wrong shape.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import gumbel_noise, kernelized_gumbel_softmax
    >>> from fast.distributed import sharded_kernelized_gumbel_softmax
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> q, k, v, w = torch.randn(4, 6, 4, dtype=torch.float64).unbind(0)
    >>> g = gumbel_noise((2, 6), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    >>> out = sharded_kernelized_gumbel_softmax(q, k, v, w, tau=0.5, noise=g)
    >>> bool(torch.allclose(out, kernelized_gumbel_softmax(q, k, v, w, tau=0.5, noise=g)))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_kernelized_gumbel_softmax"
    if not training:
        if noise is not None:
            raise ValueError("noise was given with training=False: evaluation mode uses no Gumbel noise")
        return sharded_kernelized_softmax(q, k, v, projection, tau=tau, batch=batch, num_graphs=num_graphs,
                                          group=group)
    if noise is None:
        count = 10 if samples is None else samples
        noise = gumbel_noise((count, *k.shape[:-1]), generator=generator, device=k.device,
                             dtype=work_dtype(q, k))

    def validate():
        tau_ok = check_tau(tau)
        _check_projection(projection, q)
        if not isinstance(noise, torch.Tensor) or tuple(noise.shape[1:]) != tuple(k.shape[:-1]) or noise.dim() < 2 \
                or (samples is not None and noise.shape[0] != samples):
            got = tuple(noise.shape) if isinstance(noise, torch.Tensor) else type(noise).__name__
            raise ValueError(f"noise must have shape (K, *k.shape[:-1]) = (K, {', '.join(map(str, k.shape[:-1]))}) "
                             f"(this rank's slice of the nodes), got {got}")
        n, desc = _validate_nodes(function, q, k, v, batch, num_graphs, [], projection=projection, noise=noise)()
        return n, [*desc, *projection.shape, noise.shape[0], int(tau_ok * 1e6)]

    agreed(function, group, q, validate)
    return _kernelized(q, k, v, projection, check_tau(tau), batch, num_graphs, group, function, noise=noise)


def _simple(q, k, v, batch, num_graphs, joint_heads, own_value: bool, group, function: str) -> torch.Tensor:
    """SGFormer (own_value) / DIFFormer on the local nodes: per graph the sums of squares of q and k,
    the state k^T [v | 1], the value sum and the node count, all in one all-reduce."""
    if not (joint_heads is None or isinstance(joint_heads, bool)):
        raise TypeError(f"joint_heads must be None, True or False, got {joint_heads!r}")
    joint = q.dim() >= 4 if joint_heads is None else (joint_heads and q.dim() >= 3)
    n = q.shape[-2]
    work = work_dtype(q, k, v)
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    b = _check_local_batch(batch, n, num_graphs)
    bi, g = _graphs(b, n, num_graphs, q.device, group, function)

    def sumsq(x):
        s = _per_graph(bi, (x * x).sum(-1, keepdim=True), g)  # (..., G, 1)
        return s.sum(-3, keepdim=True) if joint else s

    ones = torch.ones_like(vw[..., :1])
    parts = [sumsq(qw), sumsq(kw), _outer(bi, kw, with_ones(vw), g), _per_graph(bi, vw, g), _per_graph(bi, ones, g)]
    ssq, ssk, state, vsum, count = _sum_all(parts, group, function)
    both = ssq * ssk
    # a graph whose q (or k) is all zero: q~ = 0, as one process gives (never rsqrt(0) = inf)
    positive = both > 0
    scale = torch.where(positive, torch.rsqrt(torch.where(positive, both, torch.ones_like(both))), torch.zeros_like(both))
    nd = _apply(bi, qw, state * scale.unsqueeze(-1))  # q~_u^T [sum k~ v^T | sum k~]
    count_n = _to_nodes(bi, count)  # (..., n, 1)
    const = count_n * vw if own_value else _to_nodes(bi, vsum)
    out = divide(nd[..., :-1] + const, nd[..., -1] + count_n[..., 0])
    return out.to(v.dtype)


def sharded_difformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batch=None,
                                num_graphs: int | None = None, joint_heads: bool | None = None,
                                group: object = None) -> torch.Tensor:
    """This rank's rows of fast.difformer_attention(q, k, v, batch=batch, joint_heads=joint_heads) on
    all ranks' nodes, to round-off:

        z_u = (sum_{v in g} v_v + q~_u^T sum_{v in g} k~_v v_v^T) / (N_g + q~_u^T sum_{w in g} k~_w),

    q~, k~ normalised by each graph's Frobenius norm over all ranks. q, k: (..., n_local, d_qk); v:
    (..., n_local, d) -> (..., n_local, d); batch and num_graphs as sharded_kernelized_softmax. Work
    O(n_local d_qk d); bytes per rank O(G H d_qk d) in one all-reduce. Raises RuntimeError (no
    process group), TypeError / ValueError naming the argument, DenominatorError.

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import difformer_attention
    >>> from fast.distributed import sharded_difformer_attention
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> q, k, v = torch.randn(3, 5, 4, dtype=torch.float64).unbind(0)
    >>> bool(torch.allclose(sharded_difformer_attention(q, k, v), difformer_attention(q, k, v)))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_difformer_attention"
    agreed(function, group, q, _validate_nodes(function, q, k, v, batch, num_graphs, [joint_heads is True]))
    return _simple(q, k, v, batch, num_graphs, joint_heads, False, group, function)


def sharded_sgformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batch=None,
                               num_graphs: int | None = None, joint_heads: bool | None = None,
                               group: object = None) -> torch.Tensor:
    """This rank's rows of fast.sgformer_attention on all ranks' nodes, to round-off: DIFFormer's
    formula with N_g v_u in place of the value sum (sharded_difformer_attention, which states the
    shapes, cost, communication and errors).

    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from fast import sgformer_attention
    >>> from fast.distributed import sharded_sgformer_attention
    >>> store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> q, k, v = torch.randn(3, 5, 4, dtype=torch.float64).unbind(0)
    >>> bool(torch.allclose(sharded_sgformer_attention(q, k, v), sgformer_attention(q, k, v)))
    True
    >>> dist.destroy_process_group()
    """
    function = "sharded_sgformer_attention"
    agreed(function, group, q, _validate_nodes(function, q, k, v, batch, num_graphs, [joint_heads is True]))
    return _simple(q, k, v, batch, num_graphs, joint_heads, True, group, function)
