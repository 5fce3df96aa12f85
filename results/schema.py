"""The results JSON that verify writes and reports renders (schema ``maskbench-results/2``).

Pure data: dataclasses with ``to_dict`` / ``from_dict``, importable without torch, fast/ or
reference/ (reports/ imports this module and nothing that measures). One file holds one run:

    {
      "schema": "maskbench-results/2",
      "environment": {...},               machine, versions, threads, mode, load (see Environment)
      "mechanisms": [MechanismInfo],      registry metadata, variants included
      "sweeps": [SweepResult],            time vs N per (mechanism, variant, impl)
      "comparisons": [Comparison],        fast vs dense twin per (mechanism, variant)
      "memory": [MemoryCurve],            peak memory vs N per (mechanism, impl), child processes
      "favor_error": FavorError | null,   FAVOR+ RMSE vs m against the variance formula
      "favor_accuracy": FavorAccuracy | null,  FAVOR+ attention vs exact softmax over (q, k std, m);
                                          absent from older files
      "gallery": Gallery | null,          dense masks of small instances (matrices included)
      "checks": [CheckResult] | null,     python -m verify's results (the --json list, unchanged)
      "checks_note": str,                 how the checks were obtained, or why they are missing
      "stage_seconds": {stage: seconds},
      "training": Training | null         the training demo of learned latent graphs (measure.training)
      "distributed": DistributedScaling | null  sharded attention on gloo ranks: weak and strong
                                          scaling, bytes sent per rank vs N (measure.distributed);
                                          absent from older files
    }

Non-finite floats are written as the strings "inf", "-inf", "nan" (JSON has none) and read back.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from results.check import CheckResult

SCHEMA = "maskbench-results/2"


def _enc(x: Any) -> Any:
    """JSON-safe copy: non-finite floats as strings, tuples as lists, numpy scalars as Python."""
    if isinstance(x, dict):
        return {str(k): _enc(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_enc(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalar
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def num(x: Any) -> Any:
    """Inverse of _enc for one number ("inf" -> inf); None stays None."""
    return float(x) if isinstance(x, str) else x


def _nums(xs):
    return None if xs is None else [num(x) for x in xs]


@dataclass
class Fit:
    """log t = intercept + slope log N: least squares with a t-interval, plus Theil-Sen.

    ``low``/``high`` bound ``slope`` at ``confidence`` (Student t with len(N) - 2 dof);
    ``robust_slope`` is the Theil-Sen median slope, reported as a cross-check on outliers.
    """

    slope: float
    low: float
    high: float
    intercept: float
    confidence: float
    robust_slope: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Fit | None":
        return None if d is None else cls(**{k: num(v) for k, v in d.items()})


@dataclass
class VariantInfo:
    name: str
    title: str = ""
    sweep: bool = True


@dataclass
class MechanismInfo:
    """The registry facts a report shows about one mechanism (written by verify)."""

    id: str
    title: str
    source: str
    complexity: str
    exact: bool = True
    has_dense: bool = True
    notes: str = ""
    variants: list[VariantInfo] = field(default_factory=list)
    cost_factor_name: str = ""
    scale: bool = False
    scale_train: bool = False

    @property
    def default_variant(self) -> str:
        return self.variants[0].name if self.variants else "default"

    @classmethod
    def from_dict(cls, d: dict) -> "MechanismInfo":
        d = dict(d)
        d["variants"] = [VariantInfo(**v) for v in d.get("variants", [])]
        return cls(**d)


@dataclass
class SweepResult:
    """Median seconds per call at each N of one (mechanism, variant, impl), timed in one process,
    N interleaved round by round (measure.timing.sweep).

    fitted[i]: point i entered ``fit`` (measure.timing.fit_points). cost_factors[i]: the problem's
    cost factor at sizes[i] (None without one); cost_fit: the fit of seconds / cost_factor.
    metrics: {name: values at sizes} (Mechanism.metrics). error, error_n: the first exception and
    its N (larger N not tried); the points before it are kept.
    """

    mechanism: str
    variant: str
    impl: str  # "fast" | "dense"
    device: str
    dtype: str
    threads: int | None
    rounds: int
    sizes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    all_rounds: list[list[float]] = field(default_factory=list)
    fitted: list[bool] = field(default_factory=list)
    fit: Fit | None = None
    cost_factors: list[float] | None = None
    cost_fit: Fit | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None
    error_n: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fit"] = None if self.fit is None else self.fit.to_dict()
        d["cost_fit"] = None if self.cost_fit is None else self.cost_fit.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SweepResult":
        d = dict(d)
        d["fit"], d["cost_fit"] = Fit.from_dict(d.get("fit")), Fit.from_dict(d.get("cost_fit"))
        d["seconds"] = _nums(d.get("seconds", []))
        d["all_rounds"] = [_nums(r) for r in d.get("all_rounds", [])]
        d["cost_factors"] = _nums(d.get("cost_factors"))
        d["metrics"] = {k: _nums(v) for k, v in d.get("metrics", {}).items()}
        return cls(**d)


@dataclass
class Comparison:
    """Fast path vs dense twin of one (mechanism, variant) at the N both were timed at.

    speedup[i] = t_dense / t_fast at sizes[i]. crossover: the N above which fast wins
    (measure.timing.crossover), with a 95% interval [crossover_low, crossover_high] (None where it
    cannot be bounded); measured_crossover: the smallest timed N from which fast wins at every
    larger common N (None: not inside the range); extrapolated: the crossover rests on fits
    outside the measured range.
    """

    mechanism: str
    variant: str
    sizes: list[int] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    speedup_fit: Fit | None = None
    crossover: float | None = None
    crossover_low: float | None = None
    crossover_high: float | None = None
    measured_crossover: int | None = None
    extrapolated: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speedup_fit"] = None if self.speedup_fit is None else self.speedup_fit.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Comparison":
        d = dict(d)
        d["speedup_fit"] = Fit.from_dict(d.get("speedup_fit"))
        for k in ("crossover", "crossover_low", "crossover_high"):
            d[k] = num(d.get(k))
        d["speedup"] = _nums(d.get("speedup", []))
        return cls(**d)


@dataclass
class MemoryPoint:
    """Peak extra memory (bytes) of one call at size n over the RSS after its set-up."""

    n: int
    peak_bytes: float
    baseline_bytes: float
    resolved: bool = True  # False: the peak could only be bounded from above (ru_maxrss)


@dataclass
class MemoryCurve:
    """All sizes of one (mechanism, variant, impl); ``method`` says how the peak was read
    ("VmHWM reset" | "ru_maxrss" | "cuda.max_memory_allocated"); error: what stopped the child."""

    mechanism: str
    variant: str
    impl: str
    device: str
    points: list[MemoryPoint] = field(default_factory=list)
    import_baseline_bytes: float | None = None
    method: str = ""
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MemoryCurve":
        d = dict(d)
        d["points"] = [MemoryPoint(**p) for p in d.get("points", [])]
        return cls(**d)


@dataclass
class FavorErrorCurve:
    """Empirical RMSE of one projection kind at each m, with a CI, and its log-log slope."""

    kind: str  # "iid" | "orthogonal"
    m: list[int]
    rmse: list[float]
    rmse_low: list[float]
    rmse_high: list[float]
    slope: float
    slope_low: float
    slope_high: float


@dataclass
class FavorError:
    """FAVOR+ error vs m: inputs, exact kernel, predicted RMSE (verify.stats.prf_variance) per m."""

    x: list[float]
    y: list[float]
    exact: float
    draws: int
    m: list[int]
    predicted_rmse: list[float]
    curves: list[FavorErrorCurve] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "FavorError | None":
        if d is None:
            return None
        return cls(**{**d, "curves": [FavorErrorCurve(**c) for c in d.get("curves", [])]})


@dataclass
class FavorAccuracyCurve:
    """One m and one mask ("none" | "causal"): FAVOR+'s relative error at each q, k std, the mean
    and the max over seeds."""

    mask: str
    m: int
    error: list[float]
    error_max: list[float]


@dataclass
class FavorAccuracy:
    """FAVOR+ attention against exact softmax attention (measure.experiments.favor_accuracy): the
    relative error ||out - exact||_F / ||exact||_F over a grid of q, k standard deviations ``std``
    and feature counts ``m``, at width ``d`` and length ``n``, ``seeds`` seeds per cell."""

    d: int
    n: int
    seeds: int
    orthogonal: bool
    std: list[float]
    m: list[int]
    curves: list[FavorAccuracyCurve] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "FavorAccuracy | None":
        if d is None:
            return None
        return cls(**{**d, "curves": [FavorAccuracyCurve(**c) for c in d.get("curves", [])]})

    def curve(self, mask: str, m: int) -> "FavorAccuracyCurve | None":
        return next((c for c in self.curves if (c.mask, c.m) == (mask, m)), None)


@dataclass
class ScalingPoint:
    """One (scaling kind, world size) of the distributed scaling runs (issue 26): ``n`` tokens in
    all, ``world`` ranks; ``seconds``: one forward and backward call per repeat, the slowest rank's
    time (ranks start together after a barrier); ``median``, ``low``, ``high``: their median, min
    and max; ``efficiency``: weak t(1) / t(P), strong t(1) / (P t(P)) from the medians, with
    ``efficiency_low`` / ``efficiency_high`` from the extremes (the slowest 1-rank repeat over
    the fastest P-rank one and back)."""

    kind: str
    world: int
    n: int
    seconds: list[float]
    median: float
    low: float
    high: float
    efficiency: float | None = None
    efficiency_low: float | None = None
    efficiency_high: float | None = None


@dataclass
class CommunicationPoint:
    """Bytes each rank sent in one forward call of ``function`` at ``n`` tokens on ``world`` ranks
    (fast.distributed's communication log), rank 0 first."""

    function: str
    world: int
    n: int
    bytes_per_rank: list[int]


@dataclass
class DistributedScaling:
    """Sequence-sharded attention on CPU gloo ranks (measure.distributed): weak scaling
    (``tokens_per_rank`` on each of ``worlds``), strong scaling (``strong_n`` tokens split over
    ``worlds``), bytes sent per rank against N, and world size 1 on CUDA where a GPU is present
    (``cuda``: {"device", "n", "seconds", "median"} or None; ``cuda_note`` says why not).
    ``function``: what was timed; ``shape``: B, H, m, d; ``threads_per_rank``: torch threads of
    each rank; ``cpus``: the machine's logical CPUs (ranks beyond it share cores); ``load``: the
    1-minute load average at the start and at the end (other work on the machine shares the cores
    too)."""

    mode: str
    function: str
    shape: dict[str, int]
    worlds: list[int]
    tokens_per_rank: int
    strong_n: int
    repeats: int
    threads_per_rank: int
    cpus: int
    points: list[ScalingPoint] = field(default_factory=list)
    communication: list[CommunicationPoint] = field(default_factory=list)
    cuda: dict[str, Any] | None = None
    cuda_note: str = ""
    seconds: float = 0.0
    load: list[float] = field(default_factory=list)
    #: "weak" / "strong" -> seconds per repeat of the one-process function (fast.favor_attention) on
    #: the 1-rank runs' tokens: what the sharded function costs over it on one rank
    single_process: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _enc(asdict(self))

    @classmethod
    def from_dict(cls, d: dict | None) -> "DistributedScaling | None":
        if d is None:
            return None
        numbers = ("median", "low", "high", "efficiency", "efficiency_low", "efficiency_high")
        return cls(**{**d, "single_process": {k: _nums(v) for k, v in (d.get("single_process") or {}).items()},
                      "points": [ScalingPoint(**{**p, "seconds": _nums(p["seconds"]),
                                                      **{k: num(p.get(k)) for k in numbers}})
                                      for p in d.get("points", [])],
                      "communication": [CommunicationPoint(**c) for c in d.get("communication", [])]})

    def point(self, kind: str, world: int) -> "ScalingPoint | None":
        return next((p for p in self.points if (p.kind, p.world) == (kind, world)), None)


@dataclass
class MaskPanel:
    """One mechanism's dense mask at size n (default variant): summary and the matrix itself
    (rows = queries); matrix None when building it failed (``error`` says why)."""

    id: str
    n: int
    min: float | None = None
    max: float | None = None
    nonzero_fraction: float | None = None
    error: str | None = None
    matrix: list[list[float]] | None = None


@dataclass
class Gallery:
    n: int
    seed: int
    panels: list[MaskPanel] = field(default_factory=list)
    without_mask: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Gallery | None":
        if d is None:
            return None
        return cls(**{**d, "panels": [MaskPanel(**p) for p in d.get("panels", [])]})


# ------------------------------------------------------------------------------ training demo (issue 13)


@dataclass
class TrainingDataset:
    """One data set of the training demo (measure.datasets): sizes and how its graph was made."""

    name: str
    title: str
    description: str
    graph: str
    n: int
    edges: int  # undirected
    features: int
    classes: int
    train: int
    val: int
    test: int
    homophily: float | None = None  # fraction of edges joining two nodes of one class
    draw_seed: int | None = None  # the seed whose draw (graph, features, split) these numbers describe


@dataclass
class TrainingRun:
    """One (data set, model, seed) run: per-epoch curves (index = epoch - 1; train_loss: the
    training-mode cross-entropy on the training nodes, val_loss: the evaluation-mode one on the
    validation nodes), the epoch with the best validation accuracy (ties: the lowest validation
    loss) and the test accuracy there. edge_loss: NodeFormer's Eq. 10 term (mean over layers) per
    epoch, None for the other models. error: what stopped it (such a run is left out of the
    summary and of the mean curves). score_ratio / attention_deviation (SGFormer, DIFFormer; one
    value per attention layer, after training, evaluation mode): the mean over nodes of
    |q~_u . sum_w k~_w| / N (the score term of the denominator against its constant term), and
    ||attention(h) - constant-term output|| / ||constant-term output|| (SGFormer: W_v h;
    DIFFormer: the mean of the values); None for the other models."""

    dataset: str
    model: str
    seed: int
    epochs: int
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    edge_loss: list[float] | None = None
    best_epoch: int | None = None
    best_val_acc: float | None = None
    test_at_best_val: float | None = None
    seconds: float = 0.0
    error: str | None = None
    score_ratio: list[float] | None = None
    attention_deviation: list[float] | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingRun":
        d = dict(d)
        for k in ("train_loss", "train_acc", "val_acc", "test_acc", "val_loss", "edge_loss", "score_ratio",
                  "attention_deviation"):
            d[k] = _nums(d.get(k))
        for k in ("best_val_acc", "test_at_best_val"):
            d[k] = num(d.get(k))
        return cls(**d)


@dataclass
class TrainingSummary:
    """Test accuracy at the best validation epoch of one (data set, model) over its seeds: mean,
    sample std (ddof 1; 0 with one seed), min, max; the paired difference to the MLP on the seeds
    both have (mlp_mean: the MLP's mean over those seeds), with a Student-t ``confidence``
    interval (None with fewer than 2 paired seeds or no MLP); the same against the GCN (gcn_*).
    excluded: seeds whose run stopped with an error, left out of every number here."""

    dataset: str
    model: str
    seeds: int
    mean: float
    std: float
    min: float
    max: float
    mlp_mean: float | None = None
    diff_mean: float | None = None
    diff_low: float | None = None
    diff_high: float | None = None
    confidence: float = 0.95
    gcn_mean: float | None = None
    gcn_diff_mean: float | None = None
    gcn_diff_low: float | None = None
    gcn_diff_high: float | None = None
    excluded: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingSummary":
        return cls(**{k: num(v) if k not in ("dataset", "model", "seeds", "excluded") else v for k, v in d.items()})


@dataclass
class LatentGraph:
    """The learned latent graph of a few nodes of one trained NodeFormer (its last layer, heads
    averaged, evaluation mode: fast.latent.layers.NodeFormerConv.attention_rows) beside the same rows of
    the input adjacency. nodes: the query nodes (R); order: a permutation of the N columns that
    groups them by class (the heatmaps draw columns in this order); attention, adjacency (R, N)
    in the original node order; labels (N,)."""

    dataset: str
    model: str
    seed: int
    layer: int
    nodes: list[int]
    labels: list[int]
    order: list[int]
    attention: list[list[float]]
    adjacency: list[list[float]]

    @classmethod
    def from_dict(cls, d: dict) -> "LatentGraph":
        d = dict(d)
        d["attention"] = [_nums(r) for r in d.get("attention", [])]
        d["adjacency"] = [_nums(r) for r in d.get("adjacency", [])]
        return cls(**d)


@dataclass
class Training:
    """The training demo of issue 13 (measure.training.train_all): NodeFormer, SGFormer, DIFFormer,
    a GCN and an MLP on small graphs (measure.datasets), several seeds each. settings: the shared
    hyper-parameters (epochs, lr, hidden width, lambda, m, tau, K, ...); mode "quick" | "full"."""

    mode: str
    settings: dict[str, Any] = field(default_factory=dict)
    datasets: list[TrainingDataset] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    runs: list[TrainingRun] = field(default_factory=list)
    summary: list[TrainingSummary] = field(default_factory=list)
    latent: list[LatentGraph] = field(default_factory=list)
    seconds: float = 0.0
    threads: int | None = None

    def to_dict(self) -> dict:
        return _enc(asdict(self))

    @classmethod
    def from_dict(cls, d: dict | None) -> "Training | None":
        if d is None:
            return None
        d = dict(d)
        d["datasets"] = [TrainingDataset(**{**x, "homophily": num(x.get("homophily"))}) for x in d.get("datasets", [])]
        d["runs"] = [TrainingRun.from_dict(r) for r in d.get("runs", [])]
        d["summary"] = [TrainingSummary.from_dict(r) for r in d.get("summary", [])]
        d["latent"] = [LatentGraph.from_dict(r) for r in d.get("latent", [])]
        return cls(**d)

    def run(self, dataset: str, model: str, seed: int) -> "TrainingRun | None":
        return next((r for r in self.runs if (r.dataset, r.model, r.seed) == (dataset, model, seed)), None)


@dataclass
class Results:
    """One run of verify's measurements and checks: everything the report shows."""

    environment: dict[str, Any]
    mechanisms: list[MechanismInfo] = field(default_factory=list)
    sweeps: list[SweepResult] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    memory: list[MemoryCurve] = field(default_factory=list)
    favor_error: FavorError | None = None
    gallery: Gallery | None = None
    checks: list[CheckResult] | None = None
    checks_note: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    schema: str = SCHEMA
    training: Training | None = None  # the training demo (issue 13); absent from older files
    favor_accuracy: FavorAccuracy | None = None  # FAVOR+ vs exact softmax (issue 23); absent from older files
    distributed: DistributedScaling | None = None  # sharded attention's scaling (issue 26); absent from older files

    # ------------------------------------------------------------------ lookups

    def sweep(self, mechanism: str, variant: str, impl: str) -> SweepResult | None:
        return next((s for s in self.sweeps if (s.mechanism, s.variant, s.impl) == (mechanism, variant, impl)), None)

    def comparison(self, mechanism: str, variant: str) -> Comparison | None:
        return next((c for c in self.comparisons if (c.mechanism, c.variant) == (mechanism, variant)), None)

    def memory_curve(self, mechanism: str, impl: str, variant: str | None = None) -> MemoryCurve | None:
        return next((c for c in self.memory if c.mechanism == mechanism and c.impl == impl
                     and (variant is None or c.variant == variant)), None)

    def checks_for(self, mech_id: str) -> list[CheckResult]:
        """Checks about one mechanism: ids "<family>/<mech_id>" or "<family>/<mech_id>-<suffix>"."""
        out = []
        for r in self.checks or []:
            tail = r.id.split("/", 1)[-1]
            if tail == mech_id or (tail.startswith(mech_id + "-") and r.id.split("/", 1)[0] == "scale"):
                out.append(r)
        return out

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict:
        return _enc({
            "schema": self.schema,
            "environment": self.environment,
            "mechanisms": [asdict(m) for m in self.mechanisms],
            "sweeps": [s.to_dict() for s in self.sweeps],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "memory": [c.to_dict() for c in self.memory],
            "favor_error": None if self.favor_error is None else self.favor_error.to_dict(),
            "gallery": None if self.gallery is None else self.gallery.to_dict(),
            "checks": None if self.checks is None else [r.to_dict() for r in self.checks],
            "checks_note": self.checks_note,
            "stage_seconds": self.stage_seconds,
            "training": None if self.training is None else self.training.to_dict(),
            "favor_accuracy": None if self.favor_accuracy is None else self.favor_accuracy.to_dict(),
            "distributed": None if self.distributed is None else self.distributed.to_dict(),
        })

    @classmethod
    def from_dict(cls, d: dict) -> "Results":
        schema = d.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"results JSON has schema {schema!r}; this checkout reads {SCHEMA!r} "
                             "(re-run the measurements: make report)")
        checks = None if d.get("checks") is None else [
            CheckResult(**{**r, "statistic": num(r.get("statistic")), "threshold": num(r.get("threshold"))})
            for r in d["checks"]]
        return cls(
            environment=d.get("environment", {}),
            mechanisms=[MechanismInfo.from_dict(m) for m in d.get("mechanisms", [])],
            sweeps=[SweepResult.from_dict(s) for s in d.get("sweeps", [])],
            comparisons=[Comparison.from_dict(c) for c in d.get("comparisons", [])],
            memory=[MemoryCurve.from_dict(c) for c in d.get("memory", [])],
            favor_error=FavorError.from_dict(d.get("favor_error")),
            gallery=Gallery.from_dict(d.get("gallery")),
            checks=checks,
            checks_note=d.get("checks_note", ""),
            stage_seconds=d.get("stage_seconds", {}),
            schema=schema,
            training=Training.from_dict(d.get("training")),
            favor_accuracy=FavorAccuracy.from_dict(d.get("favor_accuracy")),
            distributed=DistributedScaling.from_dict(d.get("distributed")),
        )

    def write(self, path: str | Path) -> Path:
        """Write as indented JSON (parent folders created); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def read(cls, path: str | Path) -> "Results":
        return cls.from_dict(json.loads(Path(path).read_text()))

