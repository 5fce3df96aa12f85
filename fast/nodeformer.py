"""NodeFormer (wu22): kernelized softmax / Gumbel-softmax message passing, relational bias, edge loss.

Shapes: q, k (..., N, d_qk); v (..., N, d); leading dims (batch, heads) are independent slices
and q, k, v share them. projection W (m, d_qk), m >= 1 (fast.gaussian_projection). Several
graphs concatenated along N carry a PyG batch vector ``batch`` (N,) (fast.batching.check_batch:
sorted, each graph's nodes contiguous): no output of one graph ever depends on another graph's
inputs. Without a batch vector the N nodes are one graph (every node attends to every node).

Kernel scaling (NodeFormer's code, the driver's convention): FAVOR+ features (wu22 Eq. 4) of
x = q d_qk^(-1/4) / sqrt(tau) (k likewise), so phi(q_u) . phi(k_v) estimates
kappa(q_u, k_v) = exp(q_u . k_v / (sqrt(d_qk) tau)); tau = 1 is plain Eq. 5. The paper writes
exp(q.k / tau) without the sqrt(d_qk) (docs/papers.md).

Log space (how small tau never overflows). The FAVOR+ exponents are z_uf = w_f . x_u - |x_u|^2/2
(the 1/sqrt(m) cancels in every ratio here). Gumbel noise enters the keys' exponents as
z_vf + g_v / tau (Eq. 7: exp(g_v / tau) phi(k_v), folded in log space BEFORE any exp), and the
features handed to the driver are balanced per (sample, slice, graph, feature f):

    C_f   = max_{v in graph} (z_vf + g_v / tau)                (detached constants)
    phi_k_vf = exp(z_vf + g_v / tau - C_f)          in (0, 1], each column's max exactly 1
    phi_q_uf = exp(zq_uf + C_f - max_f' (zq_uf' + C_f'))   in (0, 1], each row's max exactly 1

phi_q_u . phi_k_v = exp(zq_u + zk_v + g_v/tau) times one positive constant per query, which
cancels in the ratio. With f* the feature of query u's largest entry (phi_q_uf* = 1) and the
graph's key of largest z_vf* + g_v/tau (phi_k_vf* = 1), every denominator is >= 1 in these
units: it can neither overflow nor underflow, whatever tau (1e-3, 1e-6) or the sizes of q, k;
no exp of a positive number is ever taken. A feature whose entry underflows to 0 is one below
2^-126 (float32) of its row's or column's largest, negligible next to the term that is 1.
The driver is fast.masked_linear_attention (Algorithm 1 and its denominator guard, never
re-implemented here) with mask None (one graph: two GEMMs, O(N m d)); with a batch vector of
G <= fast.batching.SMALL_GRAPH_COUNT (64) graphs, a block-diagonal operator whose ``attend`` runs
the two GEMMs on each graph's contiguous slice (as fast as one graph); with more graphs
fast.PackingMask(batch) (segment sums through the driver's generic path, ~10x slower, same
memory). Without noise this is fast.favor_attention(q / sqrt(tau), k / sqrt(tau), v, W,
mask=PackingMask(batch)) up to round-off (tested). fast.favor_attention's own stabiliser is one
constant per key (fast.features.favor_exponentials' key_stabilizer hook), which cannot see the
queries' exponents: the per-feature balance above needs both, so the exponents are formed here
(one GEMM each, as favor_exponentials) and exponentiated once.

Noise: g = -log(-log U), U ~ Uniform(0, 1) clamped into [tiny, 1 - eps/2] (g finite, in about
[-4.5, 16.6] in float32), shape (K, *k.shape[:-1]): one per sample, leading slice and KEY node,
shared by all queries (that keeps Eq. 7 linear). The Gumbel output is the MEAN over the K samples
of the K normalised outputs (NodeFormer's code). Global RNG state is never read or advanced:
noise comes from ``generator`` (a torch.Generator) or a fresh OS-seeded one, or is passed in.

Memory: the K samples are an extra leading dim, so the Gumbel mechanism holds (and saves for
backward) O(K N m) features, plus the driver's O(N (m + d)) per sample; edge terms are formed in
bounded edge blocks (nothing of size E m is kept).

Host reads: the driver's one read per call; check_batch one; a batch with a graph adds one
(edges must stay inside their graph); given noise one (its finiteness).
"""
from __future__ import annotations

