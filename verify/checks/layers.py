"""layers/<layer>: the nn.Module layers of fast.latent.layers against a reference computation of
the same layer (issue 24: equivalence checks the functions, and a bug in a layer's own wiring, a
head split, a projection or a dropped term, reached no check).

The reference computation reads the layer's own parameters (weights, biases, NodeFormer's FAVOR+
projection and relational-bias b, converted to float64 NumPy) and recomputes the layer with
reference/ (NumPy, float64): q, k, v = x W^T + b per head ((N, H d) -> (H, N, d)), then

- layers/nodeformer-conv: reference.latent.nodeformer.nodeformer_attention (training: with the
  Gumbel noise the call is given; evaluation: none) with the relational bias of the input graph,
  the heads concatenated and W_o applied; in training the edge loss (reference edge_loss over the
  heads) and ``attention_rows`` (reference attention_weights' rows). Two configurations: the
  default (Gumbel, order 1, "sym") on a batch of graphs of uneven sizes (verify.mechanisms.latent's
  batched_adjacency), and order 2, raw adjacency, no Gumbel on one graph.
- layers/difformer, layers/sgformer: reference difformer_attention / sgformer_attention per head,
  the heads averaged, with joint_heads True (the default: one norm over the heads) and False, on
  one graph and on the batch.

Both dtypes: the layer converted with .to(dtype) and x of that dtype; the reference reads the
converted parameters (so the float32 run is judged on its round-off only). The statistic is the
worst relative Frobenius error over the cases divided by equivalence's tolerance of the dtype
(float64 1e-10, float32 1e-4): <= 1 passes. Deterministic (fixed seeds), N = 37 (a batch of
four graphs: ~N/2, N/3, N/6 and one node, labels with a gap).
"""
from __future__ import annotations

import numpy as np
import torch

import reference.latent.nodeformer as ref_nodeformer
import reference.latent.simple_attention as ref_simple
from fast.latent.layers import DIFFormerAttention, NodeFormerConv, SGFormerAttention
from results.check import Check, Context, Outcome, judged
from verify.checks.equivalence import DTYPES, TOL
from verify.mechanisms.latent import GRAPHS, batched_adjacency
from verify.problems import rng_for

