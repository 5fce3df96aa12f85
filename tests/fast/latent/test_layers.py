"""fast.latent.layers: NodeFormerConv, DIFFormerAttention, SGFormerAttention as nn.Modules.

Gradients (gradcheck, float64, small N) through inputs and parameters; saved-tensor memory linear
in N (the method of tests/fast/test_training_memory.py: distinct storages autograd saves, counted
at two N); train vs eval; reproducibility from the explicit generator (and torch's global RNG
untouched); graphs of a batch never mix; clear errors for bad input.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck
from torch.func import functional_call

from fast.latent.layers import DIFFormerAttention, NodeFormerConv, SGFormerAttention
from tests.fast.test_training_memory import saved_bytes
from tests.helpers import gen


def ring(n: int, offset: int = 0, chords: int = 0) -> torch.Tensor:
    """(2, E) symmetric ring on nodes offset..offset+n-1 (plus ``chords`` i -> i + n/2 edges)."""
    i = torch.arange(n)
    src, dst = [i, (i + 1) % n], [(i + 1) % n, i]
    if chords:
        j = torch.arange(chords)
        src += [j, (j + n // 2) % n]
        dst += [(j + n // 2) % n, j]
    return torch.stack([torch.cat(src), torch.cat(dst)]) + offset


def conv(seed=0, **kw) -> NodeFormerConv:
    args = {"heads": 2, "m": 4, "tau": 0.5, "samples": 3}
    return NodeFormerConv(5, 3, generator=gen(seed), **{**args, **kw})


def x_of(n, dim=5, seed=1, dtype=torch.float32):
    return torch.randn(n, dim, generator=gen(seed), dtype=dtype)


# ------------------------------------------------------------------------------ gradients


def _params_gradcheck(module, call, x):
    """gradcheck of call(module with parameters p, x) in p and x together (float64)."""
    names = [n for n, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in module.named_parameters())
    xx = x.detach().clone().requires_grad_()

    def f(xx, *ps):
        return call(lambda *a, **k: functional_call(module, dict(zip(names, ps)), a, k), xx)

    # fast_mode: the Jacobian checked along random directions (torch's fast gradcheck), one
    # backward per output direction instead of one forward per input entry (35 s -> a few s)
    assert gradcheck(f, (xx, *params), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


@pytest.mark.parametrize("mode", ["eval", "train-fixed-noise", "no-graph"])
def test_nodeformer_gradcheck(mode):
    n = 7
    layer = conv(heads=2, m=3, samples=2).double()
    x = x_of(n, dtype=torch.float64)
    graph = None if mode == "no-graph" else ring(n)
    if mode == "eval":
        layer.eval()
        _params_gradcheck(layer, lambda f, x: f(x, graph)[0], x)
    else:
        noise = -torch.log(-torch.log(torch.rand(2, 2, n, generator=gen(3), dtype=torch.float64)))

        def call(f, x):
            out, loss = f(x, graph, noise=noise)
            return out if loss is None else (out, loss)

        _params_gradcheck(layer, call, x)
    # the bias parameter b is among the checked ones and actually gets a gradient with a graph
    out, loss = layer.train()(x, graph) if mode != "eval" else (layer(x, graph)[0], None)
    (out.sum() + (0 if loss is None else loss)).backward()
    assert (layer.b.grad is not None and layer.b.grad.abs().sum() > 0) == (mode != "no-graph")


@pytest.mark.parametrize("cls", [DIFFormerAttention, SGFormerAttention])
@pytest.mark.parametrize("batched", [False, True])
def test_simple_attention_gradcheck(cls, batched):
    n = 8
    layer = cls(5, 3, heads=2, generator=gen(4)).double()
    x = x_of(n, dtype=torch.float64)
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1]) if batched else None
    _params_gradcheck(layer, lambda f, x: f(x, batch), x)


# ------------------------------------------------------------------------------ memory

H_MEM, M_MEM, D_MEM, K_MEM, IN_MEM = 2, 16, 8, 2, 8


def _nodeformer_saved(n: int) -> int:
    layer = NodeFormerConv(IN_MEM, D_MEM, heads=H_MEM, m=M_MEM, samples=K_MEM, generator=gen(5))
    x = x_of(n, IN_MEM, seed=6).requires_grad_()
    graph = ring(n, chords=n // 4)
    got, (out, loss) = saved_bytes(lambda: layer(x, graph))
    assert out.requires_grad and loss.requires_grad
    return got


def _simple_saved(cls, n: int) -> int:
    layer = cls(IN_MEM, D_MEM, heads=H_MEM, generator=gen(7))
    x = x_of(n, IN_MEM, seed=8).requires_grad_()
    got, out = saved_bytes(lambda: layer(x))
    assert out.requires_grad
    return got


def _nodeformer_bound(n: int) -> int:
    """Per head: K samples of key features and one of query features, q, k, v and the output
    (O(N (K m + d))), and the edge loss's per-edge terms, O(E m) with E <= 2.5 N here; 4 bytes
    each, times 2 of slack (exponents and features both kept, log-sum-exp partials). Measured at
    N = 4096: 6.9 MB of this 10.7 MB bound; one N x N float32 matrix per head is 134 MB."""
    e = 2.5 * n + n  # the ring, its chords and the self-loops a normalisation may add
    per_head = n * ((K_MEM + 2) * M_MEM + 4 * D_MEM) + e * M_MEM
    return int(2 * 4 * (H_MEM * per_head + n * (IN_MEM + H_MEM * D_MEM)))


def test_nodeformer_saved_bytes_are_linear():
    small, large = _nodeformer_saved(2048), _nodeformer_saved(4096)
    assert 1.8 <= large / small <= 2.2, (small, large)
    assert large <= _nodeformer_bound(4096), (large, _nodeformer_bound(4096))
    # power: one N x N float32 attention matrix per head would exceed the bound many times over
    assert H_MEM * 4096**2 * 4 > 10 * _nodeformer_bound(4096)


@pytest.mark.parametrize("cls", [DIFFormerAttention, SGFormerAttention])
def test_simple_attention_saved_bytes_are_linear(cls):
    small, large = _simple_saved(cls, 2048), _simple_saved(cls, 4096)
    assert 1.8 <= large / small <= 2.2, (small, large)
    bound = 4 * 16 * 4096 * (IN_MEM + H_MEM * D_MEM)  # q, k, v, normalised copies, output: O(N d); 1.7 MB measured
    assert large <= bound, (large, bound)
    assert H_MEM * 4096**2 * 4 > 10 * bound


# ------------------------------------------------------------------------------ train vs eval


def test_train_draws_noise_eval_does_not():
    n = 12
    layer, x, graph = conv(), x_of(n), ring(n)
    a, la = layer(x, graph)
    b, lb = layer(x, graph)
    assert not torch.equal(a, b)  # fresh Gumbel noise at every training forward
    assert la is not None and torch.isfinite(la) and torch.equal(la, lb)  # the edge loss uses no noise
    layer.eval()
    c, lc = layer(x, graph)
    d, _ = layer(x, graph)
    assert torch.equal(c, d) and lc is None
    with pytest.raises(ValueError, match="noise"):
        layer(x, graph, noise=torch.zeros(3, 2, n))
    # gumbel=False: no noise in training either; equals the eval output (and a twin built alike)
    plain = conv(gumbel=False)
    assert torch.equal(plain(x, graph)[0], plain.eval()(x, graph)[0])
    assert torch.equal(plain(x, graph)[0], conv(gumbel=False).eval()(x, graph)[0])


def test_noise_given_is_used_and_samples_must_match():
    n = 10
    layer, x = conv(), x_of(n)
    noise = -torch.log(-torch.log(torch.rand(3, 2, n, generator=gen(9))))
    assert torch.equal(layer(x, noise=noise)[0], layer(x, noise=noise)[0])
    assert not torch.equal(layer(x, noise=noise)[0], layer(x, noise=noise + 1.0 * (torch.arange(n) == 0))[0])
    with pytest.raises(ValueError):
        layer(x, noise=noise[:2])  # K = 2 but samples = 3


def test_relational_bias_switch_and_edge_loss_without_graph():
    n = 9
    x = x_of(n)
    with_bias, without = conv(), conv(relational_bias=False)
    with_bias.eval(), without.eval()
    assert not torch.allclose(with_bias(x, ring(n))[0], without(x, ring(n))[0])
    assert torch.equal(without(x, ring(n))[0], without(x)[0])  # the graph only feeds the edge loss
    assert conv()(x)[1] is None  # no graph, no edge loss
    assert conv(relational_bias=False)(x, ring(n))[1] is not None


# ------------------------------------------------------------------------------ reproducibility


def test_same_generator_seed_same_layer_and_outputs_global_rng_untouched():
    n = 11
    x, graph = x_of(n), ring(n)
    state = torch.get_rng_state()
    a, b, c = conv(seed=3), conv(seed=3), conv(seed=4)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.projection, c.projection) and not torch.equal(a.w_q.weight, c.w_q.weight)
    outs_a = [a(x, graph)[0] for _ in range(2)]
    outs_b = [b(x, graph)[0] for _ in range(2)]
    assert all(torch.equal(p, q) for p, q in zip(outs_a, outs_b))  # the noise streams agree too
    for cls in (DIFFormerAttention, SGFormerAttention):
        assert torch.equal(cls(5, 3, generator=gen(1))(x), cls(5, 3, generator=gen(1))(x))
    assert torch.equal(torch.get_rng_state(), state)


def test_redraw_changes_the_projection_in_training_only():
    layer = conv(redraw=True)
    before = layer.projection.clone()
    layer(x_of(6))
    assert not torch.equal(before, layer.projection)
    layer.eval()
    kept = layer.projection.clone()
    layer(x_of(6))
    assert torch.equal(kept, layer.projection)


# ------------------------------------------------------------------------------ latent graph, batches


def test_attention_rows_are_distributions_within_their_graph():
    layer = conv().eval()
    x = x_of(10)
    batch = torch.tensor([0] * 4 + [1] * 6)
    with torch.no_grad():
        rows = layer.attention_rows(x, [0, 5, 9], batch=batch)
    assert rows.shape == (2, 3, 10)
    assert torch.allclose(rows.sum(-1), torch.ones(2, 3), atol=1e-5)
    assert (rows[:, 0, 4:] == 0).all() and (rows[:, 1:, :4] == 0).all()
    assert (rows >= 0).all()


@pytest.mark.parametrize("which", ["nodeformer", "difformer", "sgformer"])
def test_graphs_of_a_batch_do_not_mix(which):
    n1, n2 = 6, 9
    x = x_of(n1 + n2, dtype=torch.float64)
    batch = torch.tensor([0] * n1 + [1] * n2)
    if which == "nodeformer":
        layer = conv().double().eval()
        graph = torch.cat([ring(n1), ring(n2, offset=n1)], dim=1)
        whole = layer(x, graph, batch)[0]
        parts = torch.cat([layer(x[:n1], ring(n1))[0], layer(x[n1:], ring(n2))[0]])
    else:
        cls = DIFFormerAttention if which == "difformer" else SGFormerAttention
        layer = cls(5, 3, heads=2, generator=gen(2)).double()
        whole = layer(x, batch)
        parts = torch.cat([layer(x[:n1]), layer(x[n1:])])
    assert torch.allclose(whole, parts, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kw, match", [
    ({"tau": 0.0}, "tau"), ({"tau": -1.0}, "tau"), ({"tau": float("nan")}, "tau"), ({"tau": float("inf")}, "tau"),
    ({"samples": 0}, "samples"), ({"m": 0}, "m"), ({"heads": 0}, "heads"), ({"order": 0}, "order"),
    ({"normalize": "row"}, "normalize"),
])
def test_bad_constructor_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        conv(**kw)


def test_bad_generator_and_widths():
    with pytest.raises(TypeError, match="generator"):
        NodeFormerConv(4, 2, generator=0)
    with pytest.raises(ValueError, match="in_dim"):
        DIFFormerAttention(0, 2)
    with pytest.raises(ValueError, match="out_dim"):
        SGFormerAttention(3, -1)


@pytest.mark.parametrize("make", [lambda: conv(), lambda: DIFFormerAttention(5, 3, generator=gen(0)),
                                  lambda: SGFormerAttention(5, 3, generator=gen(0))])
def test_bad_forward_input(make):
    layer = make()
    x = x_of(8)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x has 1 non-finite"):
        layer(bad)
    with pytest.raises(ValueError, match=r"shape \(N, 5\)"):
        layer(x[:, :4])
    with pytest.raises(TypeError, match="floating"):
        layer(torch.ones(8, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        layer(x, batch=torch.tensor([0, 0, 1, 1, 0, 1, 1, 1]))  # not sorted
    with pytest.raises(ValueError, match="batch"):
        layer(x, batch=torch.zeros(7, dtype=torch.long))  # wrong length
    with pytest.raises((TypeError, ValueError), match="batch"):
        layer(x, batch=torch.zeros(8))  # not integer


def test_out_of_range_edges_are_refused():
    with pytest.raises(ValueError):
        conv()(x_of(5), torch.tensor([[0, 7], [7, 0]]))


# ------------------------------------------------------------------------------ against the dense reference


def _heads_np(t: torch.Tensor, h: int):
    return t.detach().reshape(t.shape[0], h, -1).transpose(0, 1).numpy()


@pytest.mark.parametrize("training", [True, False])
def test_nodeformer_layer_equals_the_dense_reference(training):
    """The layer = W_o [per-head reference.latent.nodeformer.nodeformer_attention] (Eq. 8, float64, dense),
    the edge loss = reference edge_loss: checks the head split, the noise layout, b and the tau
    scaling end to end (order 2 to include the higher-order bias)."""
    import numpy as np
    import scipy.sparse as sp

    import reference.latent.nodeformer as ref

    n, h = 10, 2
    layer = conv(heads=h, order=2).double().train(training)
    with torch.no_grad():
        layer.b.copy_(torch.tensor([0.3, -0.7], dtype=torch.float64))
    x = x_of(n, dtype=torch.float64)
    graph = ring(n, chords=3)
    noise = -torch.log(-torch.log(torch.rand(3, h, n, generator=gen(12), dtype=torch.float64)))
    out, loss = layer(x, graph, noise=noise if training else None)
    q, k, v = (_heads_np(w(x), h) for w in (layer.w_q, layer.w_k, layer.w_v))
    w = layer.projection.double().numpy()
    adj = sp.csr_matrix((np.ones(graph.shape[1]), (graph[0].numpy(), graph[1].numpy())), shape=(n, n))
    z = ref.nodeformer_attention(q, k, v, w, graph=adj, b=layer.b.detach().numpy(), order=2, tau=layer.tau,
                                 noise=noise.numpy() if training else None)
    want = z.transpose(1, 0, 2).reshape(n, -1) @ layer.w_o.weight.detach().numpy().T + layer.w_o.bias.detach().numpy()
    assert np.abs(out.detach().numpy() - want).max() <= 1e-10 * max(1.0, np.abs(want).max())
    if training:
        got = float(loss.detach())
        assert abs(got - ref.edge_loss(q, k, w, adj, tau=layer.tau)) <= 1e-10 * abs(got)
    else:
        assert loss is None


@pytest.mark.parametrize("cls, name", [(DIFFormerAttention, "difformer_attention"),
                                       (SGFormerAttention, "sgformer_attention")])
def test_simple_layers_equal_the_dense_reference(cls, name):
    import numpy as np

    import reference.latent.simple_attention as ref

    n, h = 9, 3
    layer = cls(5, 4, heads=h, generator=gen(13)).double()
    x = x_of(n, dtype=torch.float64)
    batch = torch.tensor([0] * 4 + [1] * 5)
    q, k, v = (_heads_np(w(x), h) for w in (layer.w_q, layer.w_k, layer.w_v))
    want = getattr(ref, name)(q, k, v, batch=batch.numpy(), joint_heads=True).mean(0)  # (H, N, d): the heads share a norm
    assert np.abs(layer(x, batch).detach().numpy() - want).max() <= 1e-10 * np.abs(want).max()


@pytest.mark.parametrize("rows", [[0.0, 1.5], np.array([1.0, 2.0]), torch.tensor([True, False]), [[0, 1]]])
def test_attention_rows_reject_non_integer_rows(rows):
    """A float id would be truncated by a cast to long (1.5 -> node 1): refused, naming rows."""
    layer = conv().eval()
    with pytest.raises(TypeError, match="rows"):
        layer.attention_rows(x_of(6), rows)


def test_attention_rows_accept_integer_ids_of_any_int_type():
    layer = conv().eval()
    x = x_of(6)
    with torch.no_grad():
        a = layer.attention_rows(x, [1, 4])
        b = layer.attention_rows(x, np.array([1, 4], dtype=np.int32))
        c = layer.attention_rows(x, torch.tensor([1, 4], dtype=torch.int16))
    assert torch.equal(a, b) and torch.equal(a, c) and a.shape[-2:] == (2, 6)


# ------------------------------------------------------------------ clear refusals (issue 24)

LAYERS = {"nodeformer": NodeFormerConv, "difformer": DIFFormerAttention, "sgformer": SGFormerAttention}
PAIRS = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 0, 3, 2, 5, 4]])


def _call(layer, x):
    return layer(x, PAIRS)[0] if isinstance(layer, NodeFormerConv) else layer(x)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_input_of_another_dtype_than_the_weights_says_which_and_how_to_convert(name, dtype):
    """float64 or bfloat16 input to float32 weights: a TypeError naming both dtypes and both fixes
    (torch said "mat1 and mat2 must have the same dtype"); each fix then works."""
    layer = LAYERS[name](4, 3, generator=gen(0))
    x = torch.randn(6, 4, generator=gen(1))
    with pytest.raises(TypeError, match=rf"x is {dtype} but this {type(layer).__name__} holds torch.float32 weights: "
                                        rf"convert the input \(x.to\(torch.float32\)\) or the layer "
                                        rf"\(layer.to\({dtype}\)\)"):
        _call(layer, x.to(dtype))
    assert _call(layer, x.to(dtype).to(torch.float32)).dtype == torch.float32
    assert _call(layer.to(dtype), x.to(dtype)).dtype == dtype


@pytest.mark.parametrize("tau", ["abc", None, float("nan"), -1.0])
def test_nodeformer_conv_tau_that_is_not_a_positive_number_is_refused(tau):
    with pytest.raises(ValueError, match=r"tau must be a finite number > 0"):
        NodeFormerConv(4, 3, tau=tau, generator=gen(0))


@pytest.mark.parametrize("flag", ["gumbel", "relational_bias", "redraw", "orthogonal"])
def test_nodeformer_conv_switches_must_be_bools(flag):
    with pytest.raises(TypeError, match=rf"{flag} must be a bool, got str 'no'"):
        NodeFormerConv(4, 3, generator=gen(0), **{flag: "no"})


@pytest.mark.parametrize("name", ["difformer", "sgformer"])
def test_joint_heads_must_be_a_bool(name):
    with pytest.raises(TypeError, match=r"joint_heads must be a bool, got float 0.5"):
        LAYERS[name](4, 3, joint_heads=0.5, generator=gen(0))


@pytest.mark.parametrize("name", list(LAYERS))
def test_absurd_widths_are_refused_before_allocating(name):
    with pytest.raises(MemoryError, match=r"in_dim = 10000000, out_dim = .* asks for a linear layer's weight"):
        LAYERS[name](10**7, 10**7, generator=gen(0))
    with pytest.raises(MemoryError, match=r"in_dim = 4, out_dim = 1000000000000 asks for"):
        LAYERS[name](4, 1, heads=10**12, generator=gen(0))


def test_absurd_relational_bias_order_is_refused():
    with pytest.raises(MemoryError, match=r"order = 1000000000000 asks for the relational bias weights b"):
        NodeFormerConv(4, 3, order=10**12, generator=gen(0))
