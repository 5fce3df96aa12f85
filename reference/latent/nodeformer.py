"""NodeFormer (wu22) the obvious way: dense float64 NumPy, N x N matrices (twin of fast/latent/nodeformer.py).

Shapes: q, k (..., N, d_qk); v (..., N, d); w the (m, d_qk) projection; batch None or (N,) sorted
graph ids (PyG convention), masking A to the block diagonal same[u, v] = batch[u] == batch[v].
Kernel scaling as in fast/ (docs/papers.md Sec. 4): FAVOR+ features (wu22 Eq. 4) of
x = q d_qk^(-1/4) / sqrt(tau), so phi(q) . phi(k) estimates exp(q.k / (sqrt(d_qk) tau)). The kernel
matrix A is formed in log space, log A_uv = LSE_f(z_uf + z_vf) - log m with z = w.x - |x|^2/2, so
that a small tau does not overflow: O(N^2 m) time and O(N^2) memory per leading slice.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from reference._checks import generator, integer, real_array, real_scalar
from reference.budget import check_dense_budget
from reference.graphs import adjacency

__all__ = ["batch_mask", "gumbel_noise", "kernelized_softmax", "kernelized_gumbel_softmax", "exact_gumbel_softmax",
           "adjacency_orders", "relational_bias", "nodeformer_attention", "attention_weights",
           "edge_log_likelihood", "edge_loss"]


def _tau(tau) -> float:
    t = real_scalar("tau", tau)
    if not np.isfinite(t) or t <= 0:
        raise ValueError(f"tau must be a finite number > 0, got {t!r}")
    return t


def batch_mask(batch, n: int) -> np.ndarray:
    """same (N, N) float64: 1 where batch[u] == batch[v] (all ones for batch None). batch (N,):
    integer labels >= 0, sorted (TypeError for a non-integer batch, ValueError naming batch for a
    wrong shape, a negative label or an unsorted batch); n an int >= 1. O(N^2).

        >>> from reference.latent.nodeformer import batch_mask
        >>> batch_mask([0, 0, 1], 3).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    n = integer("n", n)
    if batch is None:
        return np.ones((n, n))
    b = np.asarray(batch)
    if b.dtype == np.bool_ or not np.issubdtype(b.dtype, np.integer):
        raise TypeError(f"batch must be an integer array (N,), got dtype {b.dtype}")
    if b.shape != (n,):
        raise ValueError(f"batch has shape {b.shape} but the inputs have N = {n} nodes")
    if (b < 0).any():
        raise ValueError("batch labels must be >= 0")
    if (np.diff(b) < 0).any():
        raise ValueError("batch must be sorted (PyG convention: each graph's nodes are contiguous)")
    return (b[:, None] == b[None, :]).astype(np.float64)


def gumbel_noise(shape, rng: np.random.Generator) -> np.ndarray:
    """Standard Gumbel noise -log(-log U) of ``shape``, U uniform on (0, 1) (clamped into [tiny, 1 - eps/2]),
    float64, finite. For the Gumbel-softmax the shape is (K, *k.shape[:-1]): one value per sample,
    leading slice and key node (wu22 Eqs. 6-7). TypeError unless rng is a numpy.random.Generator.
    O(prod(shape)).

        >>> import numpy as np
        >>> from reference.latent.nodeformer import gumbel_noise
        >>> g = gumbel_noise((2, 5), np.random.default_rng(0))
        >>> g.shape, bool(np.isfinite(g).all())
        ((2, 5), True)
    """
    rng = generator("rng", rng)
    u = np.clip(rng.random(shape), np.finfo(float).tiny, 1.0 - np.finfo(float).eps / 2)
    return -np.log(-np.log(u))


