"""NodeFormer (wu22): kernelized softmax and Gumbel-softmax message passing (Eqs. 5-7, 14-17), the
relational bias (Eq. 8), the learned graph's weights and the edge loss (Eqs. 10, 12).

Shapes: q, k (..., N, d_qk); v (..., N, d) -> (..., N, d); leading dims (batch, heads) are
independent slices that q, k and v share; projection W (m, d_qk), m >= 1
(fast.gaussian_projection). Several graphs concatenated along N carry a sorted PyG batch vector
``batch`` (N,) (fast.batching.check_batch): no output of one graph depends on another graph's
inputs. Without a batch vector the N nodes are one graph (every node attends to every node).

Kernel: FAVOR+ features (wu22 Eq. 4) of x = q d_qk^(-1/4) / sqrt(tau) (k likewise), so
phi(q_u) . phi(k_v) estimates exp(q_u . k_v / (sqrt(d_qk) tau)) (NodeFormer's code; tau = 1 is
Eq. 5, which the paper prints without the sqrt(d_qk)). The features are formed in log space and
balanced per graph and feature, Gumbel noise entering the keys' exponents as g / tau, so that no
denominator overflows or underflows for any tau. The driver is fast.masked_linear_attention
(choromanski22 Algorithm 1): O(N m d), O(K N m d) with K Gumbel samples; the relational bias
costs O(order E d) and the edge terms O(E m). No NaN or inf is returned from finite input:
exponents beyond the dtype's range raise ValueError naming tau (or noise) with the numbers, and the
outputs are averages of v, whose sums (N max |v|, K max |v| over Gumbel samples) the driver and the
sample mean rescale by exact powers of two where they would overflow (fast.scaling).
docs/papers.md ("fast.latent.nodeformer") has the derivation, the layouts of a batch of graphs
and the host reads per call.

Randomness only from an explicit ``generator`` (or ``noise`` passed in): global RNG state is
never read or advanced. In a training loop pass a fast.Graph built once
(fast.as_graph(edge_index, n=N)): the relational bias caches its adjacency orders on it.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from fast.algebra import linear_products
from fast.attention import masked_linear_attention
from fast.batching import BatchIndex, check_batch
from fast.errors import DenominatorError
from fast.graphs import Graph, as_graph
from fast.operator import SymmetricMaskOperator
from fast.masks.explicit import SparseMask
from fast.scaling import pow2, times_pow2, value_shift, within_values
from fast.segments import Segments, add_into, few_segments
from fast.validation import (check_allocation, check_device, check_favor_inputs, check_positive_int, check_same_device,
                             check_tensor, compute_dtype, raise_if_non_finite)

__all__ = ["check_tau", "gumbel_noise", "kernelized_softmax", "kernelized_gumbel_softmax", "adjacency_orders", "relational_bias",
           "nodeformer_attention", "kernelized_attention_rows", "edge_log_likelihood", "edge_loss"]

#: edge_log_likelihood forms its (..., B, m) per-edge terms in edge blocks of at most about this
#: many entries (forward and backward; nothing of size E m is kept for backward).
EDGE_BLOCK_ELEMENTS = 1 << 22
#: kernelized_attention_rows forms its (..., R, B, m) log-kernel terms in key blocks of at most
#: about this many entries.
ROWS_BLOCK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------- argument checks

def check_tau(tau: object) -> float:
    """The temperature tau as a float: a finite real number > 0, or a one-element floating tensor that does
    not require grad (a hyperparameter: no gradient reaches it). ValueError naming tau otherwise (a
    string such as "abc" included). O(1).

        >>> from fast.latent.nodeformer import check_tau
        >>> check_tau(0.25)
        0.25
        >>> check_tau("abc")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: tau must be a finite number > 0 (the temperature: ...), got 'abc'
    """
    if isinstance(tau, torch.Tensor) and tau.numel() == 1 and tau.dtype.is_floating_point:
        if tau.requires_grad:
            raise ValueError("tau must not require grad: it is a hyperparameter here (no gradient reaches it); pass "
                             "a float or tau.detach()")
        tau = float(tau)
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(float(tau)) or tau <= 0:
        raise ValueError(f"tau must be a finite number > 0 (the temperature: the kernel is exp(q.k / (sqrt(d) tau))), "
                         f"got {tau!r}")
    return float(tau)


def _check_samples(samples: object) -> int:
    return check_positive_int("samples", samples, "an int >= 1 (the number K of Gumbel samples averaged)")


def _check_order(order: object) -> int:
    return check_positive_int("order", order, "an int >= 1 (the highest adjacency order A^order of the relational bias)")


def _check_qk(q: object, k: object, projection: object) -> None:
    """Shapes, dtypes and devices of q, k and the projection (metadata only): favor_attention's checks,
    plus a real floating projection with m >= 1 rows and q, k of one shape (self-attention)."""
    if isinstance(projection, torch.Tensor):
        if not projection.is_floating_point() or projection.is_complex():
            raise TypeError(f"projection must be a real floating tensor, got {projection.dtype}")
        if projection.dim() == 2 and projection.shape[0] < 1:
            raise ValueError(f"projection must have m >= 1 rows (random features), got shape {tuple(projection.shape)}")
    check_favor_inputs(q, k, projection)
    if q.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"q and k must have the same shape (..., N, d_qk) up to d_qk (self-attention over the N "
                         f"nodes), got {tuple(q.shape)} and {tuple(k.shape)}")


def _check_v(v: object, k: torch.Tensor) -> None:
    check_tensor("v", v, check_finite=False)
    check_same_device(k=k, v=v)
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k (..., N, d_qk) and v (..., N, d) must share leading dims and N, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")


# ---------------------------------------------------------------------------- noise

def gumbel_noise(shape, *, generator: torch.Generator | None = None, device=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log U), U ~ Uniform(0, 1), of ``shape`` (wu22 Eqs. 6, 14).

    U comes from ``generator`` (None: a fresh OS-seeded one on ``device``; torch's global RNG is
    never read or advanced), drawn in float64 for float64 and float32 otherwise, clamped into
    [tiny, 1 - eps/2] so that g is finite, then moved to ``device`` (default: the generator's)
    and cast to ``dtype``. kernelized_gumbel_softmax draws shape (K, *k.shape[:-1]): one value per
    sample, leading slice and key node. O(numel). TypeError for a bad generator, dtype or shape (not
    an int or a sequence of ints); ValueError for a negative size; MemoryError naming shape when the
    noise would not fit in memory (fast.validation.check_allocation).

        >>> import torch
        >>> from fast.latent.nodeformer import gumbel_noise
        >>> g = gumbel_noise((2, 5), generator=torch.Generator().manual_seed(0))
        >>> tuple(g.shape), g.dtype, bool(torch.isfinite(g).all())
        ((2, 5), torch.float32, True)
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None (e.g. torch.Generator().manual_seed(seed)), "
                        f"got {type(generator).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a real floating torch.dtype, got {dtype!r}")
    if device is not None:
        device = check_device("device", device)
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    # each size an int (a torch.Size, or 0-d integer tensors): "abc" or 2.5 would convert to other sizes
    sizes = list(shape) if isinstance(shape, (tuple, list, torch.Size)) else None
    if sizes is None or not all((isinstance(s, numbers.Integral) and not isinstance(s, bool)) or
                                (isinstance(s, torch.Tensor) and s.dim() == 0 and not s.is_floating_point()
                                 and s.dtype != torch.bool) for s in sizes):
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    shape = tuple(int(s) for s in sizes)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape must have sizes >= 0, got {shape}")
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    check_allocation(f"shape = {shape}", shape, draw, device if device is not None else (
        generator.device if generator is not None else None), what="the Gumbel noise")
    if generator is None:  # a fresh OS-seeded generator on the target device: drawn there, no copy
        generator = torch.Generator(device=torch.device(device) if device is not None else "cpu")
        generator.seed()
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=draw)
    info = torch.finfo(draw)
    u = u.clamp_(min=info.tiny, max=1.0 - info.eps / 2)
    g = u.log_().neg_().log_().neg_()
    return g.to(device=device if device is not None else g.device, dtype=dtype)


def _check_sample_memory(argument: str, count: int, k: torch.Tensor, projection: torch.Tensor,
                         work: torch.dtype) -> None:
    """MemoryError naming ``argument`` before K samples' key exponents and features (K, ..., N, m), two
    arrays in the compute dtype, are formed where they would not fit (fast.validation.check_allocation)."""
    check_allocation(argument, (count, *k.shape[:-1], projection.shape[0]), work, k.device, copies=2,
                     what="the key features of every Gumbel sample (K, ..., N, m)")


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
    return noise  # NaN or inf in noise reaches every denominator: diagnosed on the rare path (_diagnose)


# ---------------------------------------------------------------------------- the exponents

def _scale(projection: torch.Tensor, tau: float, work: torch.dtype, noise: bool) -> tuple[float, float]:
    """s = d_qk^(-1/4) / sqrt(tau) and half = s^2 / 2 in float64 (Python floats), checked against the
    working dtype's range before anything is computed: ValueError naming tau when s, s^2 / 2 or (with
    noise) 1 / tau is not a finite number of ``work`` (tau = 1e-40 in float32)."""
    d = projection.shape[1]
    s = d ** -0.25 / math.sqrt(tau)
    half = 0.5 * s * s
    big = torch.finfo(work).max
    if not (s < big and half < big and (not noise or 1.0 / tau < big)):
        raise ValueError(f"tau = {tau!r} is too small for {work}: the FAVOR+ exponents are w.x - |x|^2/2 with "
                         f"x = q d_qk^(-1/4) / sqrt(tau), i.e. |x|^2/2 = {half:.3g} |q|^2"
                         + (f" and g / tau = {1.0 / tau:.3g} g" if noise else "")
                         + f", beyond {work}'s largest number {big:.3g}; use a larger tau or float64 inputs")
    return s, half


def _exponents(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, tau: float,
               noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FAVOR+ exponents of x = q d^(-1/4) / sqrt(tau) (k likewise), in the compute dtype (float32 for halves):

        zq_uf = w_f . x_u                  (..., N, m)   (the queries' -|x_u|^2/2 is a per-query constant,
                                                          which cancels in every ratio here: never formed)
        zk_vf = w_f . x_v - |x_v|^2/2      (..., N, m),  or with noise (K, ..., N): + g_sv / tau, (K, ..., N, m)

    One GEMM each; the scale folds into W and the norm term (q and k are never rescaled), the norm is
    subtracted in place on the GEMM's fresh output (fast.features.favor_exponentials' pattern)."""
    work = compute_dtype(torch.promote_types(q.dtype, k.dtype))
    s, half = _scale(projection, tau, work, noise is not None)
    q, k = q.to(work), k.to(work)
    wt = (projection.to(work) * s).T
    zq = q @ wt
    zk = k @ wt
    norm = torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    nk = norm.square() * half if (k.requires_grad and torch.is_grad_enabled()) else norm.square_().mul_(half)
    zk = zk.sub_(nk)
    if noise is not None:
        zk = zk.unsqueeze(0) + noise.to(work).mul(1.0 / tau).unsqueeze(-1)  # log space: exp(g/tau) never formed
    return zq, zk


