"""Train learned-latent-graph models end to end on small graphs (issue 13, "train them").

    python -m measure.training [--quick] [--no-progress] [--json FILE]

What the demo shows: the O(N) layers of fast.latent.layers train end to end (full batch, autograd through
the kernelized Gumbel-softmax, the relational bias and the edge loss), they beat a graph-blind MLP,
and NodeFormer learns a latent graph whose attention concentrates on the query node's own class.
It does not show that they beat message passing on the input graph: on these small homophilous
graphs a plain 2-layer GCN is as good or better (the ``gcn`` baseline and the "vs GCN" column).

Models (hidden width HIDDEN, fast.latent.layers; every weight, dropout mask and Gumbel draw from one
explicit torch.Generator per run, seeded with the run's seed; torch's global RNG is never used).
Every model shares the input block fc_in -> LayerNorm -> ReLU -> dropout, except the GCN:

``nodeformer``
    wu22: input block -> 2 x [NodeFormerConv (H = 2 heads, m = 30 FAVOR+ features, tau = 0.25,
    K = 10 Gumbel samples) with the relational bias of the input graph (self-loops added,
    symmetric normalisation, as NodeFormer's code) of order 1 (Eq. 8's A; the code's rb_order),
    residual, LayerNorm, ReLU, dropout] -> Linear. Loss: cross-entropy + lambda * (mean over the
    layers of the edge loss, Eq. 10), lambda = 0.1 (Eq. 12; NodeFormer's default). The order is
    fixed a priori, not tuned: an earlier version used order 2, picked on test accuracy, which
    this demo no longer does; no model gets a tuning budget (all settings are fixed before any run).
``sgformer``
    SGFormer: one SGFormerAttention layer (residual alpha = 0.5, LayerNorm) beside a 2-layer GCN
    on the input graph, mixed as 0.8 GCN + 0.2 attention (the authors' graph_weight), -> Linear.
``difformer``
    DIFFormer (simple attention): input block -> 2 x [0.5 (DIFFormerAttention(h) + A_hat h),
    mixed with the layer's input at alpha = 0.5, LayerNorm, ReLU, dropout] -> Linear; A_hat the
    GCN-normalised input graph (the authors' use_graph).
``gcn``
    Kipf and Welling's 2-layer GCN on the input graph: A_hat relu(A_hat X W_1) W_2 (dropout after
    the ReLU), same width, epochs, optimiser, dropout and selection as the others.
``mlp``
    the baseline that ignores the graph: input block -> Linear (NodeFormer without its convs).

Deviations from the authors' code (we keep them and say so here):
    * DIFFormer: the graph term is 0.5 (attention(h) + A_hat h); the authors' DIFFormerConv adds
      attention + gcn_conv(V) (propagating the values W_v h, not h) without the halving.
    * NodeFormer: the relational-bias weight b has shape (order,), shared by the heads, from 0
      (the code: (order, heads), initialised to 0.1); ReLU after every conv block (the code's
      default use_act=False and an ELU after its first Linear); 2 heads (the code's default: 4).
    * All: one hidden width, lr, weight decay and dropout for every model and data set (no
      per-model search).

SGFormer's and DIFFormer's trained attention is nearly a no-op here: the score term
q~_u . sum_w k~_w of its denominator is ~1/N of the constant term N (q~, k~ are normalised by
the Frobenius norm over all N nodes; the ratio is at most 1/N). Measured in the quick run: on the
200-node graphs SGFormer's attention output stays within 0.3-0.5% of its own values W_v h and
DIFFormer's within 0.02-0.12% of the mean of the values; on the 34-node karate club within ~4%
and ~1.4%. These two models are therefore mostly their GCN branch. Each such run records the measured ratios
(TrainingRun.score_ratio, .attention_deviation; attention_terms).

Data and seeds: seed s draws the data too (measure.datasets at seed s: the SBM's graph and
features, the k-NN data's points and graph, and every split; the karate club has one graph, so
only its split changes), so the spread and the intervals cover initialisation, dropout and Gumbel
noise, and the data draw and split. Every model sees the same draw at the same seed.

Training: full batch, Adam (lr LR, weight decay WEIGHT_DECAY), cross-entropy on the training
nodes, EPOCHS[quick] epochs; after each epoch one evaluation-mode forward (no dropout, no Gumbel
noise) gives the train / val / test accuracies. The reported accuracy is the test accuracy at
the epoch of best validation accuracy (ties: the lowest validation loss), per seed; no choice
reads a test label. ``summarise`` gives its mean, spread and the paired differences to the MLP
and to the GCN over the seeds both have (Student t interval); a run that stopped with an error
is left out and listed (TrainingSummary.excluded).

The learned latent graph: after training, for seed SEEDS[quick][0], the last NodeFormerConv's
attention rows (heads averaged, evaluation mode) of a few test nodes, beside their input rows.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from measure.datasets import DATASETS, GraphData
from results.schema import LatentGraph, Training, TrainingDataset, TrainingRun, TrainingSummary

MODELS = ("nodeformer", "sgformer", "difformer", "gcn", "mlp")
BASELINES = ("mlp", "gcn")  # the summary's paired comparisons
HIDDEN = 32
LR = 0.01
WEIGHT_DECAY = 5e-4
DROPOUT = 0.2
LAMBDA = 0.1  # edge-loss weight (wu22 Eq. 12; NodeFormer's default)
NODEFORMER = {"heads": 2, "m": 30, "tau": 0.25, "samples": 10, "order": 1, "normalize": "sym"}
SGFORMER_GRAPH_WEIGHT = 0.8
DIFFORMER_ALPHA = 0.5
EPOCHS = {True: 80, False: 150}
SEEDS = {True: (0, 1, 2), False: tuple(range(5))}
LATENT_PER_CLASS = 2  # query nodes per class in the latent-graph picture
CONFIDENCE = 0.95
THREADS = 1


# ------------------------------------------------------------------------------ pieces


def dropout(x: torch.Tensor, p: float, generator: torch.Generator, training: bool) -> torch.Tensor:
    """Inverted dropout with the mask drawn from ``generator`` (F.dropout reads the global RNG)."""
    if not training or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


def gcn_adjacency(edge_index: np.ndarray, n: int) -> torch.Tensor:
    """D^-1/2 (A + I) D^-1/2 as a coalesced torch sparse COO (float32): Kipf and Welling's propagation."""
    ei = np.asarray(edge_index)
    rows = np.concatenate([ei[0], np.arange(n)])
    cols = np.concatenate([ei[1], np.arange(n)])
    deg = np.bincount(rows, minlength=n).astype(np.float64)
    w = 1.0 / np.sqrt(deg[rows] * deg[cols])
    order = np.lexsort((cols, rows))
    return torch.sparse_coo_tensor(torch.as_tensor(np.stack([rows[order], cols[order]])),
                                   torch.as_tensor(w[order], dtype=torch.float32), (n, n),
                                   check_invariants=True).coalesce()