import math
import numbers

import torch

from fast.algebra import linear_products
from fast.attention import masked_linear_attention
from fast.batching import SMALL_GRAPH_COUNT, BatchIndex, check_batch
from fast.graphs import Graph, as_graph
from fast.masks.base import SymmetricMaskOperator
from fast.masks.explicit import SparseMask
from fast.masks.sequence import PackingMask
from fast.validation import check_same_device, check_tensor, compute_dtype, raise_if_non_finite

__all__ = ["gumbel_noise", "kernelized_softmax", "kernelized_gumbel_softmax", "adjacency_orders", "relational_bias",
           "nodeformer_attention", "kernelized_attention_rows", "edge_log_likelihood", "edge_loss"]

#: edge_log_likelihood forms its (..., B, m) per-edge terms in edge blocks of at most about this
#: many entries (forward and backward; nothing of size E m is kept for backward).
EDGE_BLOCK_ELEMENTS = 1 << 22
#: kernelized_attention_rows forms its (..., R, B, m) log-kernel terms in key blocks of at most
#: about this many entries.
ROWS_BLOCK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------- argument checks

def _check_tau(tau: object) -> float:
    if isinstance(tau, torch.Tensor) and tau.numel() == 1 and tau.dtype.is_floating_point:
        tau = float(tau.detach())
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(float(tau)) or tau <= 0:
        raise ValueError(f"tau must be a finite number > 0 (the temperature: the kernel is exp(q.k / (sqrt(d) tau))), "
                         f"got {tau!r}")
    return float(tau)


def _check_samples(samples: object) -> int:
    if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 1:
        raise ValueError(f"samples must be an int >= 1 (the number K of Gumbel samples averaged), got {samples!r}")
    return int(samples)


def _check_order(order: object) -> int:
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 1:
        raise ValueError(f"order must be an int >= 1 (the highest adjacency order A^order of the relational bias), "
                         f"got {order!r}")
    return int(order)


def _check_qk(q: object, k: object, projection: object) -> None:
    """Shapes, dtypes and devices of q, k and the projection (metadata only)."""
    check_tensor("q", q, check_finite=False)
    check_tensor("k", k, check_finite=False)
    if not isinstance(projection, torch.Tensor):
        raise TypeError(f"projection must be a torch.Tensor (m, d_qk), got {type(projection).__name__}")
    if not projection.is_floating_point() or projection.is_complex():
        raise TypeError(f"projection must be a real floating tensor, got {projection.dtype}")
    if projection.dim() != 2:
        raise ValueError(f"projection must have shape (m, d_qk), got {tuple(projection.shape)}")
    if projection.shape[0] < 1:
        raise ValueError(f"projection must have m >= 1 rows (random features), got shape {tuple(projection.shape)}")
    check_same_device(q=q, k=k, projection=projection)
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] != projection.shape[1]:
            raise ValueError(f"{name} has feature width {x.shape[-1]} but projection expects d_qk = "
                             f"{projection.shape[1]} (projection is (m, d_qk) = {tuple(projection.shape)})")
    if q.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"q and k must have the same shape (..., N, d_qk) up to d_qk (self-attention over the N "
                         f"nodes), got {tuple(q.shape)} and {tuple(k.shape)}")


def _check_v(v: object, k: torch.Tensor) -> None:
    check_tensor("v", v, check_finite=False)
    check_same_device(k=k, v=v)
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k (..., N, d_qk) and v (..., N, d) must share leading dims and N, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")


def _graph_of(graph: object, n: int, device: torch.device, batch: BatchIndex | None) -> Graph:
    """as_graph(graph, n=N) on ``device`` (edge indices out of [0, N): as_graph's ValueError), and, with a
    batch vector, every edge inside one graph (ValueError naming graph and batch otherwise)."""
    g = as_graph(graph, n=n, name="graph")
    g = g.to(device)
    if batch is not None and g.num_edges:
        index = batch.index.to(device)
        cross = index[g.row] != index[g.col]
        if bool(cross.any()):
            e = int(torch.nonzero(cross)[0, 0])
            u, w = int(g.row[e]), int(g.col[e])
            raise ValueError(f"graph has an edge ({u}, {w}) between two graphs of the batch (batch[{u}] = "
                             f"{int(index[u])}, batch[{w}] = {int(index[w])}): edges must join nodes of one graph")
    return g


# ---------------------------------------------------------------------------- noise