def _log_kernel(q, k, w, tau) -> np.ndarray:
    """log (phi(q_u) . phi(k_v)) (..., N, N) at the 1/sqrt(tau) scaling, by log-sum-exp over the m features."""
    q, k, w = real_array("q", q, finite=True), real_array("k", k, finite=True), real_array("w", w, finite=True)
    d, m = w.shape[1], w.shape[0]
    s = d ** -0.25 / np.sqrt(tau)
    xq, xk = q * s, k * s
    zq = xq @ w.T - 0.5 * np.sum(xq * xq, -1, keepdims=True)  # = log(sqrt(m) favor_plus(xq, w))
    zk = xk @ w.T - 0.5 * np.sum(xk * xk, -1, keepdims=True)
    lead = np.broadcast_shapes(zq.shape[:-2], zk.shape[:-2])
    check_dense_budget(zq.shape[-2], "NodeFormer log-kernel matrix", copies=3 * max(1, int(np.prod(lead))))
    out = np.full((*lead, zq.shape[-2], zk.shape[-2]), -np.inf)
    for f in range(m):  # log sum_f exp(zq_uf + zk_vf), one feature at a time: N x N memory
        out = np.logaddexp(out, zq[..., :, None, f] + zk[..., None, :, f])
    return out - np.log(m)


def _log_normalise(log_a: np.ndarray, same: np.ndarray) -> np.ndarray:
    """log pi = log A - LSE over the same graph, from log A (..., N, N), directly in log space (-inf
    outside the graph only): never log(exp(.)), so a weight below float64's range stays finite."""
    log_a = np.where(same > 0, log_a, -np.inf)
    top = log_a.max(-1, keepdims=True)
    lse = top + np.log(np.exp(log_a - top).sum(-1, keepdims=True))
    return log_a - lse


def _normalise(log_a: np.ndarray, same: np.ndarray) -> np.ndarray:
    """pi = A / row sums over the same graph, from log A (..., N, N) (zero outside the graph)."""
    log_a = np.where(same > 0, log_a, -np.inf)
    top = log_a.max(-1, keepdims=True)
    a = np.exp(log_a - top)
    return a / a.sum(-1, keepdims=True)


def attention_weights(q, k, w, *, tau: float = 1.0, batch=None) -> np.ndarray:
    """pi (..., N, N): pi_uv = phi(q_u).phi(k_v) / sum_{w in graph(u)} phi(q_u).phi(k_w) (Eq. 5's weights).

    Raises TypeError for complex input, ValueError for non-finite input or a tau that is not a
    finite number > 0, as batch_mask, and MemoryError over the dense budget. O(N^2 m).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import attention_weights
        >>> pi = attention_weights(q, k, w, batch=np.array([0, 0, 1, 1]))
        >>> pi.shape, bool(np.allclose(pi.sum(-1), 1.0)), float(pi[0, 2])
        ((4, 4), True, 0.0)
    """
    tau = _tau(tau)
    log_a = _log_kernel(q, k, w, tau)
    return _normalise(log_a, batch_mask(batch, log_a.shape[-1]))


def kernelized_softmax(q, k, v, w, *, tau: float = 1.0, batch=None) -> np.ndarray:
    """wu22 Eq. 5 (at the 1/sqrt(tau) scaling): pi v, dense, (..., N, d). Raises as
    attention_weights. O(N^2 (m + d)).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import attention_weights, kernelized_softmax
        >>> z = kernelized_softmax(q, k, v, w, tau=0.5)
        >>> z.shape, bool(np.allclose(z, attention_weights(q, k, w, tau=0.5) @ v))
        ((4, 3), True)
    """
    v = real_array("v", v, finite=True)
    return attention_weights(q, k, w, tau=tau, batch=batch) @ v


