"""reference/features.py: exact kernel identities of the feature maps and the projection draw."""
from __future__ import annotations

import numpy as np
import pytest

from reference import features as F

#: float64 elementwise maps and length-d dot products: a few ulps times d.
RTOL = 1e-12


def _data(seed=0, n=6, d=5, m=12):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) * 0.5, rng.standard_normal((n, d)) * 0.5, F.gaussian_projection(m, d, rng)


def _sq(x):
    return (x * x).sum(-1)


def test_favor_plus_kernel_identity():
    """phi(x).phi(y) = (1/m) sum_r exp(w_r.(x+y) - (|x|^2+|y|^2)/2), exactly (Performer Lemma 1)."""
    x, y, w = _data(1)
    got = F.favor_plus(x, w) @ F.favor_plus(y, w).T
    s = x[:, None, :] + y[None, :, :]
    expected = np.exp(s @ w.T).mean(-1) * np.exp(-0.5 * (_sq(x)[:, None] + _sq(y)[None, :]))
    np.testing.assert_allclose(got, expected, rtol=RTOL)
    assert (F.favor_plus(x, w) > 0).all()


def test_hyperbolic_kernel_identity():
    x, y, w = _data(2)
    got = F.hyperbolic(x, w) @ F.hyperbolic(y, w).T
    s = x[:, None, :] + y[None, :, :]
    expected = np.cosh(s @ w.T).mean(-1) * np.exp(-0.5 * (_sq(x)[:, None] + _sq(y)[None, :]))
    np.testing.assert_allclose(got, expected, rtol=RTOL)
    assert F.hyperbolic(x, w).shape == (6, 24)


def test_trig_rff_kernel_identity():
    """phi(x).phi(y) = exp((|x|^2+|y|^2)/2) (1/m) sum_r cos(w_r.(x-y)): a cos/sin swap breaks it."""
    x, y, w = _data(3)
    got = F.trig_rff(x, w) @ F.trig_rff(y, w).T
    diff = x[:, None, :] - y[None, :, :]
    expected = np.cos(diff @ w.T).mean(-1) * np.exp(0.5 * (_sq(x)[:, None] + _sq(y)[None, :]))
    np.testing.assert_allclose(got, expected, rtol=RTOL)


def test_deterministic_maps():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    np.testing.assert_array_equal(F.relu(x), [[0.0, 0.0, 0.0, 0.5, 3.0]])
    np.testing.assert_allclose(F.elu_plus_one(x), [[np.exp(-2.0), np.exp(-0.5), 1.0, 1.5, 4.0]], rtol=RTOL)
    assert (F.elu_plus_one(np.linspace(-30, 30, 101)) > 0).all()
    np.testing.assert_array_equal(F.identity(x.astype(np.float32)), x)
    assert F.identity(x.astype(np.float32)).dtype == np.float64


def test_feature_map_dispatch():
    x, _, w = _data(4)
    np.testing.assert_array_equal(F.feature_map("favor+", x, w), F.favor_plus(x, w))
    np.testing.assert_array_equal(F.feature_map("relu", x), F.relu(x))
    with pytest.raises(ValueError, match=r"feature map must be one of .*got 'softmax'"):
        F.feature_map("softmax", x, w)
    with pytest.raises(ValueError, match="needs a projection matrix w"):
        F.feature_map("trig", x)


@pytest.mark.parametrize("m, d", [(10, 4), (3, 5), (8, 8)])
def test_gaussian_projection_orthogonal_blocks_and_reproducible(m, d):
    rng = np.random.default_rng
    w = F.gaussian_projection(m, d, rng(3), orthogonal=True)
    assert w.shape == (m, d)
    norms = np.linalg.norm(w, axis=1)
    for start in range(0, m, d):
        block = w[start: start + d]
        gram = block @ block.T
        assert np.abs(gram - np.diag(np.diag(gram))).max() <= 1e-12 * norms.max() ** 2
    assert norms.max() - norms.min() > 1e-3 * norms.max()  # independent chi(d) lengths
    assert np.array_equal(w, F.gaussian_projection(m, d, rng(3), orthogonal=True))
    assert not np.allclose(w, F.gaussian_projection(m, d, rng(4), orthogonal=True))


def test_gaussian_projection_iid_and_invalid_sizes():
    w = F.gaussian_projection(4, 4, np.random.default_rng(0))
    gram = w @ w.T
    assert np.abs(gram - np.diag(np.diag(gram))).max() > 1e-3  # iid rows are not orthogonal
    for m, d, name in ((0, 4, "m"), (-1, 4, "m"), (4, 0, "d")):
        with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
            F.gaussian_projection(m, d, np.random.default_rng(0))


def test_gaussian_projection_leaves_numpy_global_state_alone():
    before = np.random.get_state()[1].copy()
    F.gaussian_projection(6, 3, np.random.default_rng(0), orthogonal=True)
    assert np.array_equal(np.random.get_state()[1], before)