def gumbel_noise(shape, *, generator: torch.Generator | None = None, device=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log U), U ~ Uniform(0, 1), of ``shape`` (wu22 Eqs. 6, 14).

    U is drawn from ``generator`` (a torch.Generator; None: a fresh OS-seeded one; torch's global
    RNG is never read or advanced) on the generator's device in float64 (float32 for float32 and
    half precisions), clamped into [tiny, 1 - eps/2] so that g is always finite, then moved to
    ``device`` (default the generator's) and cast to ``dtype``. For kernelized_gumbel_softmax
    the shape is (K, *k.shape[:-1]) = (K, ..., N): one per sample, leading slice and key node.
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None (e.g. torch.Generator().manual_seed(seed)), "
                        f"got {type(generator).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a real floating torch.dtype, got {dtype!r}")
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"shape must have sizes >= 0, got {shape}")
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=draw)
    info = torch.finfo(draw)
    u = u.clamp_(min=info.tiny, max=1.0 - info.eps / 2)
    g = u.log_().neg_().log_().neg_()
    return g.to(device=device if device is not None else g.device, dtype=dtype)


def _check_noise(noise: object, k: torch.Tensor, samples: int | None) -> torch.Tensor:
    if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
        got = noise.dtype if isinstance(noise, torch.Tensor) else type(noise).__name__
        raise TypeError(f"noise must be a floating tensor (K, *k.shape[:-1]) of Gumbel samples, got {got}")
    want = tuple(k.shape[:-1])
    if noise.dim() != len(want) + 1 or tuple(noise.shape[1:]) != want or noise.shape[0] < 1:
        raise ValueError(f"noise must have shape (K, *k.shape[:-1]) = (K, {', '.join(map(str, want))}) with K >= 1 "
                         f"(one per sample, leading slice and key node), got {tuple(noise.shape)}")
    if samples is not None and samples != noise.shape[0]:
        raise ValueError(f"samples = {samples} disagrees with noise's K = {noise.shape[0]} samples (leave samples "
                         f"None when passing noise)")
    if noise.device != k.device:
        raise ValueError(f"noise must be on k's device {k.device}, got {noise.device}")
    if not bool(torch.isfinite(noise).all()):
        raise ValueError("noise contains non-finite values (NaN or inf)")
    return noise


# ---------------------------------------------------------------------------- the exponents