class _Layout:
    """How a batch's graphs are laid out for batched GEMMs (built once per BatchIndex, cached on it).

    ``kind``: "one" (no batch), "slices" (few graphs, fast.segments.few_segments, or sizes too uneven to
    pad: G S > 2 N, S the largest graph: a loop over contiguous slices), "equal" (many graphs of one
    size S: (..., N, c) is viewed as (..., G, S, c), no copy) or "padded" (many graphs
    of sizes <= S with G S <= 2 N: rows copied to slot batch[u] S + (u - ptr[batch[u]]) of a (..., G S, c)
    buffer, the rest filled)."""

    def __init__(self, batch: BatchIndex | None):
        self.batch = batch
        if batch is None:
            self.kind, self.size, self.slots = "one", 0, None
            return
        ptr = batch.host_ptr()
        g, n = batch.num_graphs, batch.n
        self.size = size = max(e - s for s, e in zip(ptr[:-1], ptr[1:]))
        self.slots = self._slots = None
        if few_segments(g) or g * size > 2 * n:
            self.kind = "slices"
        elif g * size == n:
            self.kind = "equal"
        else:
            self.kind = "padded"
            pos = torch.arange(n, device=batch.device) - batch.ptr[batch.index]
            self.slots = batch.index * size + pos
            # the nodes' slots as one-row segments of the G S padded rows (increasing: batch is sorted), so
            # that unpad's gather has a backward without atomic adds (fast.segments)
            self._slots = Segments(self.slots, g * size, sorted=True, longest=1)

    @staticmethod
    def of(batch: BatchIndex | None) -> "_Layout":
        if batch is None:
            return _Layout(None)
        lay = batch.cache.get("fast.latent.nodeformer.layout")
        if lay is None:
            lay = batch.cache["fast.latent.nodeformer.layout"] = _Layout(batch)
        return lay

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(..., N, c) -> (..., G, S, c) ("equal": a view; "padded": a copy, other rows ``fill``)."""
        g = self.batch.num_graphs
        if self.kind == "equal":
            return x.unflatten(-2, (g, self.size))
        z = x.new_full((*x.shape[:-2], g * self.size, x.shape[-1]), fill)
        return z.index_copy_(-2, self.slots.to(x.device), x).unflatten(-2, (g, self.size))

    def unpad(self, y: torch.Tensor) -> torch.Tensor:
        """(..., G, S, c) -> (..., N, c), the inverse of pad on the nodes' rows (a gather; its backward
        places the rows back through fast.segments, not index_add_'s atomics on CUDA)."""
        y = y.flatten(-3, -2)
        return y if self.kind == "equal" else self._slots.expand(y, dim=-2)


