"""nn.Module layers for learned latent graphs: NodeFormerConv (wu22), DIFFormerAttention, SGFormerAttention.

Drop-in layers over node features x (N, in_dim) -> (N, out_dim), built on fast.latent.nodeformer
and fast.latent.simple_attention (the equations are documented there). Several graphs in one call
are concatenated along N with a sorted PyG ``batch`` vector (fast.batching.check_batch). Weights,
NodeFormer's FAVOR+ projection and its Gumbel noise come only from the layer's ``generator``
(never torch's global RNG, which nn.Linear's own initialisation would advance): layers built from
generators seeded alike, fed alike, compute alike. Memory is linear in N: autograd keeps
O(N (m + d)) per head for NodeFormer (O(K N m) with K Gumbel samples, O(E m) for the relational
bias and the edge loss) and O(N d) for DIFFormer and SGFormer (tests/fast/latent/test_layers.py
measures it).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from fast.features import gaussian_projection
from fast.latent.nodeformer import check_tau
from fast.validation import check_allocation, check_positive_int

__all__ = ["NodeFormerConv", "DIFFormerAttention", "SGFormerAttention"]

_NORMALIZE = ("sym", None)


def _generator(generator: torch.Generator | None) -> torch.Generator:
    if generator is None:
        generator = torch.Generator()
        generator.seed()  # fresh, OS-seeded: torch's global RNG is never read or advanced
        return generator
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def linear(in_dim: int, out_dim: int, generator: torch.Generator, bias: bool = True) -> nn.Linear:
    """nn.Linear(in_dim, out_dim) with PyTorch's default initialisation (Kaiming-uniform weights and
    a uniform bias, both within +-1/sqrt(in_dim)) drawn from ``generator``; torch's global RNG is
    not touched. O(in_dim out_dim). MemoryError naming in_dim and out_dim when the (out_dim, in_dim)
    float32 weight would not fit in memory.

        >>> import torch
        >>> from fast.latent.layers import linear
        >>> a, b = (linear(4, 3, torch.Generator().manual_seed(0)) for _ in range(2))
        >>> tuple(a.weight.shape), bool(torch.equal(a.weight, b.weight)), bool(a.weight.abs().max() <= 0.5)
        ((3, 4), True, True)
    """
    check_allocation(f"in_dim = {in_dim}, out_dim = {out_dim}", (out_dim, in_dim), torch.float32,
                     what="a linear layer's weight")
    layer = torch.nn.utils.skip_init(nn.Linear, in_dim, out_dim, bias=bias)
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        if bias:
            bound = 1.0 / math.sqrt(in_dim)
            layer.bias.uniform_(-bound, bound, generator=generator)
    return layer


def _flag(name: str, value: object) -> bool:
    """A constructor's switch: a bool (NumPy's too); TypeError naming it otherwise ("no" or 0.5 would
    read as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _check_x(x: object, in_dim: int, layer: nn.Module) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (N, {in_dim}), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got dtype {x.dtype}")
    held = layer.w_q.weight.dtype
    if x.dtype != held:  # torch's own message names mat1 and mat2, not the layer or the fix
        name = type(layer).__name__
        raise TypeError(f"x is {x.dtype} but this {name} holds {held} weights: convert the input "
                        f"(x.to({held})) or the layer (layer.to({x.dtype}))")
    if x.dim() != 2 or x.shape[1] != in_dim:
        raise ValueError(f"x must have shape (N, {in_dim}) (nodes, in_dim), got {tuple(x.shape)}")
    if x.shape[0] < 1:
        raise ValueError("x has no nodes (N = 0)")
    if not torch.isfinite(x).all():
        raise ValueError(f"x has {int((~torch.isfinite(x)).sum())} non-finite entries (NaN or inf)")
    return x


def _batch(batch, n: int, device):
    from fast.batching import check_batch

    return check_batch(batch, n, name="batch", device=device)


def _rows(rows: object, device) -> torch.Tensor:
    """Query node ids as a 1-d int64 tensor; TypeError for non-integer ids (floats, bools), which a
    plain cast to long would silently truncate."""
    try:
        t = torch.as_tensor(rows)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"rows must be a sequence of integer node ids, got {type(rows).__name__}") from exc
    if t.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"rows must be integer node ids, got dtype {t.dtype}")
    if t.dim() != 1:
        raise TypeError(f"rows must be a 1-d sequence (R,) of node ids, got shape {tuple(t.shape)}")
    return t.to(device=device, dtype=torch.long)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(N, H d) -> (H, N, d)."""
    n = t.shape[0]
    return t.reshape(n, heads, -1).transpose(0, 1)


class NodeFormerConv(nn.Module):
    """One NodeFormer layer (wu22 Sec. 3, Eqs. 5-8, 10): all-pair message passing over a latent
    graph sampled by the kernelized Gumbel-softmax, plus the relational bias of the input graph.

    Per head h (H = ``heads``, head width d = out_dim), with q, k, v = x W_q^h, x W_k^h, x W_v^h (N, d)::

        z^h = kernelized_gumbel_softmax(q, k, v) (Eq. 7, K samples; evaluation mode: the noise-free
              kernelized_softmax, Eq. 5, at the same tau) + sum_{r=1..order} sigmoid(b_r) A~_r v (Eq. 8)
        out = [z^1 ... z^H] W_o                                     (N, out_dim)

    and this layer's edge loss (Eq. 10, fast.latent.nodeformer.edge_loss, averaged over heads); the
    model adds lambda times its mean over layers to the classification loss (Eq. 12).

    Args:
        in_dim, out_dim: feature widths (out_dim is also the head width d).
        heads: H >= 1. m: FAVOR+ features (>= 1). tau: Gumbel temperature (> 0, finite).
        samples: K >= 1 Gumbel samples per training-mode forward. gumbel: False uses the plain
            kernelized softmax in training too. relational_bias: add Eq. 8 when a graph is given,
            with ``order`` and ``normalize`` as in fast.latent.nodeformer.relational_bias; b
            (order,), learnable, starts at 0 (NodeFormer's code keeps one b per order and head,
            initialised to 0.1).
        generator: torch.Generator for the weights, the projection (drawn once here; orthogonal
            blocks, Performer's ORF, unless orthogonal=False) and the Gumbel noise; None: a fresh
            OS-seeded one. redraw: draw a new projection at every training-mode forward
            (NodeFormer's code does; the default keeps it fixed, so eval and train share the kernel).

    forward(x (N, in_dim), graph=None, batch=None, *, noise=None) -> (out (N, out_dim), edge_loss:
    0-dim in training mode with a graph, else None: evaluation skips the O(E m) work, which
    NodeFormer's code does and then discards). ``graph``: anything fast.as_graph accepts on the N
    nodes (a fast.Graph built once skips the conversion at every call); ``noise``: Gumbel noise
    (K, H, N) to use instead of drawing it (training mode only). O(H (K N m d + order E d + E m)).
    ValueError / TypeError naming the argument for bad constructor arguments, x (shape, NaN or
    inf), batch, graph, or noise in evaluation mode.

        >>> import torch
        >>> from fast.latent.layers import NodeFormerConv
        >>> conv = NodeFormerConv(5, 4, heads=2, m=8, samples=2, generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
        >>> out, loss = conv(x, torch.tensor([[0, 1, 2, 3, 4, 5], [1, 0, 3, 2, 5, 4]]))
        >>> tuple(out.shape), loss.dim()
        ((6, 4), 0)
        >>> rows = conv.attention_rows(x, [0])  # (heads, R, N): the latent graph's weights
        >>> [round(t, 4) for t in rows.sum(-1).flatten().tolist()]
        [1.0, 1.0]
    """

    def __init__(self, in_dim: int, out_dim: int, *, heads: int = 4, m: int = 30, tau: float = 0.25,
                 samples: int = 10, gumbel: bool = True, relational_bias: bool = True, order: int = 1,
                 normalize: str | None = "sym", generator: torch.Generator | None = None, redraw: bool = False,
                 orthogonal: bool = True):
        super().__init__()
        self.in_dim = check_positive_int("in_dim", in_dim, "an int >= 1")
        self.out_dim = check_positive_int("out_dim", out_dim, "an int >= 1")
        self.heads = check_positive_int("heads", heads, "an int >= 1")
        self.m = check_positive_int("m", m, "an int >= 1")
        self.samples = check_positive_int("samples", samples, "an int >= 1")
        self.order = check_positive_int("order", order, "an int >= 1")
        self.tau = check_tau(tau)
        if normalize not in _NORMALIZE:
            raise ValueError(f"normalize must be 'sym' or None, got {normalize!r}")
        self.normalize = normalize
        self.gumbel, self.relational_bias, self.redraw, self.orthogonal = (
            _flag("gumbel", gumbel), _flag("relational_bias", relational_bias), _flag("redraw", redraw),
            _flag("orthogonal", orthogonal))
        self.generator = _generator(generator)
        width = self.heads * self.out_dim
        self.w_q = linear(self.in_dim, width, self.generator)
        self.w_k = linear(self.in_dim, width, self.generator)
        self.w_v = linear(self.in_dim, width, self.generator)
        self.w_o = linear(width, self.out_dim, self.generator)
        check_allocation(f"order = {self.order}", (self.order,), torch.float32, what="the relational bias weights b")
        self.b = nn.Parameter(torch.zeros(self.order))
        self.register_buffer("projection", gaussian_projection(self.m, self.out_dim, orthogonal=self.orthogonal,
                                                               generator=self.generator))

    def extra_repr(self) -> str:
        return (f"{self.in_dim}, {self.out_dim}, heads={self.heads}, m={self.m}, tau={self.tau}, "
                f"samples={self.samples}, gumbel={self.gumbel}, relational_bias={self.relational_bias}, "
                f"order={self.order}, normalize={self.normalize!r}")

    def redraw_projection(self) -> None:
        """Draw a new projection (m, d) from the layer's generator, in place."""
        w = gaussian_projection(self.m, self.out_dim, orthogonal=self.orthogonal, generator=self.generator)
        self.projection.copy_(w.to(self.projection))

    def _qkv(self, x: torch.Tensor):
        return (_heads(self.w_q(x), self.heads), _heads(self.w_k(x), self.heads), _heads(self.w_v(x), self.heads))

    def forward(self, x: torch.Tensor, graph=None, batch=None, *, noise: torch.Tensor | None = None):
        from fast.latent.nodeformer import edge_loss, nodeformer_attention

        x = _check_x(x, self.in_dim, self)
        _batch(batch, x.shape[0], x.device)
        if noise is not None and not self.training:
            raise ValueError("noise was given in evaluation mode (model.eval()): evaluation uses no Gumbel noise")
        if self.redraw and self.training:
            self.redraw_projection()
        q, k, v = self._qkv(x)
        proj = self.projection.to(q.dtype)
        use_graph = graph if self.relational_bias else None
        z = nodeformer_attention(q, k, v, proj, graph=use_graph, b=self.b if use_graph is not None else None,
                                 order=self.order, normalize=self.normalize, tau=self.tau, samples=self.samples,
                                 noise=noise, generator=self.generator if noise is None else None,
                                 training=self.training, gumbel=self.gumbel, batch=batch)
        out = self.w_o(z.transpose(0, 1).reshape(x.shape[0], -1))
        loss = None if graph is None or not self.training else edge_loss(q, k, proj, graph, tau=self.tau,
                                                                           batch=batch)
        return out, loss

    def attention_rows(self, x: torch.Tensor, rows, batch=None) -> torch.Tensor:
        """The learned latent graph's weights (heads, R, N): row r is the noise-free attention
        pi_{u, .} of the query node u = rows[r] over every node of its graph (rows sum to 1;
        0 outside u's graph), fast.latent.nodeformer.kernelized_attention_rows at this layer's tau.
        O(R N m) per head. Call under torch.no_grad() for a picture."""
        from fast.latent.nodeformer import kernelized_attention_rows

        x = _check_x(x, self.in_dim, self)
        _batch(batch, x.shape[0], x.device)
        rows = _rows(rows, x.device)
        q, k, _ = self._qkv(x)
        return kernelized_attention_rows(q, k, self.projection.to(q.dtype), rows, tau=self.tau, batch=batch)


class _SimpleAttention(nn.Module):
    """Shared body of DIFFormerAttention and SGFormerAttention (``_op`` picks the formula)."""

    _op_name = ""

    def __init__(self, in_dim: int, out_dim: int, *, heads: int = 1, joint_heads: bool = True,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.in_dim = check_positive_int("in_dim", in_dim, "an int >= 1")
        self.out_dim = check_positive_int("out_dim", out_dim, "an int >= 1")
        self.heads = check_positive_int("heads", heads, "an int >= 1")
        self.joint_heads = _flag("joint_heads", joint_heads)
        gen = _generator(generator)
        width = self.heads * self.out_dim
        self.w_q = linear(self.in_dim, width, gen)
        self.w_k = linear(self.in_dim, width, gen)
        self.w_v = linear(self.in_dim, width, gen)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, heads={self.heads}, joint_heads={self.joint_heads}"

    def forward(self, x: torch.Tensor, batch=None) -> torch.Tensor:
        import fast.latent.simple_attention as sa

        x = _check_x(x, self.in_dim, self)
        _batch(batch, x.shape[0], x.device)
        q, k, v = (_heads(w(x), self.heads) for w in (self.w_q, self.w_k, self.w_v))
        z = getattr(sa, self._op_name)(q, k, v, batch=batch, joint_heads=self.joint_heads)  # (H, N, d)
        return z.mean(0)


class DIFFormerAttention(_SimpleAttention):
    """DIFFormer's simple (linear) global attention (tutorial; DIFFormer), heads averaged.

    Per head, with Q = x W_q, K = x W_k, V = x W_v (N, d) and q~ = Q / ||Q||_F, k~ = K / ||K||_F
    (Frobenius norm per graph, over heads too with joint_heads=True, the authors' code)::

        z_u = (sum_v v_v + q~_u . sum_v k~_v v_v^T) / (N_g + q~_u . sum_w k~_w)

    out = mean over heads of z (N, out_dim): O(N d^2), fast.latent.simple_attention.difformer_attention.
    forward(x (N, in_dim), batch=None) -> (N, out_dim); weights drawn from ``generator``. ValueError /
    TypeError naming in_dim, out_dim, heads, generator, x or batch. Graphs of a batch never mix:

        >>> import torch
        >>> from fast.latent.layers import DIFFormerAttention
        >>> layer = DIFFormerAttention(5, 4, heads=2, generator=torch.Generator().manual_seed(0))
        >>> x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
        >>> two = layer(x, batch=torch.tensor([0, 0, 0, 1, 1, 1]))
        >>> tuple(two.shape), bool(torch.allclose(two[:3], layer(x[:3])))
        ((6, 4), True)
    """

    _op_name = "difformer_attention"


class SGFormerAttention(_SimpleAttention):
    """SGFormer's simple global attention (SGFormer), heads averaged: as DIFFormerAttention but
    the constant term is the node's own value N_g v_u instead of the sum of all values::

        z_u = (N_g v_u + q~_u . sum_v k~_v v_v^T) / (N_g + q~_u . sum_w k~_w)

    O(N d^2), fast.latent.simple_attention.sgformer_attention. forward(x (N, in_dim), batch=None) -> (N, out_dim).
    Errors as DIFFormerAttention's. Layers from generators seeded alike compute alike:

        >>> import torch
        >>> from fast.latent.layers import SGFormerAttention
        >>> a, b = (SGFormerAttention(5, 4, generator=torch.Generator().manual_seed(0)) for _ in range(2))
        >>> x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
        >>> tuple(a(x).shape), bool(torch.equal(a(x), b(x)))
        ((6, 4), True)
    """

    _op_name = "sgformer_attention"