def _exponents(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor,
               tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FAVOR+ exponents z = w . x - |x|^2/2 of x = q d^(-1/4) / sqrt(tau) (k likewise): (..., N, m) each,
    in the compute dtype. The scale folds into W and the norm term (q and k are never rescaled)."""
    work = compute_dtype(torch.promote_types(q.dtype, k.dtype))
    q, k = q.to(work), k.to(work)
    d = projection.shape[1]
    s = d ** -0.25 / math.sqrt(tau)
    w = projection.to(work) * s
    half = 0.5 * s * s
    zq = q @ w.T - half * q.square().sum(-1, keepdim=True)
    zk = k @ w.T - half * k.square().sum(-1, keepdim=True)
    return zq, zk


def _key_max(zk: torch.Tensor, batch: BatchIndex | None) -> torch.Tensor:
    """Per-(slice, graph, feature) max of the key exponents, gathered back to the nodes: (..., N, m)
    (or (..., 1, m) for one graph); detached."""
    zk = zk.detach()
    if batch is None:
        return zk.amax(-2, keepdim=True)
    return batch.gather(batch.segment_max(zk))


def _balanced_features(zq: torch.Tensor, zk: torch.Tensor,
                       batch: BatchIndex | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi_q, phi_k) in (0, 1] balanced per (slice, graph, feature) (module doc): every denominator >= 1."""
    c = _key_max(zk, batch)
    phi_k = torch.exp(zk - c)
    zq = zq + c
    phi_q = torch.exp(zq - zq.detach().amax(-1, keepdim=True))
    return phi_q, phi_k


class _GraphBlocks(SymmetricMaskOperator):
    """M_uv = 1 if batch[u] == batch[v], for a SORTED batch vector with few graphs: its ``attend``
    is unmasked linear attention on each graph's contiguous slice (two GEMMs per graph, through
    fast.algebra.linear_products: O(N (m + d)) saved under autograd), ~10x faster than
    PackingMask's generic segment-sum path. matmul (for the driver's rare paths) is the segment
    sum gathered back."""

    nonnegative = True

    def __init__(self, batch: BatchIndex):
        self.n = batch.n
        self.batch = batch

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        b = self.batch.to(x.device)
        return b.gather(b.segment_sum(x))

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ptr = self.batch.host_ptr()
        nums, dens = [], []
        for s, e in zip(ptr[:-1], ptr[1:]):
            if e > s:
                num, den, _ = linear_products(phi_q[..., s:e, :], phi_k[..., s:e, :], v[..., s:e, :])
                nums.append(num)
                dens.append(den)
        return torch.cat(nums, -2), torch.cat(dens, -1)


def _drive(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, batch: BatchIndex | None,
           names: dict) -> torch.Tensor:
    """fast.masked_linear_attention on the balanced features; mask None (one graph), the per-graph
    slices (_GraphBlocks, G <= fast.batching.SMALL_GRAPH_COUNT) or fast.PackingMask(batch) (more
    graphs: segment sums). A non-finite input is reported by its own name (q, k, v, projection),
    not as phi_q / phi_k."""
    if batch is None:
        mask = None
    elif batch.num_graphs <= SMALL_GRAPH_COUNT:
        mask = _GraphBlocks(batch)
    else:
        mask = PackingMask(batch.index.to(phi_k.device))
    try:
        return masked_linear_attention(phi_q, phi_k, v, mask, features_nonnegative=True)
    except ValueError as exc:
        if "non-finite" in str(exc):
            raise_if_non_finite(**names)
        raise


def _prepare(q, k, v, projection, tau, batch):
    _check_qk(q, k, projection)
    _check_v(v, k)
    tau = _check_tau(tau)
    b = check_batch(batch, q.shape[-2], device=q.device)
    return tau, b


# ---------------------------------------------------------------------------- attention

def kernelized_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                       tau: float = 1.0, batch=None) -> torch.Tensor:
    """Kernelized softmax message passing (wu22 Eq. 5), all-pair within each graph, O(N m d).

        z_u = sum_v kappa~(q_u, k_v) v_v / sum_w kappa~(q_u, k_w),
        kappa~(q, k) = phi(q d^-1/4 / sqrt(tau)) . phi(k d^-1/4 / sqrt(tau)) ~ exp(q.k / (sqrt(d_qk) tau))

    q, k: (..., N, d_qk); v: (..., N, d); projection (m, d_qk) -> (..., N, d) in v's dtype (half
    precisions compute in float32). tau: finite > 0 (the 1/sqrt(tau) scaling of Eqs. 14-17; 1
    gives Eq. 5 as printed). batch: None or a PyG batch vector (N,): sums run over u's graph only.
    Log-space balanced features (module doc): no overflow or underflow of the denominator for any
    tau. Differentiable in q, k, v (and the projection).
    Errors: ValueError naming tau, batch, q/k/v/projection (shapes; NaN or inf), projection with
    m < 1 rows; fast.DenominatorError only from the driver's guard (cannot trigger on finite input).
    """
    tau, b = _prepare(q, k, v, projection, tau, batch)
    zq, zk = _exponents(q, k, projection, tau)
    phi_q, phi_k = _balanced_features(zq, zk, b)
    return _drive(phi_q, phi_k, v, b, dict(q=q, k=k, v=v, projection=projection))


