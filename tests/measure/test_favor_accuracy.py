"""measure.experiments.favor_accuracy: FAVOR+ attention against exact softmax over (q, k std, m),
and its results.schema record (round trip; files written before it still load)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from measure.experiments import favor_accuracy
from results.schema import FavorAccuracy, Results


@pytest.fixture(scope="module")
def small() -> FavorAccuracy:
    return favor_accuracy(n=64, seeds=2, std=[0.125, 0.5, 1.0], m=[16, 128], d=16)


def test_grid_and_curves(small):
    assert (small.d, small.n, small.seeds, small.orthogonal) == (16, 64, 2, True)
    assert small.std == [0.125, 0.5, 1.0] and small.m == [16, 128]
    assert sorted((c.mask, c.m) for c in small.curves) == [("causal", 16), ("causal", 128), ("none", 16),
                                                           ("none", 128)]
    for c in small.curves:
        assert len(c.error) == len(c.error_max) == 3
        assert all(0 < e <= mx for e, mx in zip(c.error, c.error_max))


def test_error_grows_with_std_and_falls_with_m(small):
    # the estimator's relative variance grows like exp(|x+y|^2): steeply in the q, k scale
    for c in small.curves:
        assert c.error[0] < c.error[1] < c.error[2]
        assert c.error[0] < 0.15
    for mask in ("none", "causal"):
        assert small.curve(mask, 128).error[0] < small.curve(mask, 16).error[0]


def test_matches_a_dense_computation():
    # one cell by hand: the same draws, the exact softmax written out
    import torch

    import fast

    acc = favor_accuracy(n=24, seeds=1, std=[0.3], m=[32], d=8, orthogonal=False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(24, 8, generator=g) for _ in range(3))
    w = fast.gaussian_projection(32, 8, orthogonal=False, generator=g)
    q, k = 0.3 * q, 0.3 * k
    logits = q @ k.T / 8 ** 0.5
    for mask, op in (("none", None), ("causal", fast.CausalMask(24))):
        if mask == "causal":
            logits = logits.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), -torch.inf)
        exact = torch.softmax(logits, -1) @ v
        out = fast.favor_attention(q, k, v, w, op)
        want = float(torch.linalg.norm(out - exact) / torch.linalg.norm(exact))
        assert acc.curve(mask, 32).error == pytest.approx([want], rel=1e-4)


def test_deterministic():
    a = favor_accuracy(n=16, seeds=1, std=[0.25], m=[8], d=8)
    b = favor_accuracy(n=16, seeds=1, std=[0.25], m=[8], d=8)
    assert a == b


@pytest.mark.parametrize("kw", [{"n": 1}, {"seeds": 0}, {"std": []}, {"std": [0.0]}, {"m": []}, {"m": [0]}])
def test_refuses_bad_grids(kw):
    with pytest.raises(ValueError):
        favor_accuracy(**{"n": 16, "seeds": 1, "std": [0.25], "m": [8], "d": 8, **kw})


def test_results_round_trip_and_old_files(small, tmp_path):
    res = Results({"mode": "quick"}, favor_accuracy=small)
    back = Results.read(res.write(tmp_path / "r.json"))
    assert back.favor_accuracy == small
    d = json.loads((tmp_path / "r.json").read_text())
    del d["favor_accuracy"]  # a file written before the experiment existed
    assert Results.from_dict(d).favor_accuracy is None
    np.testing.assert_allclose(back.favor_accuracy.curve("none", 16).error, small.curve("none", 16).error)