def with_self_loops(edge_index: np.ndarray, n: int) -> torch.Tensor:
    """(2, E + N) int64 tensor: the edges and every (u, u) (NodeFormer's code adds self-loops)."""
    loops = np.arange(n)
    return torch.as_tensor(np.concatenate([np.asarray(edge_index), np.stack([loops, loops])], axis=1),
                           dtype=torch.long)


class Inputs:
    """The tensors one data set needs (built once, shared by every run on it)."""

    def __init__(self, data: GraphData):
        self.data = data
        self.x = torch.as_tensor(data.features, dtype=torch.float32)
        self.y = torch.as_tensor(data.labels, dtype=torch.long)
        self.masks = {k: torch.as_tensor(getattr(data, f"{k}_mask")) for k in ("train", "val", "test")}
        from fast.graphs import as_graph

        self.edge_index = with_self_loops(data.edge_index, data.n)
        self.graph = as_graph(self.edge_index, n=data.n)  # converted once, not at every forward
        self.a_hat = gcn_adjacency(data.edge_index, data.n)


# ------------------------------------------------------------------------------ models


class MLP(nn.Module):
    """The input block every attention model shares (fc_in -> LayerNorm -> ReLU -> dropout), then
    fc_out: NodeFormerNet without its convs."""

    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN):
        from fast.latent.layers import linear

        super().__init__()
        self.g = generator
        self.fc_in, self.fc_out = linear(in_dim, hidden, generator), linear(hidden, classes, generator)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, inp: Inputs):
        h = dropout(F.relu(self.norm(self.fc_in(inp.x))), DROPOUT, self.g, self.training)
        return self.fc_out(h), None