def kernelized_gumbel_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                              tau: float = 0.25, samples: int | None = None, noise: torch.Tensor | None = None,
                              generator: torch.Generator | None = None, training: bool = True,
                              batch=None) -> torch.Tensor:
    """Kernelized Gumbel-softmax message passing (wu22 Eqs. 6-7, 14-17), O(K N m d).

    Sample s (Eq. 7): z_u^(s) = sum_v kappa~(q_u, k_v) e^(g_sv / tau) v_v / sum_w kappa~(q_u, k_w) e^(g_sw / tau),
    kappa~ at the 1/sqrt(tau) scaling (kernelized_softmax), g_sv standard Gumbel noise per key
    node (shared by all queries: Eq. 7 stays linear). Output: the mean over the K samples of the
    normalised z^(s) (NodeFormer's code; the ratio is a biased estimate of Eq. 6's expectation).
    e^(g/tau) is folded into the keys' exponents in log space (module doc): finite for any tau > 0.

    q, k: (..., N, d_qk); v: (..., N, d); projection (m, d_qk) -> (..., N, d).
    training=True: noise as given (shape (K, *k.shape[:-1]), K = noise.shape[0]; ``samples`` must
    then be None or K) or drawn by gumbel_noise from ``generator`` (samples: K, default 10).
    training=False: no noise, the kernelized softmax at the same tau (evaluation mode); passing
    noise then is a ValueError. The samples are stacked as an extra leading dim K internally.
    Errors: ValueError naming tau, samples, noise (shape, NaN, given in eval mode), batch, or
    q/k/v/projection (shapes; NaN or inf).
    """
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__}")
    if samples is not None:
        samples = _check_samples(samples)
    tau, b = _prepare(q, k, v, projection, tau, batch)
    if not training:
        if noise is not None:
            raise ValueError("noise was given with training=False: evaluation mode uses no Gumbel noise (the "
                             "kernelized softmax at the same tau); pass training=True to use the noise")
        zq, zk = _exponents(q, k, projection, tau)
        phi_q, phi_k = _balanced_features(zq, zk, b)
        return _drive(phi_q, phi_k, v, b, dict(q=q, k=k, v=v, projection=projection))
    if noise is None:
        noise = gumbel_noise((10 if samples is None else samples, *k.shape[:-1]), generator=generator,
                             device=k.device, dtype=torch.float64)
    else:
        noise = _check_noise(noise, k, samples)
    zq, zk = _exponents(q, k, projection, tau)
    zk = zk.unsqueeze(0) + (noise.to(zk.dtype) / tau).unsqueeze(-1)  # (K, ..., N, m): log space
    zq = zq.unsqueeze(0)
    phi_q, phi_k = _balanced_features(zq, zk, b)
    vk = v.unsqueeze(0).expand(noise.shape[0], *v.shape)
    out = _drive(phi_q, phi_k, vk, b, dict(q=q, k=k, v=v, projection=projection))
    return out.mean(0)


# ---------------------------------------------------------------------------- relational bias

def adjacency_orders(graph: object, order: int, *, n: int | None = None) -> list[Graph]:
    """[A_1, ..., A_order]: the 0/1 patterns of A^r (wu22 Eq. 8's higher-order adjacency), as fast.Graphs.

    A_1 is the pattern of the (symmetric) input graph with unit weights, self-loops as given;
    A_r is the pattern of A_1^r: (u, v) stored where some walk of exactly r hops joins u to v
    (so A_2 has a self-loop at every node with a neighbour: u -> w -> u). graph: anything
    fast.as_graph accepts; n: the node count (edge indices out of [0, n): as_graph's ValueError).
    order: int >= 1. Sparse products (torch.sparse.mm), O(sum_r nnz(A_r) * max degree).
    """
    order = _check_order(order)
    g = as_graph(graph, n=n, name="graph") if n is not None else as_graph(graph, name="graph")
    return _orders(g, order)


def _pattern(g: Graph) -> Graph:
    return Graph(g.n, g.crow, g.col, torch.ones_like(g.weight))


def _orders(g: Graph, order: int) -> list[Graph]:
    a1 = _pattern(g)
    out = [a1]
    if order == 1:
        return out
    n = g.n
    idx = torch.stack([a1.row, a1.col])
    a = torch.sparse_coo_tensor(idx, a1.weight, (n, n)).coalesce()
    p = a
    for _ in range(order - 1):
        p = torch.sparse.mm(p, a).coalesce()
        keep = p.values() > 0
        pi = p.indices()[:, keep]
        p = torch.sparse_coo_tensor(pi, torch.ones(pi.shape[1], dtype=torch.float64, device=pi.device),
                                    (n, n)).coalesce()
        out.append(_pattern(as_graph(p.indices(), n=n, name="graph")))
    return out


def _check_normalize(normalize: object) -> str | None:
    if normalize is not None and normalize != "sym":
        raise ValueError(f'normalize must be "sym" (D^-1/2 A D^-1/2, NodeFormer\'s code) or None (raw A, Eq. 8 as '
                         f"printed), got {normalize!r}")
    return normalize


