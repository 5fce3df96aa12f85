"""Train learned-latent-graph models end to end on small graphs (issue 13, "train them").

    python -m verify.training [--quick] [--no-progress] [--json FILE]

Models (hidden width HIDDEN, fast.layers; every weight, dropout mask and Gumbel draw from one
explicit torch.Generator per run, seeded with the run's seed; torch's global RNG is never used):

``nodeformer``
    wu22: input Linear -> 2 x [NodeFormerConv (H heads, m = 30 FAVOR+ features, tau = 0.25,
    K = 10 Gumbel samples: the reference code's defaults) with the relational bias of the input
    graph (self-loops added, symmetric normalisation, as NodeFormer's code; orders 1 and 2, its
    rb_order option: on the SBM order 2 gave 0.74 test accuracy against 0.63 with order 1, 3
    seeds x 80 epochs), residual, LayerNorm, ReLU, dropout] -> Linear. Loss: cross-entropy +
    lambda * (mean over the layers of the edge loss, Eq. 10), lambda = 0.1 (Eq. 12; NodeFormer's
    default).
``sgformer``
    SGFormer: one SGFormerAttention layer (residual, LayerNorm) beside a 2-layer GCN on the
    input graph, mixed as 0.8 GCN + 0.2 attention (the authors' graph_weight), -> Linear.
``difformer``
    DIFFormer (simple attention): input Linear -> 2 x [(DIFFormerAttention(h) + A_hat h) / 2,
    mixed with the layer's input at alpha = 0.5, LayerNorm, ReLU, dropout] -> Linear; A_hat the
    GCN-normalised input graph (the authors' use_graph).
``mlp``
    the baseline that ignores the graph: Linear -> ReLU -> dropout -> Linear.

Training: full batch, Adam (lr LR, weight decay WEIGHT_DECAY), cross-entropy on the training
nodes, EPOCHS[quick] epochs; after each epoch one evaluation-mode forward (no dropout, no Gumbel
noise) gives the train / val / test accuracies. The reported accuracy is the test accuracy at
the epoch of best validation accuracy (ties: the lowest validation loss), per seed; ``summarise``
gives its mean, spread and the paired difference to the MLP over the same seeds. The data sets stay fixed
(verify.datasets at seed 0): the seeds vary initialisation, dropout and Gumbel noise only.

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

from verify.datasets import DATASETS, GraphData
from verify.schema import LatentGraph, Training, TrainingDataset, TrainingRun, TrainingSummary

MODELS = ("nodeformer", "sgformer", "difformer", "mlp")
HIDDEN = 32
LR = 0.01
WEIGHT_DECAY = 5e-4
DROPOUT = 0.2
LAMBDA = 0.1  # edge-loss weight (wu22 Eq. 12; NodeFormer's default)
NODEFORMER = {"heads": 2, "m": 30, "tau": 0.25, "samples": 10, "order": 2, "normalize": "sym"}
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
    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN):
        from fast.layers import linear

        super().__init__()
        self.g = generator
        self.fc1, self.fc2 = linear(in_dim, hidden, generator), linear(hidden, classes, generator)

    def forward(self, inp: Inputs):
        h = dropout(F.relu(self.fc1(inp.x)), DROPOUT, self.g, self.training)
        return self.fc2(h), None


class NodeFormerNet(nn.Module):
    def __init__(self, in_dim: int, classes: int, generator: torch.Generator, hidden: int = HIDDEN,
                 layers: int = 2, **conv):
        from fast.layers import NodeFormerConv, linear

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
        from fast.layers import SGFormerAttention, linear

        super().__init__()
        self.g = generator
        self.fc_in = linear(in_dim, hidden, generator)
        self.attn = SGFormerAttention(hidden, hidden, heads=1, generator=generator)
        self.norm_in, self.norm_attn = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.gcn1, self.gcn2 = linear(in_dim, hidden, generator), linear(hidden, hidden, generator)
        self.fc_out = linear(hidden, classes, generator)

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
        from fast.layers import DIFFormerAttention, linear

        super().__init__()
        self.g = generator
        self.fc_in, self.fc_out = linear(in_dim, hidden, generator), linear(hidden, classes, generator)
        self.attns = nn.ModuleList(DIFFormerAttention(hidden, hidden, heads=1, generator=generator)
                                   for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers + 1))

    def forward(self, inp: Inputs):
        h = dropout(F.relu(self.norms[0](self.fc_in(inp.x))), DROPOUT, self.g, self.training)
        for attn, norm in zip(self.attns, self.norms[1:]):
            z = 0.5 * (attn(h) + inp.a_hat @ h)
            h = dropout(F.relu(norm(DIFFORMER_ALPHA * z + (1 - DIFFORMER_ALPHA) * h)), DROPOUT, self.g, self.training)
        return self.fc_out(h), None


BUILDERS: dict[str, Callable[..., nn.Module]] = {"nodeformer": NodeFormerNet, "sgformer": SGFormerNet,
                                                 "difformer": DIFFormerNet, "mlp": MLP}


def build(model: str, in_dim: int, classes: int, generator: torch.Generator) -> nn.Module:
    if model not in BUILDERS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[model](in_dim, classes, generator)


# ------------------------------------------------------------------------------ training


def _accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).double().mean())


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


def summarise(runs: list[TrainingRun], confidence: float = CONFIDENCE) -> list[TrainingSummary]:
    """Per (data set, model): test accuracy at best val over seeds, and the paired difference to
    the MLP on the seeds both have (Student t interval)."""
    from scipy import stats

    out = []
    keys = list(dict.fromkeys((r.dataset, r.model) for r in runs))
    for ds, model in keys:
        mine = {r.seed: r.test_at_best_val for r in runs
                if (r.dataset, r.model) == (ds, model) and r.test_at_best_val is not None}
        if not mine:
            continue
        acc = np.array(list(mine.values()))
        s = TrainingSummary(ds, model, len(acc), float(acc.mean()), float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                            float(acc.min()), float(acc.max()), confidence=confidence)
        mlp = {r.seed: r.test_at_best_val for r in runs
               if (r.dataset, r.model) == (ds, "mlp") and r.test_at_best_val is not None}
        if mlp:
            s.mlp_mean = float(np.mean(list(mlp.values())))
            common = sorted(set(mine) & set(mlp))
            if model != "mlp" and common:
                diff = np.array([mine[k] - mlp[k] for k in common])
                s.diff_mean = float(diff.mean())
                if len(diff) > 1:
                    half = float(stats.t.ppf(0.5 + confidence / 2, len(diff) - 1) * diff.std(ddof=1)
                                 / math.sqrt(len(diff)))
                    s.diff_low, s.diff_high = s.diff_mean - half, s.diff_mean + half
        out.append(s)
    return out


def dataset_info(data: GraphData) -> TrainingDataset:
    h = data.edge_homophily()
    return TrainingDataset(data.name, data.title, data.description, data.graph, data.n, data.num_edges,
                           int(data.features.shape[1]), data.num_classes, int(data.train_mask.sum()),
                           int(data.val_mask.sum()), int(data.test_mask.sum()), None if math.isnan(h) else h)


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
    """Every (data set, model, seed), the summary and the latent graphs, as a verify.schema.Training.
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
                    "nodeformer_layers": 2, "difformer_layers": 2, "difformer_alpha": DIFFORMER_ALPHA,
                    "sgformer_graph_weight": SGFORMER_GRAPH_WEIGHT, "optimizer": "Adam, full batch",
                    "selection": "test accuracy at the epoch of best validation accuracy "
                                 "(ties: lowest validation loss)"},
                   models=models, seeds=seeds, threads=torch.get_num_threads())
    total = len(datasets) * len(models) * len(seeds) * epochs
    with tqdm(total=total, desc="training", unit="epoch", disable=not progress) as bar:
        for name in datasets:
            data = DATASETS[name](seed=0)
            inp = Inputs(data)
            res.datasets.append(dataset_info(data))
            for model in models:
                for seed in seeds:
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


def table(res: Training) -> list[str]:
    """The summary as text lines: test accuracy mean +- std per model and data set vs the MLP."""
    lines = [f"test accuracy at best val, {len(res.seeds)} seed(s), {res.settings.get('epochs')} epochs "
             f"({res.mode}; {res.seconds:.1f} s)",
             f"{'data set':<10} {'model':<11} {'mean +- std':>15} {'min..max':>13} {'vs MLP [95% CI]':>26}"]
    for s in res.summary:
        vs = "" if s.diff_mean is None else f"{s.diff_mean:+.3f}"
        if s.diff_low is not None:
            vs += f" [{s.diff_low:+.3f}, {s.diff_high:+.3f}]"
        lines.append(f"{s.dataset:<10} {s.model:<11} {s.mean:>8.3f} +- {s.std:.3f} {s.min:>6.3f}..{s.max:.3f} "
                     f"{vs:>26}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify.training", description=__doc__.split("\n\n")[0])
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
