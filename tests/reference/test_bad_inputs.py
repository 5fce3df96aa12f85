"""Bad inputs to reference/ give clear errors: the exception type, and a message that names the
argument (and says what was expected). Issue 10's list: NumPy broadcast/gufunc errors for shape
mismatches and N = 0, rng=None or an int seed, non-integer m or N, complex input silently made
real, NaN and float packing ids, non-integer grid sides truncated, a callable f returning NaN,
exp_affine_mask and stochastic_rpe_expected_mask overflowing to inf, a malformed
MASKBENCH_REFERENCE_BUDGET."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import DenominatorError, budget
from reference import features as F
from reference.attention import masked_kernel_attention, softmax_attention
from reference.masks import hypercube as H
from reference.masks import lowrank as L
from reference.masks import sequence as S
from reference.masks import toeplitz as T
from reference.masks import tree as R

SMALL = settings(max_examples=25, deadline=None)
LOG_MAX = float(np.log(np.finfo(np.float64).max))  # 709.78...


def raises(exc: type[Exception], name: str, call, *also: str) -> str:
    """call() raises exactly ``exc`` (not a subclass standing in for it) whose message names
    ``name`` as a word, and contains each of ``also``. Returns the message."""
    with pytest.raises(Exception) as info:
        call()
    assert type(info.value) is exc, f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", msg), f"{name!r} not named in: {msg}"
    for text in also:
        assert text in msg, f"{text!r} not in: {msg}"
    return msg


def _qkv(n=4, d=3, dv=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, dv))


ATTENTION = [("softmax", softmax_attention, ("q", "k", "v"), "logits_mask"),
             ("kernel", masked_kernel_attention, ("phi_q", "phi_k", "v"), "mask")]


# ------------------------------------------------------------------------- attention: shapes, N = 0


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
@SMALL
@given(n=st.integers(1, 5), d=st.integers(1, 4), which=st.sampled_from(["d_qk", "n_v", "rank_q", "rank_k",
                                                                         "rank_v", "batch"]),
       delta=st.integers(1, 3))
def test_attention_shape_mismatches_name_the_arguments(kind, fn, names, mask_name, n, d, which, delta):
    q, k, v = np.ones((n, d)), np.ones((n, d)), np.ones((n, 2))
    nq, nk, nv = names
    if which == "d_qk":
        k, name = np.ones((n, d + delta)), nk
    elif which == "n_v":
        v, name = np.ones((n + delta, 2)), nv
    elif which == "rank_q":
        q, name = np.ones(d), nq
    elif which == "rank_k":
        k, name = np.ones(d), nk
    elif which == "rank_v":
        v, name = np.ones(n), nv
    else:  # leading dims that do not broadcast
        q, k, v, name = np.ones((2, n, d)), np.ones((2 + delta, n, d)), np.ones((2, n, 2)), nk
    raises(ValueError, name, lambda: fn(q, k, v))


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
@SMALL
@given(n=st.integers(1, 5), extra=st.integers(1, 3), axis=st.sampled_from([-1, -2]), lead=st.booleans())
def test_attention_mask_of_the_wrong_shape_is_named(kind, fn, names, mask_name, n, extra, axis, lead):
    q, k, v = _qkv(n)
    shape = [n, n]
    shape[axis] += extra
    mask = np.zeros(shape)
    if lead:  # a leading dim that does not broadcast with q's batch (2,)
        q, k, v, mask = np.stack([q, q]), np.stack([k, k]), np.stack([v, v]), np.zeros((3, n, n))
    raises(ValueError, mask_name, lambda: fn(q, k, v, mask), "(..., N_q, N)")


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_attention_n_zero_and_empty_features(kind, fn, names, mask_name):
    q, k, v = _qkv()
    raises(ValueError, names[0], lambda: fn(q[:0], k, v), "N must be >= 1")
    raises(ValueError, names[1], lambda: fn(q, k[:0], v[:0]), "N must be >= 1")
    raises(ValueError, names[0], lambda: fn(q[:, :0], k[:, :0], v), "last dim >= 1")


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
@pytest.mark.parametrize("slot", [0, 1, 2, 3])
def test_attention_complex_input_is_refused_not_made_real(kind, fn, names, mask_name, slot):
    args = list(_qkv()) + [np.zeros((4, 4))]
    args[slot] = args[slot] + 1e-3j
    raises(TypeError, (*names, mask_name)[slot], lambda: fn(*args), "complex")


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_attention_non_numeric_input(kind, fn, names, mask_name):
    q, k, v = _qkv()
    raises(TypeError, names[0], lambda: fn(np.full((4, 3), "a"), k, v), "real numeric")
    raises(TypeError, names[2], lambda: fn(q, k, [[None, None]] * 4), "real numeric")


def test_softmax_logits_mask_values_and_dtype():
    q, k, v = _qkv()
    bool_mask = np.tril(np.ones((4, 4), dtype=bool))
    raises(TypeError, "logits_mask", lambda: softmax_attention(q, k, v, bool_mask), "np.where(mask, 0.0, -np.inf)")
    raises(TypeError, "logits_mask", lambda: softmax_attention(q, k, v, np.zeros((4, 4), dtype=int)))
    for bad in (np.nan, np.inf):
        m = np.zeros((4, 4))
        m[1, 2] = bad
        raises(ValueError, "logits_mask", lambda: softmax_attention(q, k, v, m), "NaN or +inf")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_kernel_mask_must_be_finite(bad):
    q, k, v = _qkv()
    m = np.ones((4, 4))
    m[0, 1] = bad
    raises(ValueError, "mask", lambda: masked_kernel_attention(q ** 2, k ** 2, v, m), "non-finite")


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
@SMALL
@given(no_key=st.one_of(st.text(max_size=6).filter(lambda s: s not in ("raise", "zero")), st.none(),
                        st.integers(), st.just("Zero"), st.just(" raise")))
def test_attention_bad_no_key(kind, fn, names, mask_name, no_key):
    q, k, v = _qkv()
    raises(ValueError, "no_key", lambda: fn(q ** 2, k ** 2, v, no_key=no_key), '"raise" or "zero"')


@pytest.mark.parametrize("kind, fn, names, mask_name", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_no_key_is_keyword_only(kind, fn, names, mask_name):
    q, k, v = _qkv()
    with pytest.raises(TypeError):
        fn(q, k, v, None, "zero")


def test_a_row_that_sees_no_key_raises_a_denominator_error_naming_the_policy():
    q, k, v = _qkv()
    logits = np.zeros((4, 4))
    logits[1] = -np.inf
    mask = np.ones((4, 4))
    mask[3] = 0
    for call, row in ((lambda: softmax_attention(q, k, v, logits), "query 1"),
                      (lambda: masked_kernel_attention(q ** 2, k ** 2, v, mask), "query 3")):
        with pytest.raises(DenominatorError) as info:
            call()
        assert isinstance(info.value, ArithmeticError)
        assert f"{row} sees no key" in str(info.value) and 'no_key="zero"' in str(info.value)


# ------------------------------------------------------------------------------------- features


@pytest.mark.parametrize("rng", [None, 0, 7, np.int64(3), np.random.RandomState(0), np.random.SeedSequence(0),
                                 "0"])
def test_gaussian_projection_needs_a_generator(rng):
    raises(TypeError, "rng", lambda: F.gaussian_projection(4, 3, rng), "numpy.random.Generator",
           "np.random.default_rng(seed)")


@SMALL
@given(bad=st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=3), st.just(4.0)),
       slot=st.sampled_from(["m", "d"]))
def test_gaussian_projection_non_integer_sizes(bad, slot):
    m, d = (bad, 3) if slot == "m" else (4, bad)
    raises(TypeError, slot, lambda: F.gaussian_projection(m, d, np.random.default_rng(0)), "must be an int")


def test_gaussian_projection_accepts_numpy_ints_and_refuses_a_non_bool_orthogonal():
    assert F.gaussian_projection(np.int64(5), np.int32(3), np.random.default_rng(0)).shape == (5, 3)
    raises(TypeError, "orthogonal", lambda: F.gaussian_projection(4, 3, np.random.default_rng(0), orthogonal="yes"))


@pytest.mark.parametrize("fn", [F.favor_plus, F.hyperbolic, F.trig_rff])
def test_projected_features_check_x_and_w(fn):
    x = np.ones((5, 3))
    raises(ValueError, "w", lambda: fn(x, np.ones((4, 2))), "(m, d)")     # d mismatch: a gufunc error before
    raises(ValueError, "w", lambda: fn(x, np.ones(3)))                    # 1-D w
    raises(ValueError, "w", lambda: fn(x, np.ones((0, 3))))               # m = 0: a division by sqrt(0)
    raises(ValueError, "x", lambda: fn(np.float64(1.0), np.ones((4, 1))))  # 0-d x
    raises(TypeError, "x", lambda: fn(x + 0j, np.ones((4, 3))), "complex")
    raises(TypeError, "w", lambda: fn(x, np.ones((4, 3)) + 1j), "complex")


@pytest.mark.parametrize("fn", [F.relu, F.elu_plus_one, F.identity])
def test_elementwise_features_refuse_complex(fn):
    raises(TypeError, "x", lambda: fn(np.array([[1.0 + 2.0j, -1.0]])), "complex")
    np.testing.assert_array_equal(fn(np.array([[2.0]])), [[2.0 if fn is not F.elu_plus_one else 3.0]])


def test_feature_map_name_must_be_a_known_string():
    raises(ValueError, "feature map", lambda: F.feature_map(["relu"], np.ones((2, 2))), "must be one of")


# --------------------------------------------------------------------------------------- budget


@SMALL
@given(raw=st.one_of(st.sampled_from(["abc", "1.5", "-1", "0", "2GiB", "1e9", "0x10", "1 000", "inf", "nan"]),
                     st.text(max_size=8)))
def test_malformed_budget_variable_names_the_variable_and_value(raw):
    raw = raw.replace("\x00", "")  # not representable in an environment variable
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MASKBENCH_REFERENCE_BUDGET", raw)
        _check_budget_variable(raw)


def _check_budget_variable(raw: str) -> None:
    if not raw.strip():  # blank: the default
        assert budget.dense_budget() == budget.DEFAULT_BUDGET
        return
    try:
        ok = int(raw.strip(), 10) > 0
    except ValueError:
        ok = False
    if ok:
        assert budget.dense_budget() == int(raw.strip(), 10)
    else:
        msg = raises(ValueError, "MASKBENCH_REFERENCE_BUDGET", budget.dense_budget, "positive whole number")
        assert repr(raw) in msg
        # every dense builder reports it, not a bare int() error
        raises(ValueError, "MASKBENCH_REFERENCE_BUDGET", lambda: S.causal_mask(3))


def test_budget_variable_accepts_plain_integers(monkeypatch):
    for raw, want in (("800", 800), (" 1_000 ", 1000), ("", budget.DEFAULT_BUDGET)):
        monkeypatch.setenv("MASKBENCH_REFERENCE_BUDGET", raw)
        assert budget.dense_budget() == want


def test_check_dense_budget_arguments():
    raises(TypeError, "n", lambda: budget.check_dense_budget(2.5))
    raises(ValueError, "n", lambda: budget.check_dense_budget(-1))
    raises(ValueError, "copies", lambda: budget.check_dense_budget(4, copies=0))


# ------------------------------------------------------------------------------------- sequence


@pytest.mark.parametrize("n, exc", [(2.5, TypeError), (3.0, TypeError), (True, TypeError), ("3", TypeError),
                                    (0, ValueError), (-2, ValueError)])
def test_causal_mask_size(n, exc):
    raises(exc, "n", lambda: S.causal_mask(n))


def test_packing_ids_must_be_integers():
    raises(TypeError, "segment_ids", lambda: S.packing_mask(np.array([0.0, 0.0, 1.0])), "integer")
    msg = raises(TypeError, "segment_ids", lambda: S.packing_mask(np.array([0.0, np.nan, np.nan])), "NaN")
    assert "float64" in msg
    raises(TypeError, "segment_ids", lambda: S.packing_mask(np.array([True, False])))
    raises(TypeError, "segment_ids", lambda: S.packing_mask(np.array(["a", "b"])))
    raises(ValueError, "segment_ids", lambda: S.packing_mask(np.array(3)), "N >= 1")
    raises(ValueError, "segment_ids", lambda: S.packing_mask(np.zeros((2, 0), dtype=int)), "N >= 1")


@SMALL
@given(ids=st.lists(st.floats(allow_nan=True, allow_infinity=False, width=32), min_size=1, max_size=6))
def test_float_packing_ids_are_always_refused(ids):
    raises(TypeError, "segment_ids", lambda: S.packing_mask(np.array(ids, dtype=np.float64)))


def test_padding_key_mask_must_be_boolean():
    raises(TypeError, "key_mask", lambda: S.padding_mask(np.array([1.0, 0.5])), "boolean")
    raises(TypeError, "key_mask", lambda: S.padding_mask(np.array([1, 0])), "boolean")
    raises(ValueError, "key_mask", lambda: S.padding_mask(np.zeros(0, dtype=bool)), "N >= 1")
    raises(ValueError, "key_mask", lambda: S.padding_mask(np.bool_(True)))


# ------------------------------------------------------------------------------------ hypercube


def test_hypercube_bad_lambda_and_adjacency():
    raises(TypeError, "lam", lambda: H.hypercube_mask(4, 0.5 + 0.1j), "real number")
    raises(TypeError, "lam", lambda: H.hypercube_mask(4, "0.5"))
    raises(TypeError, "lam", lambda: H.hypercube_mask(4, True))
    path = np.array([[0.0, 1.0], [1.0, 0.0]])
    raises(TypeError, "adjacency", lambda: H.diffusion_kernel(path + 0j, 0.5), "complex")
    raises(ValueError, "adjacency", lambda: H.diffusion_kernel(np.array([[0.0, np.nan], [np.nan, 0.0]]), 0.5),
           "non-finite")
    raises(ValueError, "adjacency", lambda: H.diffusion_kernel(np.zeros((0, 0)), 0.5), "n >= 1")
    raises(ValueError, "lam", lambda: H.diffusion_kernel(path, np.inf))
    raises(TypeError, "n", lambda: H.hypercube_mask(4.0, 0.5))


# -------------------------------------------------------------------------------------- low rank


def test_low_rank_factors_complex_and_overflow():
    raises(TypeError, "left", lambda: L.low_rank_mask(np.ones((2, 1)) + 1j, np.ones((1, 2))), "complex")
    big = np.full((2, 1), 1e200)
    raises(ValueError, "left", lambda: L.low_rank_mask(big, big.T), "overflows")


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(n=2.5), TypeError, "n"), (dict(n=4.0), TypeError, "n"), (dict(num_freqs=1.5), TypeError, "num_freqs"),
    (dict(scale=np.nan), ValueError, "scale"), (dict(scale=1j), TypeError, "scale"),
    (dict(base=0.0), ValueError, "base"), (dict(base=-2.0), ValueError, "base"), (dict(base=np.inf), ValueError, "base"),
])
def test_sinusoidal_encodings_arguments(kwargs, exc, name):
    args = dict(n=4, num_freqs=2) | kwargs
    raises(exc, name, lambda: L.sinusoidal_encodings(**args))


@SMALL
@given(scale=st.floats(0.1, 60.0))
def test_stochastic_rpe_expected_mask_refuses_overflow_instead_of_inf(scale):
    """|p_i| = scale, so the largest exponent is scale^2: refused beyond log(float64 max), else finite."""
    enc = L.sinusoidal_encodings(5, 2, scale=scale)
    if scale**2 > LOG_MAX * (1 + 1e-12):
        raises(ValueError, "encodings", lambda: L.stochastic_rpe_expected_mask(enc), "scale the encodings down")
    elif scale**2 < LOG_MAX * (1 - 1e-12):
        assert np.isfinite(L.stochastic_rpe_expected_mask(enc)).all()


def test_stochastic_rpe_factors_refuse_overflow():
    enc = L.sinusoidal_encodings(4, 2, scale=1.0)
    raises(ValueError, "projection", lambda: L.stochastic_rpe_factors(enc, np.full((3, 4), 1e3)), "overflow")
    raises(TypeError, "encodings", lambda: L.stochastic_rpe_factors(enc + 0j, np.ones((3, 4))), "complex")


# ------------------------------------------------------------------------------------- Toeplitz


@pytest.mark.parametrize("shape, exc, name", [
    ((2.5, 2), TypeError, "shape[0]"), ((2.0, 2), TypeError, "shape[0]"), ((2, True), TypeError, "shape[1]"),
    ("23", TypeError, "shape"), ((np.float64(3),), TypeError, "shape[0]"), ((2, 0), ValueError, "shape")])
def test_grid_sides_are_never_truncated(shape, exc, name):
    raises(exc, name, lambda: T.check_grid_shape(shape))
    with pytest.raises(exc):
        T.block_toeplitz_mask(shape, np.ones((3, 3)))


def test_grid_side_error_names_the_side():
    raises(TypeError, "shape[1]", lambda: T.grid_offsets((2, 2.5)), "got float 2.5")
    assert T.check_grid_shape((np.int64(2), 3)) == (2, 3)


def test_toeplitz_complex_coefficients_and_tables():
    raises(TypeError, "coeffs", lambda: T.toeplitz_mask(np.ones(3) + 1j), "complex")
    raises(TypeError, "table", lambda: T.block_toeplitz_mask((2,), np.ones(3) + 1j), "complex")


def test_block_toeplitz_n_and_cls_token_types():
    table = np.ones((3, 5))
    raises(TypeError, "n", lambda: T.block_toeplitz_mask((2, 3), table, n=6.0))
    raises(TypeError, "cls_token", lambda: T.block_toeplitz_mask((2, 3), table, cls_token="yes"))


@pytest.mark.parametrize("make", [lambda f: T.symmetric_coefficients(f, 4), lambda f: T.l1_table(f, (2, 3))],
                         ids=["symmetric_coefficients", "l1_table"])
@SMALL
@given(bad=st.sampled_from(["nan", "inf", "shape", "complex", "str", "not callable"]))
def test_toeplitz_callables_returning_garbage_are_named(make, bad):
    fs = {"nan": (lambda d: np.where(d == 1, np.nan, 1.0), ValueError, "non-finite"),
          "inf": (lambda d: np.where(d == 2, -np.inf, 1.0), ValueError, "non-finite"),
          "shape": (lambda d: np.ones(d.size + 1), ValueError, "one value per entry"),
          "complex": (lambda d: d + 0j, TypeError, "real numbers"),
          "str": (lambda d: "x", TypeError, "real numbers"),
          "not callable": (np.ones(7), TypeError, "callable")}
    f, exc, text = fs[bad]
    raises(exc, "f", lambda: make(f), text)


def test_symmetric_coefficients_size():
    raises(TypeError, "n", lambda: T.symmetric_coefficients(lambda d: 1.0, 2.5))
    raises(ValueError, "n", lambda: T.symmetric_coefficients(lambda d: 1.0, 0))


# ----------------------------------------------------------------------------------------- tree


def test_forest_id_types():
    raises(TypeError, "parent", lambda: R.forest_adjacency(np.array([-1.0, 0.0])), "integer")
    raises(TypeError, "parent", lambda: R.forest_adjacency(np.array([True, False])))
    raises(TypeError, "edge_index", lambda: R.forest_adjacency(edge_index=np.array([[0.0], [1.0]])), "integer")
    raises(TypeError, "n", lambda: R.forest_adjacency(edge_index=np.array([[0], [1]]), n=3.0))
    raises(ValueError, "n", lambda: R.forest_adjacency(edge_index=np.zeros((2, 0), dtype=int)))
    raises(TypeError, "weights", lambda: R.forest_adjacency(np.array([-1, 0]), weights=np.ones(2) + 1j), "complex")
    raises(TypeError, "adjacency", lambda: R.forest_adjacency(adjacency=sp.csr_matrix(np.zeros((2, 2)) + 1j)))


def test_edge_index_with_conflicting_duplicate_weights_is_refused():
    both = np.array([[0, 1, 1], [1, 0, 2]])
    msg = raises(ValueError, "edge_index", lambda: R.forest_adjacency(edge_index=both, weights=np.array([1.0, 2.0, 1.0])),
                 "different weights")
    assert "(0, 1)" in msg and "1.0" in msg and "2.0" in msg
    adj = R.forest_adjacency(edge_index=both, weights=np.array([1.5, 1.5, 3.0]))  # the same edge twice: fine
    assert adj[0, 1] == adj[1, 0] == 1.5 and adj[1, 2] == 3.0 and adj.nnz == 4


@pytest.mark.parametrize("f, exc, text", [
    (lambda d: np.where(d > 1, np.nan, 1.0), ValueError, "non-finite"),
    (lambda d: np.where(d == 2, np.inf, 1.0), ValueError, "non-finite"),
    (lambda d: np.ones(3), ValueError, "one value per entry"),
    (lambda d: d * 1j, TypeError, "real numbers"),
])
def test_tree_mask_callable_f_returning_garbage(f, exc, text):
    adj = R.forest_adjacency(np.array([-1, 0, 1, -1]))
    raises(exc, "f", lambda: R.tree_mask(adj, f), text)


def test_tree_mask_complex_vector_and_bad_adjacency():
    adj = R.forest_adjacency(np.array([-1, 0, 1]))
    raises(TypeError, "f", lambda: R.tree_mask(adj, np.ones(3) + 1j), "complex")
    raises(ValueError, "adjacency", lambda: R.tree_distances(np.zeros((2, 3))), "square")
    raises(TypeError, "adjacency", lambda: R.tree_distances(np.zeros((2, 2)) + 1j))


@SMALL
@given(a=st.floats(-50, 50), b=st.floats(-800, 800))
def test_exp_affine_mask_refuses_overflow_instead_of_inf(a, b):
    """Path 0-1-2-3 (distances 0..3) and an isolated node: the exponent a dist + b peaks at
    max(b, 3a + b); refused beyond log(float64 max), else every entry finite (and exact)."""
    adj = R.forest_adjacency(np.array([-1, 0, 1, 2, -1]))
    top = max(b, 3 * a + b)
    if top > LOG_MAX + 1e-9:
        raises(ValueError, "a", lambda: R.exp_affine_mask(adj, a, b), f"b={b!r}", "overflows")
    elif top < LOG_MAX - 1e-9:
        m = R.exp_affine_mask(adj, a, b)
        assert np.isfinite(m).all() and m[0, 4] == 0.0
        assert m[0, 3] == np.exp(3 * a + b) and m[2, 2] == np.exp(b)


def test_exp_affine_mask_parameters():
    adj = R.forest_adjacency(np.array([-1, 0]))
    raises(ValueError, "a", lambda: R.exp_affine_mask(adj, np.inf, 0.0), "finite")
    raises(ValueError, "b", lambda: R.exp_affine_mask(adj, 1.0, np.nan), "finite")
    raises(TypeError, "a", lambda: R.exp_affine_mask(adj, 1j, 0.0))