class GCN(nn.Module):
    """Kipf and Welling's 2-layer GCN: A_hat dropout(relu(A_hat X W_1)) W_2."""

    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN):
        from fast.latent.layers import linear

        super().__init__()
        self.g = generator
        self.gcn1, self.gcn2 = linear(in_dim, hidden, generator), linear(hidden, classes, generator)

    def forward(self, inp: Inputs):
        h = dropout(F.relu(inp.a_hat @ self.gcn1(inp.x)), DROPOUT, self.g, self.training)
        return inp.a_hat @ self.gcn2(h), None


class NodeFormerNet(nn.Module):
    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN,
                 layers: int = 2, **conv):
        from fast.latent.layers import NodeFormerConv, linear

        super().__init__()
        self.g = generator
        self.fc_in, self.fc_out = linear(in_dim, hidden, generator), linear(hidden, classes, generator)
        self.convs = nn.ModuleList(NodeFormerConv(hidden, hidden, generator=generator, **{**NODEFORMER, **conv})
                                   for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers + 1))

    def _hidden(self, inp: Inputs, stop: int | None = None):
        h = dropout(F.relu(self.norms[0](self.fc_in(inp.x))), DROPOUT, self.g, self.training)
        losses = []
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms[1:])):
            if i == stop:
                return h, losses
            z, loss = conv(h, inp.graph)
            losses.append(loss)
            h = dropout(F.relu(norm(h + z)), DROPOUT, self.g, self.training)
        return h, losses

    def forward(self, inp: Inputs):
        h, losses = self._hidden(inp)
        return self.fc_out(h), torch.stack(losses).mean() if self.training else None

    @torch.no_grad()
    def latent_rows(self, inp: Inputs, rows, layer: int = -1) -> torch.Tensor:
        """(R, N): layer ``layer``'s attention rows of the nodes ``rows``, heads averaged (eval mode)."""
        was = self.training
        self.eval()
        try:
            layer = layer % len(self.convs)
            h, _ = self._hidden(inp, stop=layer)
            return self.convs[layer].attention_rows(h, rows).mean(0)
        finally:
            self.train(was)


class SGFormerNet(nn.Module):
    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN):
        from fast.latent.layers import SGFormerAttention, linear

        super().__init__()
        self.g = generator
        self.fc_in = linear(in_dim, hidden, generator)
        self.attn = SGFormerAttention(hidden, hidden, heads=1, generator=generator)
        self.norm_in, self.norm_attn = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.gcn1, self.gcn2 = linear(in_dim, hidden, generator), linear(hidden, hidden, generator)
        self.fc_out = linear(hidden, classes, generator)

    def attention_inputs(self, inp: Inputs) -> list[tuple[nn.Module, torch.Tensor]]:
        """[(attention layer, its input h)] in the current mode (call in eval mode, no_grad)."""
        return [(self.attn, dropout(F.relu(self.norm_in(self.fc_in(inp.x))), DROPOUT, self.g, self.training))]

    def forward(self, inp: Inputs):
        h = dropout(F.relu(self.norm_in(self.fc_in(inp.x))), DROPOUT, self.g, self.training)
        a = self.norm_attn(0.5 * self.attn(h) + 0.5 * h)  # the authors' residual (alpha = 0.5)
        g = dropout(F.relu(inp.a_hat @ self.gcn1(inp.x)), DROPOUT, self.g, self.training)
        g = inp.a_hat @ self.gcn2(g)
        z = SGFORMER_GRAPH_WEIGHT * g + (1 - SGFORMER_GRAPH_WEIGHT) * a
        return self.fc_out(z), None


class DIFFormerNet(nn.Module):
    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN,
                 layers: int = 2):
        from fast.latent.layers import DIFFormerAttention, linear

        super().__init__()
        self.g = generator
        self.fc_in, self.fc_out = linear(in_dim, hidden, generator), linear(hidden, classes, generator)
        self.attns = nn.ModuleList(DIFFormerAttention(hidden, hidden, heads=1, generator=generator)
                                   for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers + 1))

    def _layers(self, inp: Inputs, seen: list | None = None):
        h = dropout(F.relu(self.norms[0](self.fc_in(inp.x))), DROPOUT, self.g, self.training)
        for attn, norm in zip(self.attns, self.norms[1:]):
            if seen is not None:
                seen.append((attn, h))
            z = 0.5 * (attn(h) + inp.a_hat @ h)
            h = dropout(F.relu(norm(DIFFORMER_ALPHA * z + (1 - DIFFORMER_ALPHA) * h)), DROPOUT, self.g, self.training)
        return h

    def attention_inputs(self, inp: Inputs) -> list[tuple[nn.Module, torch.Tensor]]:
        """[(attention layer, its input h)] per layer in the current mode (call in eval mode, no_grad)."""
        seen: list = []
        self._layers(inp, seen)
        return seen

    def forward(self, inp: Inputs):
        return self.fc_out(self._layers(inp)), None