def _check_bias(b: object, order: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """b as a (order,) tensor (a float or 0-dim tensor is shared by all orders); gradients kept."""
    if isinstance(b, torch.Tensor):
        if not b.is_floating_point():
            raise TypeError(f"b must be a float, a floating 0-dim tensor or a tensor of shape (order,), got {b.dtype}")
        if b.dim() == 0:
            bt = b.reshape(1).expand(order)
        elif b.shape == (order,):
            bt = b
        else:
            raise ValueError(f"b must be a float, a 0-dim tensor or a tensor of shape (order,) = ({order},), got "
                             f"shape {tuple(b.shape)}")
        if not bool(torch.isfinite(b.detach()).all()):
            raise ValueError("b contains non-finite values (NaN or inf)")
        return bt.to(device=device, dtype=dtype)
    if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(float(b)):
        raise ValueError(f"b must be a finite float, a 0-dim tensor or a tensor of shape (order,), got {b!r}")
    return torch.full((order,), float(b), device=device, dtype=dtype)


def relational_bias(v: torch.Tensor, graph: object, b, *, order: int = 1, normalize: str | None = "sym",
                    batch=None) -> torch.Tensor:
    """The relational-bias term of wu22 Eq. 8: sum_{r=1..order} sigmoid(b_r) A~_r v, O(order E d).

    v: (..., N, d) -> (..., N, d). graph: anything fast.as_graph accepts, for N = v.shape[-2]
    nodes (out-of-range indices: ValueError). A_r: adjacency_orders' 0/1 patterns (unit weights).
    normalize="sym": A~_r = D_r^-1/2 A_r D_r^-1/2 with D_r the row sums of A_r (NodeFormer's
    code; isolated rows stay 0); None: A~_r = A_r (Eq. 8 as printed). b: a float or 0-dim tensor
    (one bias for every order) or a tensor of shape (order,); learnable (gradients reach b and v).
    batch: optional PyG batch vector, only to check that no edge joins two graphs.
    """
    check_tensor("v", v, check_finite=False)
    order = _check_order(order)
    normalize = _check_normalize(normalize)
    n = v.shape[-2]
    bi = check_batch(batch, n, device=v.device)
    g = _graph_of(graph, n, v.device, bi)
    return _bias(v, g, b, order, normalize)


def _bias(v: torch.Tensor, g: Graph, b, order: int, normalize: str | None) -> torch.Tensor:
    work = compute_dtype(v.dtype)
    bt = _check_bias(b, order, v.device, work)
    gates = torch.sigmoid(bt)
    out = None
    for r, a in enumerate(_orders(g, order)):
        w = a.weight
        if normalize == "sym":
            inv = a.weighted_degree.clamp(min=1.0).rsqrt()  # isolated rows have no entries: their 0 stays
            w = inv[a.row] * w * inv[a.col]
        csr = a.csr(torch.float64, values=w)
        term = SparseMask(csr, name="graph").matmul(v.to(work))
        term = gates[r] * term
        out = term if out is None else out + term
    return out.to(v.dtype)


def nodeformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                         graph: object = None, b=None, order: int = 1, normalize: str | None = "sym",
                         tau: float = 0.25, samples: int | None = None, noise: torch.Tensor | None = None,
                         generator: torch.Generator | None = None, training: bool = True, gumbel: bool = True,
                         batch=None) -> torch.Tensor:
    """One NodeFormer message-passing step (wu22 Eq. 8): kernelized (Gumbel-)softmax + relational bias.

        out_u = z_u + sum_{r=1..order} sigmoid(b_r) (A~_r v)_u

    z: kernelized_gumbel_softmax (gumbel=True; noise in training, none in evaluation) or
    kernelized_softmax (gumbel=False), at temperature tau; the bias term (relational_bias) only
    when ``graph`` is given, and then b is required. q, k: (..., N, d_qk); v: (..., N, d);
    projection (m, d_qk) -> (..., N, d). batch: PyG batch vector (graphs never mix; edges must
    stay inside one graph). Errors as the parts'.
    """
    if not isinstance(gumbel, bool):
        raise TypeError(f"gumbel must be a bool, got {type(gumbel).__name__}")
    if graph is None and b is not None:
        raise ValueError("b was given without graph: the relational bias needs the input graph")
    if graph is not None and b is None:
        raise ValueError("graph was given without b: the relational bias sigmoid(b) A v needs b (a float, 0-dim "
                         "tensor or (order,) tensor)")
    order = _check_order(order)
    normalize = _check_normalize(normalize)
    if gumbel:
        z = kernelized_gumbel_softmax(q, k, v, projection, tau=tau, samples=samples, noise=noise,
                                      generator=generator, training=training, batch=batch)
    else:
        if noise is not None:
            raise ValueError("noise was given with gumbel=False (the plain kernelized softmax uses no noise)")
        z = kernelized_softmax(q, k, v, projection, tau=tau, batch=batch)
    if graph is None:
        return z
    bi = check_batch(batch, v.shape[-2], device=v.device)
    g = _graph_of(graph, v.shape[-2], v.device, bi)
    return z + _bias(v, g, b, order, normalize)