def kernelized_gumbel_softmax(q, k, v, w, noise, *, tau: float, batch=None) -> np.ndarray:
    """wu22 Eqs. 7, 14-17: mean over samples s of normalise(A * exp(g_s / tau) per key) v, dense,
    (..., N, d). noise (K, *k.shape[:-1]): one standard Gumbel per sample, leading slice and key
    node (``gumbel_noise``); g_s / tau is added to log A, never exponentiated alone.

    Raises as attention_weights (naming noise too). O(K N^2 (m + d)).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import kernelized_gumbel_softmax, kernelized_softmax
        >>> z = kernelized_gumbel_softmax(q, k, v, w, np.zeros((3, 4)), tau=0.5)  # no noise: Eq. 5
        >>> bool(np.allclose(z, kernelized_softmax(q, k, v, w, tau=0.5)))
        True
    """
    tau = _tau(tau)
    v = real_array("v", v, finite=True)
    noise = real_array("noise", noise, finite=True)
    log_a = _log_kernel(q, k, w, tau)
    same = batch_mask(batch, log_a.shape[-1])
    outs = [_normalise(log_a + g[..., None, :] / tau, same) @ v for g in noise]
    return np.mean(outs, axis=0)


def exact_gumbel_softmax(q, k, v, noise=None, *, tau: float, batch=None) -> np.ndarray:
    """wu22 Eq. 6 with the exact kernel: mean over samples of softmax_v((q_u.k_v / sqrt(d) + g_sv) / tau) v.

    noise None: the plain softmax at temperature tau (no samples); noise (K, *k.shape[:-1]) as in
    kernelized_gumbel_softmax. q, k (..., N, d_qk), v (..., N, d) -> (..., N, d). Raises as
    attention_weights. O(K N^2 (d_qk + d)).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference import softmax_attention
        >>> from reference.latent.nodeformer import exact_gumbel_softmax
        >>> bool(np.allclose(exact_gumbel_softmax(q, k, v, tau=1.0), softmax_attention(q, k, v)))
        True
    """
    tau = _tau(tau)
    q, k, v = real_array("q", q, finite=True), real_array("k", k, finite=True), real_array("v", v, finite=True)
    logits = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    same = batch_mask(batch, logits.shape[-1])
    if noise is None:
        return _normalise(logits / tau, same) @ v
    noise = real_array("noise", noise, finite=True)
    return np.mean([_normalise((logits + g[..., None, :]) / tau, same) @ v for g in noise], axis=0)


def adjacency_orders(adj, order: int) -> list[sp.csr_matrix]:
    """[A_1, ..., A_order]: the 0/1 patterns (N, N) of A^r (A = the pattern of adj: pairs joined by a
    walk of exactly r hops), as scipy csr, via dense powers. order an int >= 1; raises as
    reference.graphs.adjacency. O(order N^3).

        >>> import numpy as np
        >>> from reference.latent.nodeformer import adjacency_orders
        >>> path = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
        >>> [a.toarray()[0].tolist() for a in adjacency_orders(path, 2)]
        [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
    """
    order = integer("order", order)
    a = (adjacency(adj).toarray() != 0).astype(np.float64)
    out, p = [], np.eye(a.shape[0])
    for _ in range(order):
        p = p @ a
        out.append(sp.csr_matrix((p > 0).astype(np.float64)))
    return out


def relational_bias(v, adj, b, *, order: int = 1, normalize: str | None = "sym") -> np.ndarray:
    """wu22 Eq. 8's bias term sum_r sigmoid(b_r) A~_r v, dense, (..., N, d). b: a number or an
    (order,) array; A_r the 0/1 pattern of A^r (``adjacency_orders``), A~_r = D_r^-1/2 A_r D_r^-1/2
    (normalize="sym", the authors' code) or A_r (None, Eq. 8 as printed).

    Raises ValueError for another normalize, non-finite v or b, a b that does not broadcast to
    (order,); TypeError/ValueError for an order that is not an int >= 1. O(order N^3).

        >>> import numpy as np
        >>> from reference.latent.nodeformer import relational_bias
        >>> path = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
        >>> relational_bias(np.ones((4, 1)), path, 0.0, normalize=None).ravel().tolist()  # sigmoid(0) * degree
        [0.5, 1.0, 1.0, 0.5]
    """
    v = real_array("v", v, finite=True)
    order = integer("order", order)
    if normalize not in ("sym", None):
        raise ValueError(f'normalize must be "sym" or None, got {normalize!r}')
    bs = np.broadcast_to(real_array("b", b, finite=True), (order,))
    out = np.zeros_like(v)
    for r, a in enumerate(adjacency_orders(adj, order)):
        a = a.toarray()
        if normalize == "sym":
            deg = a.sum(1)
            inv = np.where(deg > 0, 1.0 / np.sqrt(np.where(deg > 0, deg, 1.0)), 0.0)
            a = inv[:, None] * a * inv[None, :]
        out = out + (1.0 / (1.0 + np.exp(-bs[r]))) * (a @ v)
    return out