BUILDERS: dict[str, Callable[..., nn.Module]] = {"nodeformer": NodeFormerNet, "sgformer": SGFormerNet,
                                                 "difformer": DIFFormerNet, "gcn": GCN, "mlp": MLP}


def build(model: str, in_dim: int, classes: int, generator: torch.Generator) -> nn.Module:
    if model not in BUILDERS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[model](in_dim, classes, generator)


# ------------------------------------------------------------------------------ training


def _accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).double().mean())


@torch.no_grad()
def attention_terms(net: nn.Module, inp: Inputs) -> tuple[list[float], list[float]] | None:
    """For SGFormerNet / DIFFormerNet (None otherwise), per attention layer, in evaluation mode:
    (score ratio: mean_u |q~_u . sum_w k~_w| / N, the denominator's score term against its constant
    term N; deviation: ||attention(h) - c|| / ||c||, c the output with the score terms dropped:
    the values W_v h for SGFormer, their mean over the nodes for DIFFormer). One head each here."""
    if not isinstance(net, (SGFormerNet, DIFFormerNet)):
        return None
    was = net.training
    net.eval()
    try:
        ratios, devs = [], []
        for attn, h in net.attention_inputs(inp):
            q, k, v = attn.w_q(h).double(), attn.w_k(h).double(), attn.w_v(h).double()
            qn, kn = q / torch.linalg.norm(q), k / torch.linalg.norm(k)
            ratios.append(float((qn @ kn.sum(0)).abs().mean() / h.shape[0]))
            const = v if isinstance(net, SGFormerNet) else v.mean(0, keepdim=True).expand_as(v)
            devs.append(float(torch.linalg.norm(attn(h).double() - const) / torch.linalg.norm(const)))
        return ratios, devs
    finally:
        net.train(was)