# ---------------------------------------------------------------------------- latent graph and edge loss

def _log_key_sums(zk: torch.Tensor, batch: BatchIndex | None) -> torch.Tensor:
    """LSE_{w in graph(u)} zk_wf gathered to the nodes (..., N, m) (or (..., 1, m) for one graph)."""
    c = _key_max(zk, batch)
    e = torch.exp(zk - c)
    if batch is None:
        return e.sum(-2, keepdim=True).log() + c
    return batch.gather(batch.segment_sum(e)).log() + c


class _EdgeLogSumExp(torch.autograd.Function):
    """out_e = LSE_f(zq[u_e, f] + zk[w_e, f]) for edges (u_e, w_e): zq, zk (..., N, m) -> (..., E).

    Formed in edge blocks of bounded size (EDGE_BLOCK_ELEMENTS); saves zq, zk and out only (never
    an (..., E, m) tensor), so edge_log_likelihood's memory is O(N m + E) forward and backward.
    Backward: with p_ef = exp(zq_uf + zk_wf - out_e) (the softmax over f), d zq_u = sum_{e: u_e = u} g_e p_e
    and d zk_w = sum_{e: w_e = w} g_e p_e, in the same blocks. Once differentiable."""

    @staticmethod
    def forward(ctx, zq, zk, u, w, block):
        outs = []
        for s in range(0, u.numel(), block):
            t = zq.index_select(-2, u[s:s + block]) + zk.index_select(-2, w[s:s + block])
            outs.append(torch.logsumexp(t, -1))
        out = torch.cat(outs, -1) if outs else zq.new_zeros((*zq.shape[:-2], 0))
        ctx.save_for_backward(zq, zk, u, w, out)
        ctx.block = block
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        zq, zk, u, w, out = ctx.saved_tensors
        dq, dk = torch.zeros_like(zq), torch.zeros_like(zk)
        for s in range(0, u.numel(), ctx.block):
            us, ws = u[s:s + ctx.block], w[s:s + ctx.block]
            t = zq.index_select(-2, us) + zk.index_select(-2, ws)
            p = t.sub_(out[..., s:s + ctx.block].unsqueeze(-1)).exp_().mul_(g[..., s:s + ctx.block].unsqueeze(-1))
            dq.index_add_(-2, us, p)
            dk.index_add_(-2, ws, p)
        return dq, dk, None, None, None


