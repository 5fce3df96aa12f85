"""measure.training: tiny runs finish, are reproducible, NodeFormer learns the SBM, records are
complete and serialisable; the measure stage and the standalone entry run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from measure import training as T
from measure.datasets import sbm
from results.schema import Training, TrainingRun


@pytest.fixture(scope="module")
def small_sbm():
    # 90 nodes, strong blocks (degree ~ 8), weak features: the graph carries the labels
    return T.Inputs(sbm(n=90, classes=3, p_in=0.25, p_out=0.01, signal=0.5, seed=1))


def test_tiny_run_finishes_with_every_field(small_sbm):
    run, net = T.train_one(small_sbm, "nodeformer", seed=0, epochs=4)
    assert isinstance(run, TrainingRun) and run.error is None
    assert (run.dataset, run.model, run.seed, run.epochs) == ("sbm", "nodeformer", 0, 4)
    for curve in (run.train_loss, run.train_acc, run.val_acc, run.test_acc, run.val_loss, run.edge_loss):
        assert len(curve) == 4 and all(np.isfinite(curve))
    assert all(0 <= a <= 1 for a in run.train_acc + run.val_acc + run.test_acc)
    assert 1 <= run.best_epoch <= 4 and run.test_at_best_val == run.test_acc[run.best_epoch - 1]
    assert run.best_val_acc == max(run.val_acc)
    ties = [i for i, a in enumerate(run.val_acc) if a == run.best_val_acc]
    assert run.val_loss[run.best_epoch - 1] == min(run.val_loss[i] for i in ties)  # ties: lowest val loss
    rows = net.latent_rows(small_sbm, [0, 5])
    assert rows.shape == (2, 90) and torch.allclose(rows.sum(-1), torch.ones(2), atol=1e-5)


@pytest.mark.parametrize("model", T.MODELS)
def test_same_seed_same_numbers_other_seed_other_numbers(small_sbm, model):
    state = torch.get_rng_state()
    a, _ = T.train_one(small_sbm, model, seed=3, epochs=3)
    b, _ = T.train_one(small_sbm, model, seed=3, epochs=3)
    c, _ = T.train_one(small_sbm, model, seed=4, epochs=3)
    assert a.train_loss == b.train_loss and a.test_acc == b.test_acc and a.edge_loss == b.edge_loss
    assert a.train_loss != c.train_loss
    assert torch.equal(torch.get_rng_state(), state)  # torch's global RNG is never used


def test_nodeformer_beats_chance_on_the_sbm(small_sbm):
    """3 balanced classes: chance is 1/3. With p_in 0.25 vs p_out 0.01 the relational bias alone
    nearly separates the blocks; 60 epochs reach > 0.6 on the test nodes (measured ~0.9)."""
    run, _ = T.train_one(small_sbm, "nodeformer", seed=0, epochs=60)
    assert run.error is None
    assert run.test_at_best_val > 0.6
    assert run.train_loss[-1] < run.train_loss[0]


def test_train_all_record_summary_and_json(small_sbm, monkeypatch):
    drawn = []

    def draw(seed=0):
        drawn.append(seed)
        return small_sbm.data

    monkeypatch.setitem(T.DATASETS, "sbm", draw)
    res = T.train_all(quick=True, datasets=["sbm"], models=["nodeformer", "mlp"], seeds=[0, 1], epochs=3)
    assert isinstance(res, Training) and res.mode == "quick" and res.seeds == [0, 1]
    assert [(r.model, r.seed) for r in res.runs] == [("nodeformer", 0), ("nodeformer", 1), ("mlp", 0), ("mlp", 1)]
    assert drawn == [0, 1]  # one data draw per seed, shared by the models
    assert [d.name for d in res.datasets] == ["sbm"] and res.datasets[0].n == 90
    (g,) = res.latent
    assert g.dataset == "sbm" and g.seed == 0 and len(g.nodes) == 3 * T.LATENT_PER_CLASS
    assert np.array(g.attention).shape == (len(g.nodes), 90) == np.array(g.adjacency).shape
    assert sorted(g.order) == list(range(90))
    nf, mlp = res.summary
    assert (nf.model, nf.seeds, mlp.model) == ("nodeformer", 2, "mlp")
    accs = [r.test_at_best_val for r in res.runs[:2]]
    assert nf.mean == pytest.approx(np.mean(accs)) and nf.std == pytest.approx(np.std(accs, ddof=1))
    assert nf.diff_mean == pytest.approx(np.mean(accs) - np.mean([r.test_at_best_val for r in res.runs[2:]]))
    assert nf.diff_low <= nf.diff_mean <= nf.diff_high and mlp.diff_mean is None
    assert res.settings["lambda"] == 0.1 and res.settings["epochs"] == 3
    back = Training.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res
    lines = T.table(res)
    assert len(lines) == 4 and "nodeformer" in lines[2]


def test_a_failing_model_is_recorded_not_raised(small_sbm, monkeypatch):
    class Broken(torch.nn.Module):
        def __init__(self, *a):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, inp):
            return (inp.x[:, :3] * self.w) / 0.0, None  # NaN logits

    monkeypatch.setitem(T.BUILDERS, "broken", Broken)
    run, _ = T.train_one(small_sbm, "broken", 0, 5)
    assert run.error.startswith("FloatingPointError: non-finite training loss") and run.val_acc == []
    assert run.best_epoch is None and run.test_at_best_val is None


def test_bad_arguments(small_sbm):
    with pytest.raises(ValueError, match="unknown model"):
        T.build("gat", 3, 2, torch.Generator())
    with pytest.raises(ValueError, match="epochs"):
        T.train_one(small_sbm, "mlp", 0, 0)
    with pytest.raises(ValueError, match="unknown model"):
        T.train_all(models=["gat"])
    with pytest.raises(ValueError, match="seeds"):
        T.train_all(seeds=[])


def test_threads_restored():
    before = torch.get_num_threads()
    with T.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_measure_stage_and_main(small_sbm, monkeypatch, capsys, tmp_path):
    from measure import stages

    calls = []

    def fake_train_all(quick, progress=False, status=None, **kw):
        calls.append(quick)
        return T._train_all(quick, progress, ["sbm"], ["mlp"], [0], 2, status)

    monkeypatch.setitem(T.DATASETS, "sbm", lambda seed=0: small_sbm.data)
    monkeypatch.setattr(T, "train_all", fake_train_all)
    lines = []
    res = stages.training_stage(True, progress=False, status=lines.append)
    assert calls == [True] and isinstance(res, Training) and len(res.runs) == 1
    assert any("mlp" in line for line in lines)
    out = tmp_path / "t.json"
    assert T.main(["--quick", "--no-progress", "--json", str(out)]) == 0
    assert "test accuracy at best val" in capsys.readouterr().out
    assert Training.from_dict(json.loads(out.read_text())).runs[0].model == "mlp"


def test_pipeline_runs_the_stage_unless_skipped_or_only(monkeypatch):
    """collect() with every other stage replaced: the training record lands in Results.training
    and its wall time in stage_seconds; --skip-training and --only leave it out; a raising stage is
    recorded in environment["stage_errors"]."""
    from measure import stages
    from measure.pipeline import Options, collect
    from results.schema import Results

    fake = Training("quick", {"epochs": 1}, seeds=[0])
    monkeypatch.setattr(stages, "sweeps_stage", lambda *a, **k: ([], []))
    monkeypatch.setattr(stages, "favor_stage", lambda *a, **k: None)
    monkeypatch.setattr(stages, "favor_accuracy_stage", lambda *a, **k: None)
    monkeypatch.setattr(stages, "gallery_stage", lambda *a, **k: None)
    monkeypatch.setattr(stages, "training_stage", lambda quick, progress=True, status=None: fake)
    monkeypatch.setattr(stages, "distributed_stage", lambda *a, **k: None)
    base = {"quick": True, "skip_memory": True, "skip_verify": True, "skip_peers": True, "skip_history": True,
            "progress": False, "argv": []}
    res = collect(Options(**base))
    assert res.training is fake and "training" in res.stage_seconds
    assert Results.from_dict(res.to_dict()).training == fake
    assert collect(Options(**base, skip_training=True)).training is None
    only = collect(Options(**base, only=["linear"]))
    assert only.training is None and "training" not in only.stage_seconds
    monkeypatch.setattr(stages, "training_stage", lambda *a, **k: 1 / 0)
    broken = collect(Options(**base))
    assert broken.training is None and "ZeroDivisionError" in broken.environment["stage_errors"]["training"]


def test_cli_flag():
    from measure.cli import parse_args

    assert parse_args(["--quick", "--skip-training"])[0].skip_training is True
    assert parse_args(["--quick"])[0].skip_training is False


def _run(model, seed, acc, ds="sbm", error=None):
    return TrainingRun(ds, model, seed, 1, test_at_best_val=acc, error=error)


def test_paired_intervals_are_scipys_t_intervals_on_the_seed_differences():
    """vs MLP and vs GCN: mean and Student-t interval of the per-seed differences over the seeds
    both have (the MLP lacks seed 3; the GCN's seed 1 errored), as scipy.stats.t.interval gives;
    the errored run enters nothing and is listed."""
    from scipy import stats

    nf = {0: 0.80, 1: 0.74, 2: 0.91, 3: 0.66}
    mlp = {0: 0.50, 1: 0.55, 2: 0.52}
    gcn = {0: 0.90, 1: 0.99, 2: 0.85, 3: 0.70}
    runs = ([_run("nodeformer", k, v) for k, v in nf.items()] + [_run("mlp", k, v) for k, v in mlp.items()]
            + [_run("gcn", k, v, error="FloatingPointError: x" if k == 1 else None) for k, v in gcn.items()])
    s = {x.model: x for x in T.summarise(runs)}
    for base, common, got in (("mlp", [0, 1, 2], (s["nodeformer"].mlp_mean, s["nodeformer"].diff_mean,
                                                  s["nodeformer"].diff_low, s["nodeformer"].diff_high)),
                              ("gcn", [0, 2, 3], (s["nodeformer"].gcn_mean, s["nodeformer"].gcn_diff_mean,
                                                  s["nodeformer"].gcn_diff_low, s["nodeformer"].gcn_diff_high))):
        b = mlp if base == "mlp" else gcn
        d = np.array([nf[k] - b[k] for k in common])
        low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        assert got == pytest.approx((np.mean([b[k] for k in common]), d.mean(), low, high), rel=1e-12)
    assert s["gcn"].seeds == 3 and s["gcn"].excluded == [1] and s["gcn"].mean == pytest.approx(np.mean([0.9, 0.85, 0.7]))
    assert s["gcn"].gcn_diff_mean is None and s["mlp"].diff_mean is None  # no row against itself
    assert s["mlp"].gcn_diff_mean == pytest.approx(np.mean([0.50 - 0.90, 0.52 - 0.85]))  # seeds 0, 2
    one = {x.model: x for x in T.summarise([_run("nodeformer", 0, 0.8), _run("mlp", 0, 0.5)])}
    assert one["nodeformer"].diff_mean == pytest.approx(0.3) and one["nodeformer"].diff_low is None


def test_an_errored_run_is_left_out_and_named_in_the_table():
    runs = [_run("mlp", 0, 0.5), _run("mlp", 1, 0.9, error="RuntimeError: boom")]
    (s,) = T.summarise(runs)
    assert (s.seeds, s.mean, s.excluded) == (1, 0.5, [1])
    res = Training("quick", {"epochs": 1}, models=["mlp"], seeds=[0, 1], runs=runs, summary=[s])
    assert "excluded, errored: seeds 1" in T.table(res)[-1]


def test_test_labels_do_not_leak_into_training_or_selection():
    """Permuting the test nodes' labels changes no training loss, validation number or chosen
    epoch of any model (it does change the test accuracy somewhere, so the check has teeth)."""
    import copy

    data = sbm(n=60, classes=3, p_in=0.3, p_out=0.02, signal=0.5, seed=2)
    other = copy.deepcopy(data)
    t = np.flatnonzero(other.test_mask)
    other.labels[t] = np.random.default_rng(5).permutation(other.labels[t])[::-1]
    assert (other.labels[t] != data.labels[t]).any()
    a, b = T.Inputs(data), T.Inputs(other)
    test_changed = False
    for model in T.MODELS:
        r1, _ = T.train_one(a, model, 0, 6)
        r2, _ = T.train_one(b, model, 0, 6)
        assert r1.error is None and r2.error is None
        assert (r1.train_loss, r1.val_acc, r1.val_loss, r1.best_epoch) == (r2.train_loss, r2.val_acc, r2.val_loss,
                                                                           r2.best_epoch), model
        assert r1.edge_loss == r2.edge_loss and r1.attention_deviation == r2.attention_deviation
        test_changed |= r1.test_acc != r2.test_acc
    assert test_changed


def test_attention_terms_measure_the_near_constant_attention(small_sbm):
    """SGFormer / DIFFormer record one score ratio and one deviation per attention layer. By
    Cauchy-Schwarz |q~_u . sum_w k~_w| <= ||q~_u|| sqrt(N) and mean_u ||q~_u|| <= 1/sqrt(N), so
    the ratio is at most 1/N whatever the weights; the outputs stay near the constant term."""
    for model, layers in (("sgformer", 1), ("difformer", 2)):
        run, net = T.train_one(small_sbm, model, 0, 3)
        assert len(run.score_ratio) == len(run.attention_deviation) == layers
        assert all(0 < r <= 1 / 90 for r in run.score_ratio)
        assert all(0 <= d < 0.1 for d in run.attention_deviation)
    run, _ = T.train_one(small_sbm, "gcn", 0, 2)
    assert run.score_ratio is None and run.attention_deviation is None


def test_the_mlp_shares_the_input_block_and_the_gcn_uses_the_graph(small_sbm):
    g = torch.Generator().manual_seed(0)
    mlp = T.build("mlp", 4, 3, g)
    assert {n for n, _ in mlp.named_children()} == {"fc_in", "norm", "fc_out"}
    gcn = T.build("gcn", small_sbm.x.shape[1], 3, g).eval()
    with torch.no_grad():
        out, _ = gcn(small_sbm)
        # the same weights without the graph (A_hat = I) give other logits
        class NoGraph:
            x, a_hat = small_sbm.x, torch.eye(90).to_sparse()
        assert not torch.allclose(out, gcn(NoGraph)[0])