def train_one(inp: Inputs, model: str, seed: int, epochs: int, lam: float = LAMBDA,
              tick: Callable[[], None] | None = None) -> tuple[TrainingRun, nn.Module]:
    """Train one model on one data set from ``seed``; returns the run record and the model.
    Never raises for a failing model: the error is recorded (``error``) with the epochs done."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    start = time.perf_counter()
    g = torch.Generator().manual_seed(int(seed))
    net = build(model, inp.x.shape[1], inp.data.num_classes, g)
    run = TrainingRun(inp.data.name, model, int(seed), epochs, edge_loss=[] if model == "nodeformer" else None)
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    train = inp.masks["train"]
    try:
        for _ in range(epochs):
            net.train()
            opt.zero_grad()
            logits, edge = net(inp)
            ce = F.cross_entropy(logits[train], inp.y[train])
            loss = ce if edge is None else ce + lam * edge
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {float(loss.detach())} at epoch "
                                         f"{len(run.train_loss) + 1}")
            loss.backward()
            opt.step()
            run.train_loss.append(float(ce.detach()))
            if edge is not None:
                run.edge_loss.append(float(edge.detach()))
            net.eval()
            with torch.no_grad():
                logits, _ = net(inp)
                val = inp.masks["val"]
                run.val_loss.append(float(F.cross_entropy(logits[val], inp.y[val])))
            for key, curve in (("train", run.train_acc), ("val", run.val_acc), ("test", run.test_acc)):
                curve.append(_accuracy(logits, inp.y, inp.masks[key]))
            if tick is not None:
                tick()
    except Exception as exc:  # noqa: BLE001 - one failing model must not stop the others
        run.error = f"{type(exc).__name__}: {exc}"
    if run.val_acc:
        # best validation accuracy; ties (frequent on small validation sets) go to the lower validation loss
        best = min(range(len(run.val_acc)), key=lambda i: (-run.val_acc[i], run.val_loss[i], i))
        run.best_epoch, run.best_val_acc, run.test_at_best_val = best + 1, run.val_acc[best], run.test_acc[best]
    if run.error is None:
        try:
            terms = attention_terms(net, inp)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not lose the run
            terms, run.error = None, f"attention_terms: {type(exc).__name__}: {exc}"
        if terms is not None:
            run.score_ratio, run.attention_deviation = terms
    run.seconds = round(time.perf_counter() - start, 3)
    return run, net


def latent_nodes(data: GraphData, per_class: int = LATENT_PER_CLASS) -> list[int]:
    """``per_class`` test nodes of each class (the smallest ids), class by class."""
    out = []
    for c in range(data.num_classes):
        ids = np.flatnonzero(data.test_mask & (data.labels == c))[:per_class]
        out += [int(i) for i in ids]
    return out


def latent_graph(inp: Inputs, net: NodeFormerNet, seed: int) -> LatentGraph:
    data = inp.data
    nodes = latent_nodes(data)
    att = net.latent_rows(inp, nodes).double().numpy()
    adj = data.adjacency()[nodes].toarray()
    order = np.argsort(data.labels, kind="stable")
    return LatentGraph(data.name, "nodeformer", int(seed), len(net.convs) - 1, nodes,
                       [int(v) for v in data.labels], [int(v) for v in order], att.tolist(), adj.tolist())


def paired(mine: dict[int, float], base: dict[int, float], confidence: float = CONFIDENCE):
    """(base mean, mean difference, low, high) of mine - base over the seeds both have: the
    Student-t interval of the per-seed differences (low, high None with fewer than 2 such seeds;
    everything None with none)."""
    from scipy import stats

    common = sorted(set(mine) & set(base))
    if not common:
        return None, None, None, None
    diff = np.array([mine[k] - base[k] for k in common])
    base_mean, mean = float(np.mean([base[k] for k in common])), float(diff.mean())
    if len(diff) < 2:
        return base_mean, mean, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff)))
    return base_mean, mean, mean - half, mean + half


def summarise(runs: list[TrainingRun], confidence: float = CONFIDENCE) -> list[TrainingSummary]:
    """Per (data set, model): test accuracy at best val over seeds, and the paired differences to
    the MLP and to the GCN on the seeds both have (Student t interval). Runs that stopped with an
    error are left out (their seeds listed in ``excluded``), as are the baselines' errored seeds."""
    out = []
    ok = [r for r in runs if r.error is None and r.test_at_best_val is not None]

    def accs(ds, model):
        return {r.seed: r.test_at_best_val for r in ok if (r.dataset, r.model) == (ds, model)}

    for ds, model in dict.fromkeys((r.dataset, r.model) for r in runs):
        mine = accs(ds, model)
        excluded = sorted({r.seed for r in runs if (r.dataset, r.model) == (ds, model) and r.error is not None})
        if not mine:
            if excluded:
                out.append(TrainingSummary(ds, model, 0, math.nan, math.nan, math.nan, math.nan,
                                           confidence=confidence, excluded=excluded))
            continue
        acc = np.array(list(mine.values()))
        s = TrainingSummary(ds, model, len(acc), float(acc.mean()), float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                            float(acc.min()), float(acc.max()), confidence=confidence, excluded=excluded)
        for base in BASELINES:
            base_mean, mean, low, high = paired(mine, accs(ds, base), confidence)
            if model == base:
                mean = low = high = None
            if base == "mlp":
                s.mlp_mean, s.diff_mean, s.diff_low, s.diff_high = base_mean, mean, low, high
            else:
                s.gcn_mean, s.gcn_diff_mean, s.gcn_diff_low, s.gcn_diff_high = base_mean, mean, low, high
        out.append(s)
    return out


def dataset_info(data: GraphData) -> TrainingDataset:
    h = data.edge_homophily()
    return TrainingDataset(data.name, data.title, data.description, data.graph, data.n, data.num_edges,
                           int(data.features.shape[1]), data.num_classes, int(data.train_mask.sum()),
                           int(data.val_mask.sum()), int(data.test_mask.sum()), None if math.isnan(h) else h,
                           int(data.seed))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch.set_num_threads(n) inside the block, the previous count restored after (None: unchanged)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_all(quick: bool = True, progress: bool = False, *, datasets=None, models=MODELS, seeds=None,
              epochs: int | None = None, threads: int | None = THREADS,
              status: Callable[[str], None] = lambda msg: None) -> Training:
    """Every (data set, model, seed), the summary and the latent graphs, as a results.schema.Training.
    Defaults: all of DATASETS and MODELS, SEEDS[quick], EPOCHS[quick]. progress: a tqdm bar over
    the epochs of all runs. threads: torch threads while training (THREADS = 1: matrices of a few
    hundred rows gain nothing from more, and lose much on a busy machine); None leaves them."""
    with torch_threads(threads):
        return _train_all(quick, progress, datasets, models, seeds, epochs, status)