def _key_max(zk: torch.Tensor, batch: BatchIndex | None) -> torch.Tensor:
    """Per-(slice, graph, feature) max of the key exponents, (..., 1, m) for one graph or gathered back to
    the nodes (..., N, m) for a batch; detached. Few graphs: amax on each contiguous slice; many: amax
    over the padded (..., G, S, m) layout (fill -inf)."""
    zk = zk.detach()
    if batch is None:
        return zk.amax(-2, keepdim=True)
    lay = _Layout.of(batch)
    if lay.kind == "slices":
        ptr = batch.host_ptr()
        parts = [zk[..., a:e, :].amax(-2, keepdim=True) if e > a else zk.new_full((*zk.shape[:-2], 1, zk.shape[-1]),
                                                                                   -torch.inf)
                 for a, e in zip(ptr[:-1], ptr[1:])]
        per_graph = torch.cat(parts, -2)
    else:
        per_graph = lay.pad(zk, -torch.inf).amax(-2)
    return batch.gather(per_graph)


def _balanced_features(zq: torch.Tensor, zk: torch.Tensor,
                       batch: BatchIndex | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi_q, phi_k) in (0, 1] balanced per (sample, slice, graph, feature) (docs/papers.md): every denominator
    >= 1. Consumes zq and zk (shift and exp in place on them: they must be fresh, e.g. _exponents').
    Many graphs of one size (fast.segments.few_segments false) are viewed as (..., G, S, m) and treated as G slices."""
    if batch is not None and _Layout.of(batch).kind == "equal":
        lay = _Layout.of(batch)
        pq, pk = _balanced_features(lay.pad(zq), lay.pad(zk), None)
        return pq.flatten(-3, -2), pk.flatten(-3, -2)
    c = _key_max(zk, batch)
    phi_k = zk.sub_(c).exp_()
    zq = zq.add_(c) if c.dim() == zq.dim() else zq.unsqueeze(0) + c  # Gumbel: one copy per sample
    phi_q = zq.sub_(zq.detach().amax(-1, keepdim=True)).exp_()
    return phi_q, phi_k


class _GraphBlocks(SymmetricMaskOperator):
    """M_uv = 1 if batch[u] == batch[v], for a SORTED batch vector, any number of graphs. Its ``attend``
    is unmasked linear attention (fast.algebra.linear_products: O(N (m + d)) saved under autograd)
    on each graph separately, laid out by _Layout (a loop over few or uneven graphs' slices, else
    batched GEMMs over the (..., G, S, m) view or zero-padded copy: zero rows add nothing to a
    graph's state), never the N x m x d outer products and never PackingMask's generic segment-sum
    path (much slower). matmul (for the driver's rare paths) is the segment sum gathered back.
    """

    nonnegative = True

    def __init__(self, batch: BatchIndex):
        self.n = batch.n
        self.batch = batch

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        b = self.batch.to(x.device)
        return b.gather(b.segment_sum(x))

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lay = _Layout.of(self.batch)
        if lay.kind != "slices":
            num, den, _ = linear_products(lay.pad(phi_q), lay.pad(phi_k), lay.pad(v))  # (..., G, S, d), (..., G, S)
            return lay.unpad(num), lay.unpad(den.unsqueeze(-1)).squeeze(-1)
        ptr = self.batch.host_ptr()
        nums, dens = [], []
        for s, e in zip(ptr[:-1], ptr[1:]):
            if e > s:
                num, den, _ = linear_products(phi_q[..., s:e, :], phi_k[..., s:e, :], v[..., s:e, :])
                nums.append(num)
                dens.append(den)
        return torch.cat(nums, -2), torch.cat(dens, -1)


def _diagnose(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, tau: float, v: torch.Tensor | None = None,
              noise: torch.Tensor | None = None, graph_flag: torch.Tensor | None = None) -> None:
    """The rare path after a failed check: always raises a ValueError naming an argument. First NaN or inf
    in the inputs (by name), then exponents beyond the working dtype's range, measured in float64: the
    largest |x|^2/2 and |w.x| (x = q d^(-1/4) / sqrt(tau), k likewise) and max |g| / tau, named tau or noise
    with the numbers (never a NaN returned after the inputs were found finite)."""
    named = dict(q=q, k=k, projection=projection)
    if v is not None:
        named["v"] = v
    if noise is not None:
        named["noise"] = noise
    raise_if_non_finite(**named)
    work = compute_dtype(torch.promote_types(q.dtype, k.dtype))
    big = torch.finfo(work).max
    s = projection.shape[1] ** -0.25 / math.sqrt(tau)
    with torch.no_grad():
        x_max = max(float(torch.linalg.vector_norm(t.double(), dim=-1).max()) if t.numel() else 0.0 for t in (q, k))
        w_max = float(torch.linalg.vector_norm(projection.double(), dim=-1).max())
        g_max = float(noise.double().abs().max()) / tau if noise is not None and noise.numel() else 0.0
    half_sq, dot = 0.5 * (s * x_max) ** 2, s * x_max * w_max
    if g_max > 0.25 * big and g_max * tau <= 64.0:  # ordinary Gumbel noise (|g| <= 64): tau is the cause
        raise ValueError(f"tau = {tau!r} is too small for the Gumbel noise in {work}: max |g| / tau = {g_max:.3g} "
                         f"against {work}'s largest number {big:.3g}; use a larger tau or float64 inputs")
    if g_max > 0.25 * big:
        raise ValueError(f"noise / tau overflows {work}: max |g| / tau = {g_max:.3g} (tau = {tau!r}) against {work}'s "
                         f"largest number {big:.3g}; standard Gumbel noise lies in about [-6.6, 36.7] (gumbel_noise)")
    raise ValueError(f"tau = {tau!r} is too small for these inputs in {work}: the FAVOR+ exponents reach |x|^2/2 = "
                     f"{half_sq:.3g} and |w.x| <= {dot:.3g} (x = q d_qk^(-1/4) / sqrt(tau), largest |q|, |k| = "
                     f"{x_max:.3g}), which {work} (largest number {big:.3g}) cannot hold with the precision the "
                     "log-space features need; use a larger tau, smaller q and k, or float64 inputs")


def _drive(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, batch: BatchIndex | None,
           diagnose) -> torch.Tensor:
    """fast.masked_linear_attention on the balanced features; mask None (one graph) or the per-graph
    slices (_GraphBlocks, any number of graphs). A non-finite denominator (which, the features being in
    [0, 1] with each row's and column's largest entry 1, only NaN or inf inputs or out-of-range
    exponents can cause) is reported by ``diagnose`` naming q, k, v, projection, noise or tau, never
    phi_q / phi_k."""
    mask = None if batch is None else _GraphBlocks(batch)
    try:
        return masked_linear_attention(phi_q, phi_k, v, mask, features_nonnegative=True)
    except (ValueError, DenominatorError) as exc:
        if isinstance(exc, DenominatorError) or "non-finite" in str(exc):
            diagnose()
        raise


def _prepare(q, k, v, projection, tau, batch):
    _check_qk(q, k, projection)
    _check_v(v, k)
    tau = check_tau(tau)
    b = check_batch(batch, q.shape[-2], device=q.device)
    return tau, b


# ---------------------------------------------------------------------------- attention

def kernelized_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                       tau: float = 1.0, batch=None) -> torch.Tensor:
    """Kernelized softmax message passing (wu22 Eq. 5), all-pair within each graph, O(N m d).

        z_u = sum_v kappa~(q_u, k_v) v_v / sum_w kappa~(q_u, k_w),
        kappa~(q, k) = phi(q d^-1/4 / sqrt(tau)) . phi(k d^-1/4 / sqrt(tau)) ~ exp(q.k / (sqrt(d_qk) tau))

    q, k: (..., N, d_qk); v: (..., N, d); projection (m, d_qk) -> (..., N, d) in v's dtype (half
    precisions compute in float32). tau: a finite float > 0 or a 0-dim tensor not requiring grad
    (the 1/sqrt(tau) scaling of Eqs. 14-17; 1 gives Eq. 5 as printed). batch: None or a PyG batch
    vector (N,): sums run over u's graph only. Log-space features: no denominator overflows or
    underflows for any tau. Differentiable in q, k, v and the projection.
    Errors: ValueError naming tau (not finite, <= 0, requiring grad, too small for the dtype),
    batch, q/k/v/projection (shapes; NaN or inf; m < 1 rows); never NaN or inf from finite input
    (values near the dtype's maximum included: sums that overflow are redone on v 2^-s, exactly,
    by fast.masked_linear_attention's rare path).

    It equals the dense kernel attention with these features, and a batch keeps graphs apart:

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import kernelized_softmax
        >>> phi = lambda x: torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)  # FAVOR+ (Eq. 4), W = w
        >>> a = phi(q) @ phi(k).T  # dense (N, N) kernel; x = q d^(-1/4) / sqrt(tau) = q here
        >>> out = kernelized_softmax(q, k, v, w, tau=0.5)
        >>> tuple(out.shape), bool(torch.allclose(out, (a @ v) / a.sum(-1, keepdim=True)))
        ((6, 4), True)
        >>> two = kernelized_softmax(q, k, v, w, tau=0.5, batch=torch.tensor([0, 0, 0, 1, 1, 1]))
        >>> bool(torch.allclose(two[:3], kernelized_softmax(q[:3], k[:3], v[:3], w, tau=0.5)))
        True
    """
    tau, b = _prepare(q, k, v, projection, tau, batch)
    return _softmax_core(q, k, v, projection, tau, b)


def _softmax_core(q, k, v, projection, tau: float, b: BatchIndex | None) -> torch.Tensor:
    zq, zk = _exponents(q, k, projection, tau)
    phi_q, phi_k = _balanced_features(zq, zk, b)
    return _drive(phi_q, phi_k, v, b, lambda: _diagnose(q, k, projection, tau, v=v))


def kernelized_gumbel_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor, *,
                              tau: float = 0.25, samples: int | None = None, noise: torch.Tensor | None = None,
                              generator: torch.Generator | None = None, training: bool = True,
                              batch=None) -> torch.Tensor:
    """Kernelized Gumbel-softmax message passing (wu22 Eqs. 6-7, 14-17), O(K N m d).

    Sample s (Eq. 7): z_u^(s) = sum_v kappa~(q_u, k_v) e^(g_sv / tau) v_v / sum_w kappa~(q_u, k_w) e^(g_sw / tau),
    kappa~ at the 1/sqrt(tau) scaling (kernelized_softmax), g_sv standard Gumbel noise per key
    node, shared by all queries (so Eq. 7 stays linear). Output: the mean over the K samples of the
    normalised z^(s) (NodeFormer's code; the ratio is a biased estimate of Eq. 6's expectation).
    e^(g/tau) is folded into the keys' exponents in log space: finite for any tau > 0. Where
    K max |v| could overflow the mean, the samples run on v 2^-t and the mean is multiplied back
    (exact; a max over v and two O(N d) passes, no host read).

    q, k: (..., N, d_qk); v: (..., N, d); projection (m, d_qk) -> (..., N, d). training=True: the
    noise as given, (K, *k.shape[:-1]) (``samples`` then None or K), or drawn by gumbel_noise from
    ``generator`` (K = samples, default 10). training=False: no noise, the kernelized softmax at
    the same tau (evaluation mode). Errors: ValueError naming tau, samples, noise (shape, NaN,
    given in evaluation mode), batch, or q/k/v/projection (shapes; NaN or inf).

    With the noise given, the mean over the samples of dense attention with the keys reweighted:

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import gumbel_noise, kernelized_gumbel_softmax
        >>> phi = lambda x: torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)  # FAVOR+ (Eq. 4), W = w
        >>> g = gumbel_noise((2, 6), generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # K = 2
        >>> a = torch.stack([phi(q) @ (phi(k) * torch.exp(gs / 0.5)[:, None]).T for gs in g])  # x = q at tau = 1/2
        >>> out = kernelized_gumbel_softmax(q, k, v, w, tau=0.5, noise=g)
        >>> bool(torch.allclose(out, ((a @ v) / a.sum(-1, keepdim=True)).mean(0)))
        True
    """
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__}")
    if samples is not None:
        samples = _check_samples(samples)
    tau, b = _prepare(q, k, v, projection, tau, batch)
    return _gumbel_core(q, k, v, projection, tau, b, samples, noise, generator, training)


def _gumbel_core(q, k, v, projection, tau: float, b: BatchIndex | None, samples: int | None, noise, generator,
                 training: bool) -> torch.Tensor:
    if not training:
        if noise is not None:
            raise ValueError("noise was given with training=False: evaluation mode uses no Gumbel noise (the "
                             "kernelized softmax at the same tau); pass training=True to use the noise")
        return _softmax_core(q, k, v, projection, tau, b)
    work = compute_dtype(torch.promote_types(q.dtype, k.dtype))
    if noise is None:
        count = 10 if samples is None else samples
        _check_sample_memory(f"samples = {count}", count, k, projection, work)
        noise = gumbel_noise((count, *k.shape[:-1]), generator=generator, device=k.device, dtype=work)
    else:
        noise = _check_noise(noise, k, samples)
        _check_sample_memory(f"noise of K = {noise.shape[0]} samples", noise.shape[0], k, projection, work)
    zq, zk = _exponents(q, k, projection, tau, noise)  # zk (K, ..., N, m): g / tau in log space
    phi_q, phi_k = _balanced_features(zq, zk, b)
    shift = _mean_shift(v, noise.shape[0])
    vs = v if shift is None else v * pow2(-shift, compute_dtype(v.dtype))  # a 0-dim factor: vs keeps v's dtype
    vk = vs.unsqueeze(0).expand(noise.shape[0], *v.shape)  # a view (stride 0), no copy of v
    out = _drive(phi_q, phi_k, vk, b, lambda: _diagnose(q, k, projection, tau, v=v, noise=noise)).mean(0)
    if shift is None:
        return out
    # a mean of averages of v stays in v's range: where shifted (values near the maximum), round-off
    # must not carry it past (selected on the device, so unshifted calls keep their bits)
    return torch.where(shift > 0, within_values(out, vs), out) * pow2(shift, compute_dtype(v.dtype))


def _mean_shift(v: torch.Tensor, samples: int) -> torch.Tensor | None:
    """The mean over K samples sums K outputs each up to max |v|: a 0-dim int shift t = ceil(log2 K) where
    K max |v| could pass finfo.max / 2, else 0, so that the mean runs on v 2^-t and 2^t multiplies it back
    (exact: powers of two; fast.scaling). On the device, no host read: O(N d) passes (the max, v 2^-t, the
    range of v 2^-t for the clamp, the output's clamp and product). None (nothing to do) for K = 1, an
    empty v, or float16 (its K outputs are summed in float32, which K * 65504 cannot overflow;
    bfloat16 reaches float32's maximum and is shifted like it)."""
    if samples == 1 or v.numel() == 0 or v.dtype == torch.float16:
        return None
    t = math.ceil(math.log2(samples))
    with torch.no_grad():
        big = v.detach().abs().amax() >= torch.finfo(v.dtype).max * 2.0 ** -(t + 1)
        return torch.where(big, t, 0)


# ---------------------------------------------------------------------------- relational bias

def adjacency_orders(graph: object, order: int, *, n: int | None = None) -> list[Graph]:
    """[A_1, ..., A_order]: the 0/1 patterns of A^r (wu22 Eq. 8's higher-order adjacency), as fast.Graphs.

    A_1 is the input graph's pattern with unit weights, self-loops as given; A_r stores (u, v)
    where a walk of exactly r hops joins u to v (so A_2 has a self-loop at every node with a
    neighbour), unlike NodeFormer's (A + I)^r (relational_bias). graph: anything fast.as_graph
    accepts, n its node count. Sparse products, O(sum_r nnz(A_r) max degree); cached on a
    fast.Graph input. ValueError naming order (not an int >= 1) or graph (as_graph's); MemoryError
    naming order when the orders could not fit in memory.

        >>> import torch
        >>> from fast.latent.nodeformer import adjacency_orders
        >>> a1, a2 = adjacency_orders(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 2)  # the path 0 - 1 - 2
        >>> a = a1.csr().to_dense()
        >>> a1.num_edges, a2.num_edges, bool(torch.equal(a2.csr().to_dense(), (a @ a > 0).double()))
        (4, 5, True)
    """
    order = _check_order(order)
    g = as_graph(graph, n=n, name="graph") if n is not None else as_graph(graph, name="graph")
    return list(_cached_orders(g, order))


def _pattern(g: Graph) -> Graph:
    return Graph(g.n, g.crow, g.col, torch.ones_like(g.weight))


def _orders(g: Graph, order: int) -> list[Graph]:
    # each order's Graph holds at least its row pointers and degrees: refuse an order whose list cannot fit
    check_allocation(f"order = {order}", (order, 2 * g.n + 1), torch.int64, g.device,
                     what=f"the adjacency orders A_1..A_order of a graph of {g.n} nodes (per order at least its "
                          f"row pointers and degrees)")
    a1 = _pattern(g)
    out = [a1]
    if order == 1:
        return out
    n = g.n
    idx = torch.stack([a1.row, a1.col])
    # check_invariants=False: the indices come from a Graph (sorted, in range), and saying so
    # explicitly stops torch warning that its checks are "implicitly disabled".
    a = torch.sparse_coo_tensor(idx, a1.weight, (n, n), check_invariants=False).coalesce()
    p = a
    for _ in range(order - 1):
        with warnings.catch_warnings():
            # COO @ COO runs through torch's CSR kernels, which announce "Sparse CSR tensor support
            # is in beta state" on first use; this product of 0/1 patterns is exact, so only that
            # notice is ignored.
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state",
                                    category=UserWarning)
            p = torch.sparse.mm(p, a).coalesce()
        keep = p.values() > 0
        pi = p.indices()[:, keep]
        p = torch.sparse_coo_tensor(pi, torch.ones(pi.shape[1], dtype=torch.float64, device=pi.device),
                                    (n, n), check_invariants=False).coalesce()
        out.append(_pattern(as_graph(p.indices(), n=n, name="graph")))
    return out


def _check_normalize(normalize: object) -> str | None:
    if normalize is not None and normalize != "sym":
        raise ValueError(f'normalize must be "sym" (D^-1/2 A D^-1/2, NodeFormer\'s code) or None (raw A, Eq. 8 as '
                         f"printed), got {normalize!r}")
    return normalize


def _check_bias(b: object, order: int, device: torch.device,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(b as a (order,) tensor (a float or 0-dim tensor is shared by all orders; gradients kept), a 0-dim
    device flag "b is finite" for a tensor b (read with the caller's other flags), else None)."""
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
        return bt.to(device=device, dtype=dtype), torch.isfinite(b.detach()).all().to(device)
    if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(float(b)):
        raise ValueError(f"b must be a finite float, a 0-dim tensor or a tensor of shape (order,), got {b!r}")
    return torch.full((order,), float(b), device=device, dtype=dtype), None


#: key prefix of what this module caches on a fast.Graph (in its per-graph cache dict): the adjacency
#: orders and the normalised bias operators, built once per Graph object.
_CACHE_KEY = "fast.latent.nodeformer"


def _graph_cache(g: Graph) -> dict:
    """The Graph's ``cache`` dict (entries here are keyed by tuples starting with _CACHE_KEY): dies with
    the Graph."""
    return g.cache


def _cached_orders(g: Graph, order: int) -> list[Graph]:
    cache = _graph_cache(g)
    have = cache.get((_CACHE_KEY, "orders"))
    if have is None or len(have) < order:
        have = _orders(g, order)
        cache[(_CACHE_KEY, "orders")] = have
    return have[:order]


def _bias_operators(g: Graph, order: int, normalize: str | None) -> list[SparseMask]:
    """[A~_1, ..., A~_order] as SparseMasks (each caches its CSR per device and dtype), cached on g."""
    cache = _graph_cache(g)
    key = (_CACHE_KEY, "bias", normalize)
    have = cache.get(key)
    if have is None or len(have) < order:
        have = []
        for a in _cached_orders(g, order):
            w = a.weight
            if normalize == "sym":
                inv = a.weighted_degree.clamp(min=1.0).rsqrt()  # isolated rows have no entries: their 0 stays
                w = inv[a.row] * w * inv[a.col]
            have.append(SparseMask(a.csr(torch.float64, values=w), name="graph"))
        cache[key] = have
    return have[:order]


def _graph_of(graph: object, n: int, device: torch.device) -> Graph:
    """as_graph(graph, n=N) on ``device`` (edge indices out of [0, N): as_graph's ValueError). A fast.Graph
    passes through (n checked, no host read); anything else is canonicalised on every call."""
    # the name says where n came from: an index past it is as likely a v (or x) of the wrong N as a bad graph
    g = as_graph(graph, n=n, name=f"graph (on the N = {n} nodes of the inputs)")
    return g.to(device)


def _inside_flag(g: Graph, batch: BatchIndex | None) -> torch.Tensor | None:
    """0-dim device flag "every edge joins two nodes of one graph of the batch" (None without batch or edges)."""
    if batch is None or g.num_edges == 0:
        return None
    index = batch.index.to(g.device)
    return (index[g.row] == index[g.col]).all()


def _raise_crossing(g: Graph, batch: BatchIndex) -> None:
    index = batch.index.to(g.device)
    cross = index[g.row] != index[g.col]
    e = int(torch.nonzero(cross)[0, 0])
    u, w = int(g.row[e]), int(g.col[e])
    raise ValueError(f"graph has an edge ({u}, {w}) between two graphs of the batch (batch[{u}] = "
                     f"{int(index[u])}, batch[{w}] = {int(index[w])}): edges must join nodes of one graph")


def _read_flags(*flags: torch.Tensor | None) -> bool:
    """All given 0-dim flags, combined on the device and read once (True when there are none)."""
    flags = [f for f in flags if f is not None]
    if not flags:
        return True
    return bool(torch.stack(flags).all()) if len(flags) > 1 else bool(flags[0])


def relational_bias(v: torch.Tensor, graph: object, b, *, order: int = 1, normalize: str | None = "sym",
                    batch=None) -> torch.Tensor:
    """The relational-bias term of wu22 Eq. 8: sum_{r=1..order} sigmoid(b_r) A~_r v, O(order E d).

    v: (..., N, d) -> (..., N, d). graph: anything fast.as_graph accepts on N = v.shape[-2] nodes.
    A_r: adjacency_orders' 0/1 patterns. normalize="sym": A~_r = D_r^-1/2 A_r D_r^-1/2, D_r the
    row sums of A_r (NodeFormer's code; isolated rows stay 0); None: A~_r = A_r (Eq. 8 as
    printed). b: a float or 0-dim tensor (shared by the orders) or a tensor (order,); learnable.
    batch: an optional PyG batch vector, only to check that no edge joins two graphs. In a training
    loop pass a fast.Graph built once: A_r and A~_r are built at the first call and cached on it
    (any other input is converted, and its orders rebuilt, at every call). NodeFormer's code uses
    the (A + I)^r patterns: pass a graph with self-loops added to get those (docs/papers.md).
    A~_r v can overflow where sigmoid(b_r) A~_r v does not (a star's centre row sums to sqrt(degree)):
    such a term is redone on v 2^-s and multiplied back, exactly (fast.scaling); the common path
    reads the term's finiteness in its one host read (one pass, O(N d)).
    Errors: ValueError naming v, graph, b (not finite, wrong shape), order, normalize or batch (an
    edge joining two graphs).

        >>> import torch
        >>> from fast.latent.nodeformer import relational_bias
        >>> a = torch.tensor([[0.0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.float64)  # the path 0 - 1 - 2
        >>> v = torch.arange(6.0, dtype=torch.float64).reshape(3, 2)
        >>> d = a.sum(1).rsqrt()
        >>> out = relational_bias(v, a.to_sparse(), 0.0)  # sigmoid(0) = 1/2
        >>> bool(torch.allclose(out, 0.5 * (d[:, None] * a * d) @ v))
        True
    """
    check_tensor("v", v, check_finite=False)
    order = _check_order(order)
    normalize = _check_normalize(normalize)
    n = v.shape[-2]
    bi = check_batch(batch, n, device=v.device)
    g = _graph_of(graph, n, v.device)
    return _checked_bias(v, g, b, order, normalize, bi)


def _checked_bias(v: torch.Tensor, g: Graph, b, order: int, normalize: str | None,
                  bi: BatchIndex | None) -> torch.Tensor:
    """The bias term, its flags read once (_check_bias_flags). The term is linear in v, but A~_r's row
    sums exceed 1 on irregular graphs ("sym": sqrt(degree) at a star's centre), so A~_r v can overflow
    where sigmoid(b_r) A~_r v does not: finite inputs with a non-finite term are redone on v 2^-s (each
    column's largest |v| in [0.5, 1)) and multiplied back by 2^s, exactly (fast.scaling)."""
    out, b_flag = _bias(v, g, b, order, normalize)
    if not _check_bias_flags(g, bi, b_flag, out, v):
        vw = v.to(compute_dtype(v.dtype))
        shift = value_shift(vw)
        out = times_pow2(_bias(times_pow2(vw, -shift), g, b, order, normalize)[0], shift).to(v.dtype)
    return out


def _check_bias_flags(g: Graph, bi: BatchIndex | None, b_flag: torch.Tensor | None,
                      out: torch.Tensor | None = None, v: torch.Tensor | None = None) -> bool:
    """One read for the edges' batch check, b's finiteness and the bias term's finiteness (a NaN or inf
    in v reaching it), after the products are queued: True when all pass, False when only the term
    is not finite on finite inputs (its sums overflowed); ValueError naming graph, b or v otherwise."""
    inside = _inside_flag(g, bi)
    if _read_flags(inside, b_flag, None if out is None else torch.isfinite(out.detach()).all()):
        return True
    if inside is not None and not bool(inside):
        _raise_crossing(g, bi)
    if b_flag is not None and not bool(b_flag):
        raise ValueError("b contains non-finite values (NaN or inf)")
    raise_if_non_finite(v=v)
    return False


def _bias(v: torch.Tensor, g: Graph, b, order: int,
          normalize: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    work = compute_dtype(v.dtype)
    bt, b_flag = _check_bias(b, order, v.device, work)
    gates = torch.sigmoid(bt)
    vw = v.to(work)
    out = None
    for r, op in enumerate(_bias_operators(g, order, normalize)):
        term = gates[r] * op.matmul_unscaled(vw)  # its own overflow check: _check_bias_flags
        out = term if out is None else out + term
    return out.to(v.dtype), b_flag


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
    stay inside one graph). The batch index and the graph are built once per call and shared by
    the parts; pass a fast.Graph built once (relational_bias). O(K N m d + order E d). Errors as
    the parts', and ValueError for b without graph or graph without b.

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import kernelized_softmax, nodeformer_attention
        >>> edges = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 0, 3, 2, 5, 4]])  # three pairs: degree 1
        >>> out = nodeformer_attention(q, k, v, w, graph=edges, b=0.0, tau=0.5, gumbel=False)
        >>> bias = 0.5 * v[[1, 0, 3, 2, 5, 4]]  # sigmoid(0) times the partner's value
        >>> bool(torch.allclose(out, kernelized_softmax(q, k, v, w, tau=0.5) + bias))
        True
    """
    if not isinstance(gumbel, bool):
        raise TypeError(f"gumbel must be a bool, got {type(gumbel).__name__}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__}")
    if graph is None and b is not None:
        raise ValueError("b was given without graph: the relational bias needs the input graph")
    if graph is not None and b is None:
        raise ValueError("graph was given without b: the relational bias sigmoid(b) A v needs b (a float, 0-dim "
                         "tensor or (order,) tensor)")
    order = _check_order(order)
    normalize = _check_normalize(normalize)
    if samples is not None:
        samples = _check_samples(samples)
    tau, bi = _prepare(q, k, v, projection, tau, batch)
    g = None if graph is None else _graph_of(graph, v.shape[-2], v.device)
    if gumbel:
        z = _gumbel_core(q, k, v, projection, tau, bi, samples, noise, generator, training)
    else:
        if noise is not None:
            raise ValueError("noise was given with gumbel=False (the plain kernelized softmax uses no noise)")
        z = _softmax_core(q, k, v, projection, tau, bi)
    if g is None:
        return z
    return z + _checked_bias(v, g, b, order, normalize, bi)


# ---------------------------------------------------------------------------- latent graph and edge loss

def _log_key_sums(zk: torch.Tensor, batch: BatchIndex | None) -> torch.Tensor:
    """LSE_{w in graph(u)} zk_wf gathered to the nodes (..., N, m) (or (..., 1, m) for one graph)."""
    c = _key_max(zk, batch)
    e = torch.exp(zk - c)
    if batch is None:
        return e.sum(-2, keepdim=True).log() + c
    return batch.gather(batch.segment_sum(e)).log() + c


class _EdgeLogSumExp(torch.autograd.Function):
    """out_e = LSE_f(zq[u_e, :, f] + zk[w_e, :, f]) for edges (u_e, w_e): zq, zk (N, L, m) NODE-MAJOR (the
    L = prod(leading dims) slices of a node contiguous, so each edge block gathers whole contiguous rows)
    -> (E, L).

    Formed in edge blocks of bounded size (EDGE_BLOCK_ELEMENTS); saves zq, zk and out only (never
    an (E, L, m) tensor), so edge_log_likelihood's memory is O(N L m + E L) forward and backward.
    Backward: with p_ef = exp(zq_uf + zk_wf - out_e) (the softmax over f), d zq_u = sum_{e: u_e = u} g_e p_e
    and d zk_w = sum_{e: w_e = w} g_e p_e, in the same blocks. Once differentiable."""

    @staticmethod
    def forward(ctx, zq, zk, u, w, block):
        outs = []
        for s in range(0, u.numel(), block):
            t = zq.index_select(0, u[s:s + block])
            t += zk.index_select(0, w[s:s + block])
            top = t.amax(-1)  # finite: zq and zk are (checked after the call: _edge_terms' flag)
            outs.append(t.sub_(top.unsqueeze(-1)).exp_().sum(-1).log_().add_(top))  # logsumexp, in place
        out = torch.cat(outs, 0) if outs else zq.new_zeros((0, zq.shape[1]))
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
            t = zq.index_select(0, us)
            t += zk.index_select(0, ws)
            p = t.sub_(out[s:s + ctx.block].unsqueeze(-1)).exp_().mul_(g[s:s + ctx.block].unsqueeze(-1))
            add_into(dq, us, p)  # not index_add_: its atomics give other bits at every CUDA run (fast.segments)
            add_into(dk, ws, p)
        return dq, dk, None, None, None


def _node_major(z: torch.Tensor) -> torch.Tensor:
    """(..., N, m) -> (N, L, m) contiguous, L = prod(leading dims) (one copy; differentiable)."""
    return z.movedim(-2, 0).reshape(z.shape[-2], -1, z.shape[-1]).contiguous()


def kernelized_attention_rows(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, rows, *,
                              tau: float = 1.0, batch=None) -> torch.Tensor:
    """The learned latent graph's weights pi_uv for the queries u in ``rows`` (wu22 Eq. 5's weights).

        pi_uv = phi(q_u) . phi(k_v) / (phi(q_u) . sum_{w in graph(u)} phi(k_w))   (v in graph(u); 0 outside)

    at kernelized_softmax's 1/sqrt(tau) scaling (no noise), in log space:
    log pi_uv = LSE_f(zq_uf + zk_vf) - LSE_f(zq_uf + LSE_{w in graph(u)} zk_wf). q, k: (..., N, d_qk);
    rows: node ids (R,) in [0, N) -> (..., R, N), each row summing to 1 over its graph. O(R N m) in
    key blocks of bounded memory; for heatmaps. ValueError naming tau (exponents beyond the
    dtype's range, with the numbers; never NaN) or rows (out of range); TypeError for non-integer
    rows; MemoryError naming rows when (..., R, N) would not fit in memory. Host reads: the rows'
    range, check_batch's (with a batch vector), one final flag.

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import kernelized_attention_rows
        >>> phi = lambda x: torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)  # FAVOR+ (Eq. 4), W = w
        >>> a = phi(q) @ phi(k).T  # dense (N, N) kernel; x = q d^(-1/4) / sqrt(tau) = q here
        >>> pi = kernelized_attention_rows(q, k, w, [0, 2], tau=0.5)
        >>> tuple(pi.shape), bool(torch.allclose(pi, (a / a.sum(-1, keepdim=True))[[0, 2]]))
        ((2, 6), True)
    """
    _check_qk(q, k, projection)
    tau = check_tau(tau)
    n = q.shape[-2]
    b = check_batch(batch, n, device=q.device)
    try:
        rows_t = torch.as_tensor(rows, device=q.device) if not isinstance(rows, torch.Tensor) else rows.to(q.device)
    except (TypeError, ValueError, RuntimeError) as exc:  # torch says only "Could not infer dtype of ..."
        raise TypeError(f"rows must be a 1-D integer tensor or sequence of node ids, got {type(rows).__name__}") \
            from exc
    if rows_t.dtype.is_floating_point or rows_t.dtype == torch.bool or rows_t.dim() != 1:
        raise TypeError(f"rows must be a 1-D integer tensor or sequence of node ids, got {rows_t.dtype} of shape "
                        f"{tuple(rows_t.shape)}")
    rows_t = rows_t.to(torch.int64)
    if rows_t.numel():
        lo, hi = torch.stack([rows_t.min(), rows_t.max()]).tolist()
        if lo < 0 or hi >= n:
            raise ValueError(f"rows must be node ids in [0, N = {n}), got values in [{lo}, {hi}]")
    check_allocation(f"rows of R = {rows_t.numel()} node ids", (*q.shape[:-2], rows_t.numel(), n),
                     compute_dtype(torch.promote_types(q.dtype, k.dtype)), q.device, copies=3,
                     what="the attention rows (..., R, N) and their log-space blocks")
    zq, zk = _exponents(q, k, projection, tau)
    lk = _log_key_sums(zk, b)
    # gathers whose backward sums by row without atomics (fast.segments); R bounds a row's repeats (no host read)
    picked = Segments(rows_t, n, longest=rows_t.numel())
    zr = picked.expand(zq, dim=-2)  # (..., R, m)
    lk_r = lk if b is None else picked.expand(lk, dim=-2)
    log_den = torch.logsumexp(zr + lk_r, -1)  # (..., R)
    lead_size = max(1, math.prod(zq.shape[:-2]))
    block = max(1, ROWS_BLOCK_ELEMENTS // max(1, lead_size * max(1, rows_t.numel()) * zq.shape[-1]))
    parts = []
    for s in range(0, n, block):
        zk_b = zk[..., s:s + block, :]
        parts.append(torch.logsumexp(zr.unsqueeze(-2) + zk_b.unsqueeze(-3), -1))  # (..., R, B)
    log_pi = torch.cat(parts, -1) - log_den.unsqueeze(-1)
    pi = torch.exp(log_pi)
    if not _read_flags(torch.isfinite(log_den.detach()).all(), ~torch.isnan(pi.detach()).any()):
        _diagnose(q, k, projection, tau)
    if b is not None:
        same = b.index[rows_t].unsqueeze(-1) == b.index.unsqueeze(0)  # (R, N)
        pi = pi.masked_fill(~same, 0.0)
    return pi.to(q.dtype)


def edge_log_likelihood(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, *,
                        tau: float = 1.0, batch=None) -> torch.Tensor:
    """Per-node edge log-likelihood l_u = (1/d_u) sum_{v: (u,v) in E} log pi_uv (wu22 Eqs. 10, 12).

    pi_uv as in kernelized_attention_rows (no noise, the same tau scaling); d_u the stored entries
    of row u (a self-loop counts once; l_u = 0 for an isolated node). q, k: (..., N, d_qk); graph:
    anything fast.as_graph accepts for N nodes (pass a fast.Graph built once in a loop) ->
    (..., N) in q's dtype (float32 arithmetic for halves). Log space with the shared per-graph key
    sums, O(E m + N m): never -inf or NaN from finite input. ValueError naming tau (exponents
    beyond the dtype's range, e.g. tau = 1e-40 in float32, with the numbers), graph (indices out
    of [0, N)) or batch (an edge between two graphs).

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import edge_log_likelihood
        >>> phi = lambda x: torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)  # FAVOR+ (Eq. 4), W = w
        >>> a = phi(q) @ phi(k).T  # dense (N, N) kernel; x = q d^(-1/4) / sqrt(tau) = q here
        >>> edges = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 0, 3, 2, 5, 4]])  # three pairs: degree 1
        >>> out = edge_log_likelihood(q, k, w, edges, tau=0.5)
        >>> bool(torch.allclose(out, (a / a.sum(-1, keepdim=True))[torch.arange(6), edges[1]].log()))
        True
    """
    return _edge_terms(q, k, projection, graph, tau, batch).to(q.dtype)


def _edge_terms(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, tau: float,
                batch) -> torch.Tensor:
    """edge_log_likelihood in the compute dtype (float32 for halves). The per-edge terms gather whole
    node rows of the node-major (N, L, m) exponents (_EdgeLogSumExp)."""
    _check_qk(q, k, projection)
    tau = check_tau(tau)
    n = q.shape[-2]
    b = check_batch(batch, n, device=q.device)
    g = _graph_of(graph, n, q.device)
    zq, zk = _exponents(q, k, projection, tau)
    lk = _log_key_sums(zk, b)
    log_den = torch.logsumexp(zq + lk, -1)  # (..., N)
    lead = zq.shape[:-2]
    lead_size = max(1, math.prod(lead))
    block = max(1, EDGE_BLOCK_ELEMENTS // (lead_size * zq.shape[-1]))
    log_num = _EdgeLogSumExp.apply(_node_major(zq), _node_major(zk), g.row, g.col, block)  # (E, L)
    rows = _row_segments(g)  # the edges by their row: gather and sum without atomics (fast.segments)
    log_pi = log_num - rows.expand(log_den.reshape(lead_size, n).T, dim=0)  # (E, L)
    total = rows.sum(log_pi, dim=0)  # (N, L)
    deg = g.degree.to(log_pi.dtype).clamp(min=1.0).unsqueeze(-1)
    out = (total / deg).T.reshape(*lead, n)
    inside = _inside_flag(g, b)
    if not _read_flags(torch.isfinite(out.detach()).all(), inside):
        if inside is not None and not bool(inside):
            _raise_crossing(g, b)
        _diagnose(q, k, projection, tau)
    return out


def _row_segments(g: Graph) -> Segments:
    """The graph's stored entries grouped by row (CSR order: sorted), planned once and cached on g."""
    cache = _graph_cache(g)
    seg = cache.get((_CACHE_KEY, "rows"))
    if seg is None:
        seg = cache[(_CACHE_KEY, "rows")] = Segments(g.row, g.n, sorted=True)
    return seg


def edge_loss(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor, graph: object, *,
              tau: float = 1.0, batch=None) -> torch.Tensor:
    """The edge-level regularisation of one layer (wu22 Eq. 10): -(1/N) sum_u l_u, averaged over the
    leading (batch, head) dims -> 0-dim tensor. l_u: edge_log_likelihood. (NodeFormer's code averages
    over edges instead: N/E times this; documented difference.) Differentiable in q and k. A loss:
    float32 for half-precision inputs (summed from the float32 terms, never rounded to 8 bits).
    O(E m + N m); errors as edge_log_likelihood's.

        >>> import torch
        >>> q, k, v, w = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> from fast.latent.nodeformer import edge_log_likelihood, edge_loss
        >>> edges = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 0, 3, 2, 5, 4]])
        >>> loss = edge_loss(q, k, w, edges, tau=0.5)
        >>> loss.dim(), bool(torch.isclose(loss, -edge_log_likelihood(q, k, w, edges, tau=0.5).mean()))
        (0, True)
    """
    return -_edge_terms(q, k, projection, graph, tau, batch).mean()