def nodeformer_attention(q, k, v, w, *, graph=None, adj=None, b=None, order: int = 1,
                         normalize: str | None = "sym", tau: float = 0.25, noise=None, batch=None) -> np.ndarray:
    """wu22 Eq. 8: kernelized Gumbel-softmax (noise given) or kernelized softmax (noise None: evaluation)
    plus the relational bias when ``graph`` (an adjacency reference.graphs.adjacency accepts; ``adj``
    is another name for it) is given. Shapes as kernelized_softmax, (..., N, d).

    Raises ValueError when both graph and adj are given, and what kernelized_softmax,
    kernelized_gumbel_softmax and relational_bias raise. O(K N^2 (m + d) + order N^3).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import kernelized_softmax, nodeformer_attention, relational_bias
        >>> path = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
        >>> z = nodeformer_attention(q, k, v, w, graph=path, b=0.0)
        >>> bool(np.allclose(z, kernelized_softmax(q, k, v, w, tau=0.25) + relational_bias(v, path, 0.0)))
        True
    """
    if adj is not None:
        if graph is not None:
            raise ValueError("give the adjacency as graph or as adj, not both")
        graph = adj
    if noise is None:
        z = kernelized_softmax(q, k, v, w, tau=tau, batch=batch)
    else:
        z = kernelized_gumbel_softmax(q, k, v, w, noise, tau=tau, batch=batch)
    if graph is None:
        return z
    return z + relational_bias(v, graph, b, order=order, normalize=normalize)


def edge_log_likelihood(q, k, w, adj, *, tau: float = 1.0, batch=None) -> np.ndarray:
    """l_u = (1/d_u) sum_{(u,v) stored in adj} log pi_uv (..., N), 0 for an isolated node (wu22 Eq. 10).

    log pi_uv = log A_uv - LSE_{w in graph(u)} log A_uw, formed in log space (never the log of an
    exponentiated pi, which underflows to -inf at std 8, d 128, tau 0.25).

    Raises ValueError when adj does not have N nodes, and as attention_weights and
    reference.graphs.adjacency. O(N^2 m).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import edge_log_likelihood
        >>> path = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
        >>> l = edge_log_likelihood(q, k, w, path)
        >>> l.shape, bool((l < 0).all())
        ((4,), True)
    """
    tau = _tau(tau)
    log_a = _log_kernel(q, k, w, tau)
    log_pi = _log_normalise(log_a, batch_mask(batch, log_a.shape[-1]))  # log pi itself: finite on the graph
    a = (adjacency(adj).toarray() != 0).astype(np.float64)
    if a.shape[0] != log_a.shape[-1]:
        raise ValueError(f"adj has {a.shape[0]} nodes but q, k have N = {log_a.shape[-1]}")
    terms = np.where(a > 0, log_pi, 0.0).sum(-1)
    deg = a.sum(1)
    return terms / np.maximum(deg, 1.0)


def edge_loss(q, k, w, adj, *, tau: float = 1.0, batch=None) -> float:
    """-(1/N) sum_u l_u averaged over the leading dims (wu22 Eq. 10, one layer), a float >= 0. Raises
    as edge_log_likelihood. O(N^2 m).

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, w = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
        >>> from reference.latent.nodeformer import edge_log_likelihood, edge_loss
        >>> path = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
        >>> loss = edge_loss(q, k, w, path)
        >>> loss > 0, bool(np.isclose(loss, -edge_log_likelihood(q, k, w, path).mean()))
        (True, True)
    """
    return float(-np.mean(edge_log_likelihood(q, k, w, adj, tau=tau, batch=batch)))