def kernelized_attention_rows(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, rows, *,
                              tau: float = 1.0, batch=None) -> torch.Tensor:
    """The learned latent graph's weights pi_uv for the queries u in ``rows`` (wu22 Eq. 5's weights).

        pi_uv = phi(q_u) . phi(k_v) / (phi(q_u) . sum_{w in graph(u)} phi(k_w))   (v in graph(u); 0 outside)

    at the 1/sqrt(tau) scaling (kernelized_softmax; no Gumbel noise), formed in log space:
    log pi_uv = LSE_f(zq_uf + zk_vf) - LSE_f(zq_uf + LSE_{w in graph(u)} zk_wf).
    q, k: (..., N, d_qk); rows: int tensor / sequence (R,) of node ids in [0, N) -> (..., R, N),
    each row summing to 1 over its graph. O(R N m), in key blocks of bounded memory. For heatmaps.
    """
    _check_qk(q, k, projection)
    tau = _check_tau(tau)
    n = q.shape[-2]
    b = check_batch(batch, n, device=q.device)
    rows_t = torch.as_tensor(rows, device=q.device) if not isinstance(rows, torch.Tensor) else rows.to(q.device)
    if rows_t.dtype.is_floating_point or rows_t.dtype == torch.bool or rows_t.dim() != 1:
        raise TypeError(f"rows must be a 1-D integer tensor or sequence of node ids, got {rows_t.dtype} of shape "
                        f"{tuple(rows_t.shape)}")
    rows_t = rows_t.to(torch.int64)
    if rows_t.numel() and (int(rows_t.min()) < 0 or int(rows_t.max()) >= n):
        raise ValueError(f"rows must be node ids in [0, N = {n}), got values in [{int(rows_t.min())}, "
                         f"{int(rows_t.max())}]")
    zq, zk = _exponents(q, k, projection, tau)
    lk = _log_key_sums(zk, b)
    zr = zq.index_select(-2, rows_t)  # (..., R, m)
    lk_r = lk if b is None else lk.index_select(-2, rows_t)
    log_den = torch.logsumexp(zr + lk_r, -1)  # (..., R)
    lead_size = max(1, math.prod(zq.shape[:-2]))
    block = max(1, ROWS_BLOCK_ELEMENTS // max(1, lead_size * max(1, rows_t.numel()) * zq.shape[-1]))
    parts = []
    for s in range(0, n, block):
        zk_b = zk[..., s:s + block, :]
        parts.append(torch.logsumexp(zr.unsqueeze(-2) + zk_b.unsqueeze(-3), -1))  # (..., R, B)
    log_pi = torch.cat(parts, -1) - log_den.unsqueeze(-1)
    if not bool(torch.isfinite(log_den).all()):
        raise_if_non_finite(q=q, k=k, projection=projection)
    pi = torch.exp(log_pi)
    if b is not None:
        same = b.index[rows_t].unsqueeze(-1) == b.index.unsqueeze(0)  # (R, N)
        pi = pi.masked_fill(~same, 0.0)
    return pi.to(q.dtype)


def edge_log_likelihood(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, *,
                        tau: float = 1.0, batch=None) -> torch.Tensor:
    """Per-node edge log-likelihood l_u = (1/d_u) sum_{v: (u,v) in E} log pi_uv (wu22 Eqs. 10, 12).

    pi_uv as in kernelized_attention_rows (no Gumbel noise, the same tau scaling), d_u the stored
    entries of row u of the graph (a self-loop counts once; l_u = 0 for an isolated node). Log
    space, O(E m) using the shared per-graph key sums LSE_w zk_wf (never -inf or NaN from finite
    input, whatever |q|, |k| or tau). q, k: (..., N, d_qk); graph: anything fast.as_graph accepts
    for N nodes (edge indices out of [0, N): ValueError) -> (..., N) in q's dtype (computed in float32 for
    halves, then cast, as every fast path returns its input dtype).
    """
    return _edge_terms(q, k, projection, graph, tau, batch).to(q.dtype)


def _edge_terms(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, tau: float,
                batch) -> torch.Tensor:
    """edge_log_likelihood in the compute dtype (float32 for halves)."""
    _check_qk(q, k, projection)
    tau = _check_tau(tau)
    n = q.shape[-2]
    b = check_batch(batch, n, device=q.device)
    g = _graph_of(graph, n, q.device, b)
    zq, zk = _exponents(q, k, projection, tau)
    lk = _log_key_sums(zk, b)
    log_den = torch.logsumexp(zq + lk, -1)  # (..., N)
    u, w = g.row, g.col
    lead_size = max(1, math.prod(zq.shape[:-2]))
    block = max(1, EDGE_BLOCK_ELEMENTS // (lead_size * zq.shape[-1]))
    log_num = _EdgeLogSumExp.apply(zq, zk, u, w, block)  # (..., E), O(E m) in bounded blocks
    log_pi = log_num - log_den.index_select(-1, u)
    total = torch.zeros(*log_pi.shape[:-1], n, dtype=log_pi.dtype, device=log_pi.device).index_add(-1, u, log_pi)
    deg = g.degree.to(log_pi.dtype).clamp(min=1.0)
    out = total / deg
    if not bool(torch.isfinite(log_den.detach()).all()):
        raise_if_non_finite(q=q, k=k, projection=projection)
    return out


def edge_loss(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, *,
              tau: float = 1.0, batch=None) -> torch.Tensor:
    """The edge-level regularisation of one layer (wu22 Eq. 10): -(1/N) sum_u l_u, averaged over the
    leading (batch, head) dims -> 0-dim tensor. l_u: edge_log_likelihood. (NodeFormer's code averages
    over edges instead: N/E times this; documented difference.) Differentiable in q and k. A loss:
    float32 for half-precision inputs (summed from the float32 terms, never rounded to 8 bits)."""
    return -_edge_terms(q, k, projection, graph, tau, batch).mean()