N = 37
IN_DIM, OUT_DIM, HEADS, M, SAMPLES, TAU = 6, 4, 2, 8, 2, 0.5
#: rng_for(seed, SALT, ...): x, the noise, b (no other verify module uses 140).
SALT = 140
#: attention_rows' query nodes: the first, one inside, the last (the one-node graph's node).
ROWS = (0, N // 2, N - 1)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _heads(a: np.ndarray, heads: int) -> np.ndarray:
    """(N, H d) -> (H, N, d), the layers' head split."""
    return a.reshape(a.shape[0], heads, -1).transpose(1, 0, 2)


def _linear(lin: torch.nn.Linear, x: np.ndarray) -> np.ndarray:
    return x @ _np(lin.weight).T + (_np(lin.bias) if lin.bias is not None else 0.0)


def _qkv(layer, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_heads(_linear(w, x), layer.heads) for w in (layer.w_q, layer.w_k, layer.w_v))


def _rel(expected, got) -> float:
    e = np.asarray(expected, dtype=np.float64)
    g = np.asarray(_np(got) if isinstance(got, torch.Tensor) else got, dtype=np.float64)
    return float(np.linalg.norm(g - e) / max(np.linalg.norm(e), np.finfo(float).tiny))


def _graphs(seed: int) -> dict:
    """{"one": (adjacency, None), "batch": (block-diagonal adjacency, batch vector)} at N."""
    one, _ = batched_adjacency("grid-2d", N, seed, 1)
    adj, batch = batched_adjacency("grid-2d", N, seed, GRAPHS)
    return {"one": (one, None), "batch": (adj, batch)}


def nodeformer_reference(layer: NodeFormerConv, x: np.ndarray, adj, batch, noise: np.ndarray | None,
                         training: bool) -> tuple[np.ndarray, float | None]:
    """(out (N, out_dim), edge loss or None) of ``layer`` recomputed by reference/ (module doc)."""
    q, k, v = _qkv(layer, x)
    w = _np(layer.projection)
    z = ref_nodeformer.nodeformer_attention(
        q, k, v, w, graph=adj if layer.relational_bias else None,
        b=_np(layer.b) if layer.relational_bias else None, order=layer.order, normalize=layer.normalize,
        tau=layer.tau, noise=noise if (training and layer.gumbel) else None, batch=batch)
    out = _linear(layer.w_o, z.transpose(1, 0, 2).reshape(x.shape[0], -1))
    loss = ref_nodeformer.edge_loss(q, k, w, adj, tau=layer.tau, batch=batch) if training else None
    return out, loss


def nodeformer_rows_reference(layer: NodeFormerConv, x: np.ndarray, rows, batch) -> np.ndarray:
    q, k, _ = _qkv(layer, x)
    return ref_nodeformer.attention_weights(q, k, _np(layer.projection), tau=layer.tau, batch=batch)[..., list(rows), :]


#: NodeFormerConv configurations: (name, constructor options, graph ("one" | "batch")).
NODEFORMER_CONFIGS = (("default", {}, "batch"),
                      ("order-2-raw-no-gumbel", {"order": 2, "normalize": None, "gumbel": False}, "one"))


def _nodeformer_cases(ctx: Context, dtype: torch.dtype) -> dict[str, float]:
    errs = {}
    graphs = _graphs(ctx.seed)
    for i, (name, options, which) in enumerate(NODEFORMER_CONFIGS):
        adj, batch = graphs[which]
        rng = rng_for(ctx.seed, SALT, i)
        layer = NodeFormerConv(IN_DIM, OUT_DIM, heads=HEADS, m=M, tau=TAU, samples=SAMPLES,
                               generator=torch.Generator().manual_seed(int(rng.integers(2**31))), **options)
        with torch.no_grad():  # b starts at 0: give it values that tell the orders apart
            layer.b.copy_(torch.as_tensor(rng.normal(0.0, 1.0, layer.order)))
        layer = layer.to(dtype)
        x_t = torch.as_tensor(rng.standard_normal((N, IN_DIM)), dtype=dtype)
        x = _np(x_t)
        u = rng.uniform(size=(SAMPLES, HEADS, N))
        noise = -np.log(-np.log(np.clip(u, np.finfo(float).tiny, 1.0 - 2.0**-53)))
        batch_t = None if batch is None else torch.as_tensor(batch)
        layer.train()
        out, loss = layer(x_t, adj, batch_t, noise=torch.as_tensor(noise, dtype=dtype) if layer.gumbel else None)
        ref_out, ref_loss = nodeformer_reference(layer, x, adj, batch, noise, True)
        errs[f"{name}/train/out"] = _rel(ref_out, out)
        errs[f"{name}/train/edge-loss"] = _rel(ref_loss, loss)
        layer.eval()
        out, loss = layer(x_t, adj, batch_t)
        errs[f"{name}/eval/out"] = _rel(nodeformer_reference(layer, x, adj, batch, None, False)[0], out)
        if loss is not None:
            errs[f"{name}/eval/loss-not-none"] = float("inf")  # evaluation returns no edge loss
        with torch.no_grad():
            rows = layer.attention_rows(x_t, list(ROWS), batch_t)
        errs[f"{name}/attention_rows"] = _rel(nodeformer_rows_reference(layer, x, ROWS, batch), rows)
    return errs


def simple_reference(layer, x: np.ndarray, batch, own_value: bool) -> np.ndarray:
    """The heads' mean of reference difformer_attention / sgformer_attention (module doc)."""
    q, k, v = _qkv(layer, x)
    fn = ref_simple.sgformer_attention if own_value else ref_simple.difformer_attention
    return fn(q, k, v, batch=batch, joint_heads=layer.joint_heads).mean(0)


def _simple_cases(ctx: Context, dtype: torch.dtype, cls, own_value: bool) -> dict[str, float]:
    errs = {}
    for i, ((which, (_, batch)), joint) in enumerate((g, j) for g in _graphs(ctx.seed).items() for j in (True, False)):
        rng = rng_for(ctx.seed, SALT, 10 + i, int(own_value))
        layer = cls(IN_DIM, OUT_DIM, heads=HEADS, joint_heads=joint,
                    generator=torch.Generator().manual_seed(int(rng.integers(2**31)))).to(dtype)
        x_t = torch.as_tensor(rng.standard_normal((N, IN_DIM)), dtype=dtype)
        out = layer(x_t, batch=None if batch is None else torch.as_tensor(batch))
        errs[f"{which}/joint_heads={joint}"] = _rel(simple_reference(layer, _np(x_t), batch, own_value), out)
    return errs


def _run(ctx: Context, cases) -> Outcome:
    errors, worst, where = {}, 0.0, ""
    for name, dtype in DTYPES:
        for key, err in cases(ctx, dtype).items():
            errors[f"{name}/{key}"] = err
            ratio = err / TOL[name] if not np.isnan(err) else float("inf")
            if ratio > worst or not where:
                worst, where = ratio, f"{name}/{key}"
    reasons = [f"{k}: relative error {e:.3g} > {TOL[k.split('/')[0]]:g}" for k, e in errors.items()
               if not e <= TOL[k.split("/")[0]]]
    return judged(not reasons, worst, reasons, errors=errors, worst=where, tolerances=dict(TOL), n=N,
                  statistic="max over cases and dtypes of the relative Frobenius error of the layer against its "
                            "reference computation, over equivalence's tolerance of the dtype")


LAYERS = {
    "nodeformer-conv": ("NodeFormerConv == its reference computation (train with noise, eval, edge loss, rows)",
                        "wu22 Eqs. 5-8, 10", _nodeformer_cases),
    "difformer": ("DIFFormerAttention == its reference computation (heads, joint norms, batches)",
                  "the tutorial (DIFFormer)", lambda ctx, dt: _simple_cases(ctx, dt, DIFFormerAttention, False)),
    "sgformer": ("SGFormerAttention == its reference computation (heads, joint norms, batches)", "SGFormer",
                 lambda ctx, dt: _simple_cases(ctx, dt, SGFormerAttention, True)),
}


def check_for(name: str, cases=None) -> Check:
    """layers/<name>; ``cases(ctx, dtype) -> {case: relative error}`` replaces the layer's (tests)."""
    title, source, default = LAYERS[name]
    run_cases = cases or default
    return Check(f"layers/{name}", title, source, "equivalence", run=lambda ctx: _run(ctx, run_cases),
                 threshold=1.0, compare="<=", unit="ratio")


def checks() -> list[Check]:
    return [check_for(name) for name in LAYERS]