def _train_all(quick, progress, datasets, models, seeds, epochs, status) -> Training:
    from tqdm.auto import tqdm

    datasets = list(DATASETS) if datasets is None else list(datasets)
    seeds = list(SEEDS[quick] if seeds is None else seeds)
    epochs = EPOCHS[quick] if epochs is None else epochs
    models = list(models)
    for m in models:
        if m not in BUILDERS:
            raise ValueError(f"unknown model {m!r}; known: {', '.join(BUILDERS)}")
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    start = time.perf_counter()
    res = Training("quick" if quick else "full",
                   {"epochs": epochs, "lr": LR, "weight_decay": WEIGHT_DECAY, "hidden": HIDDEN, "dropout": DROPOUT,
                    "lambda": LAMBDA, **{f"nodeformer_{k}": v for k, v in NODEFORMER.items()},
                    "nodeformer_order_choice": "fixed a priori at 1 (Eq. 8's A); not tuned",
                    "tuning": "none: every setting fixed before any run, the same for every model and data set",
                    "data": "seed s draws the data set at seed s (SBM: graph, features and split; k-NN: points, "
                            "graph and split; karate: the split)",
                    "nodeformer_layers": 2, "difformer_layers": 2, "difformer_alpha": DIFFORMER_ALPHA,
                    "sgformer_graph_weight": SGFORMER_GRAPH_WEIGHT, "optimizer": "Adam, full batch",
                    "selection": "test accuracy at the epoch of best validation accuracy "
                                 "(ties: lowest validation loss)"},
                   models=models, seeds=seeds, threads=torch.get_num_threads())
    total = len(datasets) * len(models) * len(seeds) * epochs
    with tqdm(total=total, desc="training", unit="epoch", disable=not progress) as bar:
        for name in datasets:
            inputs = {seed: Inputs(DATASETS[name](seed=seed)) for seed in seeds}  # one draw per seed
            res.datasets.append(dataset_info(inputs[seeds[0]].data))
            for model in models:
                for seed in seeds:
                    inp = inputs[seed]
                    bar.set_postfix_str(f"{name}/{model}/seed {seed}")
                    run, net = train_one(inp, model, seed, epochs, tick=lambda: bar.update(1))
                    bar.update(epochs - len(run.val_acc))
                    res.runs.append(run)
                    if run.error:
                        status(f"  training {name}/{model}/seed {seed} stopped: {run.error}")
                    if model == "nodeformer" and seed == seeds[0] and not run.error:
                        res.latent.append(latent_graph(inp, net, seed))
    res.summary = summarise(res.runs)
    res.seconds = round(time.perf_counter() - start, 2)
    return res


def _vs(mean, low, high) -> str:
    if mean is None:
        return ""
    return f"{mean:+.3f}" + ("" if low is None else f" [{low:+.3f}, {high:+.3f}]")


def table(res: Training) -> list[str]:
    """The summary as text lines: test accuracy mean +- std per model and data set, and the paired
    differences to the MLP and to the GCN (95% t intervals over the seeds)."""
    lines = [f"test accuracy at best val, {len(res.seeds)} seed(s), {res.settings.get('epochs')} epochs "
             f"({res.mode}; {res.seconds:.1f} s)",
             f"{'data set':<10} {'model':<11} {'mean +- std':>15} {'min..max':>13} {'vs MLP [95% CI]':>26} "
             f"{'vs GCN [95% CI]':>26}"]
    for s in res.summary:
        line = (f"{s.dataset:<10} {s.model:<11} {s.mean:>8.3f} +- {s.std:.3f} {s.min:>6.3f}..{s.max:.3f} "
                f"{_vs(s.diff_mean, s.diff_low, s.diff_high):>26} "
                f"{_vs(s.gcn_diff_mean, s.gcn_diff_low, s.gcn_diff_high):>26}")
        if s.excluded:
            line += f"  (excluded, errored: seeds {', '.join(map(str, s.excluded))})"
        lines.append(line.rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.training", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{len(SEEDS[True])} seeds, {EPOCHS[True]} epochs")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write the Training record as JSON")
    args = ap.parse_args(argv)
    res = train_all(quick=args.quick, progress=not args.no_progress,
                    status=lambda msg: print(msg, file=sys.stderr))
    print("\n".join(table(res)))
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(res.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
