"""The asv suite is generated from the registry: every mechanism has its benchmarks, a mechanism
registered in a test appears, the suite reads old commits' registry API, and `asv check` passes."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

from asv_bench import accuracy, attention, common, complexity
from verify.mechanisms import get, mechanisms
from verify.registry import Variant, register, unregister

ROOT = Path(__file__).resolve().parents[2]
MODULES = (attention, accuracy, complexity)


def _reload_suite() -> None:
    for module in MODULES:
        importlib.reload(module)


def _benchmarks(module: types.ModuleType, cls_name: str) -> set[str]:
    cls = getattr(module, cls_name)
    return {name for name in dir(cls) if name.startswith(("time_", "peakmem_", "track_"))}


def test_every_mechanism_has_time_peakmem_and_track_benchmarks():
    mechs = mechanisms()
    assert mechs, "the registry is empty"
    for mech in mechs:
        name = common.class_name(mech.id)
        assert _benchmarks(attention, name) == {"time_attention", "peakmem_attention"}, mech.id
        assert _benchmarks(complexity, name) == {"track_exponent"}, mech.id
        assert getattr(complexity, name).unit == "exponent"
        assert getattr(complexity, name).mechanism is mech
        # accuracy needs an N where the float64 reference runs
        has_accuracy = min(common.size_grid(mech)) <= max(mech.dense_sizes)
        assert hasattr(accuracy, name) == has_accuracy, mech.id
        if has_accuracy:
            assert _benchmarks(accuracy, name) == {"track_relative_error"}
    # nothing else was generated (no stale class of an unregistered mechanism)
    names = {common.class_name(m.id) for m in mechs}
    assert set(attention._GENERATED) == names == set(complexity._GENERATED)


def test_class_names_are_identifiers_asv_does_not_split():
    assert common.class_name("toeplitz-1d") == "toeplitz_1d"
    assert common.class_name("2d-grid") == "m_2d_grid"
    for mech in mechanisms():
        name = common.class_name(mech.id)
        assert name.isidentifier() and "-" not in name


def test_exponent_grid_spans_what_a_fit_needs():
    for mech in mechanisms():
        sizes = complexity.exponent_grid(mech)
        assert len(sizes) >= complexity.EXPONENT_POINTS, (mech.id, sizes)
        assert sizes == sorted(set(sizes))
        assert math.log10(sizes[-1] / sizes[0]) >= 1.5, (mech.id, sizes)
        assert sizes[-1] <= max(mech.quick_fast_sizes)
        assert all(mech.admissible(n) == n for n in sizes)


@pytest.fixture
def toy():
    """A mechanism registered by the test: the linear record under a new id, two variants, small grids."""
    base = get("linear")
    mech = dataclasses.replace(
        base, id="asv-toy", title="asv toy",
        variants=(Variant("first", "first variant"), Variant("second", "second variant")),
        fast_sizes=tuple(2**p for p in range(5, 11)), quick_fast_sizes=tuple(2**p for p in range(5, 11)),
        dense_sizes=tuple(2**p for p in range(5, 9)), quick_dense_sizes=tuple(2**p for p in range(5, 9)))
    register(mech)
    _reload_suite()
    try:
        yield mech
    finally:
        unregister(mech.id)
        _reload_suite()


def test_registered_mechanism_appears_in_every_module(toy):
    assert _benchmarks(attention, "asv_toy") == {"time_attention", "peakmem_attention"}
    assert _benchmarks(accuracy, "asv_toy") == {"track_relative_error"}
    assert _benchmarks(complexity, "asv_toy") == {"track_exponent"}
    assert attention.asv_toy.params == [list(common.IMPLEMENTATIONS), common.size_grid(toy)]
    assert complexity.asv_toy.sizes == [16, 64, 256, 1024]  # top: the quick grid's 2^10

    # the generated benchmarks run: one timed call, one skip, a finite exponent
    bench = attention.asv_toy()
    bench.setup("fast", 64)
    bench.time_attention("fast", 64)
    with pytest.raises(NotImplementedError, match="dense_sizes"):
        bench.setup("dense", 1024)
    err = accuracy.asv_toy()
    err.setup("fast", 64)
    assert 0 <= err.track_relative_error("fast", 64) < 1e-4
    exp = complexity.asv_toy()
    exp.setup()
    assert math.isfinite(exp.track_exponent())


def test_unregistered_mechanism_disappears_on_reload(toy):
    unregister(toy.id)
    try:
        _reload_suite()
        assert not hasattr(attention, "asv_toy") and not hasattr(complexity, "asv_toy")
    finally:
        register(toy)  # the fixture unregisters it


def test_clashing_class_names_are_refused():
    linear = get("linear")
    clash = dataclasses.replace(linear, id="linear!")  # "linear!" -> class "linear_"; "linear" stays
    twin = dataclasses.replace(linear, id="linear?")  # -> "linear_" too
    with pytest.raises(RuntimeError, match="linear_"):
        common.install_classes({}, [attention._benchmark_class(clash), attention._benchmark_class(twin)])


# ----------------------------------------------------------------------------- old commits' API


def test_old_record_api():
    """Records of commits before 519625b: make_problem only, extra_factor for the cost factor."""
    linear = get("linear")
    calls = []
    old = types.SimpleNamespace(
        id="old", make_problem=lambda n, seed: calls.append((n, seed)) or "problem", extra_factor=len)
    assert common.make_problem(old, 128) == "problem" and calls == [(128, common.SEED)]
    assert common.cost_factor(old) is len
    assert common.admissible(old, 100) == 100
    assert common.cost_factor(linear) is None
    assert common.cost_factor(get("tree-diam")) is get("tree-diam").cost_factor


def test_loader_falls_back_to_what_registered(monkeypatch):
    """A commit whose loader raises (519625b) is benchmarked on the mechanisms that registered."""
    broken = types.ModuleType("verify.mechanisms")

    def fail(name):
        raise TypeError("Mechanism.__init__() got an unexpected keyword argument 'extra_factor'")

    broken.__getattr__ = fail
    monkeypatch.setitem(sys.modules, "verify.mechanisms", broken)
    load, error = common._import_loader()
    assert error is not None and "extra_factor" in error
    assert [m.id for m in load()] == [m.id for m in mechanisms()]


def test_loader_without_verify_mechanisms_uses_the_old_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "verify.mechanisms", types.ModuleType("verify.mechanisms"))
    import verify.registry

    monkeypatch.setattr(verify.registry, "mechanisms", lambda: ["old loader"], raising=False)
    load, error = common._import_loader()
    assert error is None and load() == ["old loader"]


def test_fit_of_old_commits_agrees_with_fit_times(monkeypatch):
    sizes, seconds = [256, 1024, 4096, 16384], [2e-3, 7e-3, 3e-2, 0.13]
    new = complexity._fit(sizes, seconds, None)
    new_cost = complexity._fit(sizes, seconds, [2.0, 4.0, 8.0, 16.0])
    monkeypatch.setattr(complexity, "fit_times", None)
    assert complexity._fit(sizes, seconds, None) == pytest.approx(new, abs=1e-12)
    assert complexity._fit(sizes, seconds, [2.0, 4.0, 8.0, 16.0]) == pytest.approx(new_cost, abs=1e-12)
    assert new_cost == pytest.approx(new - 0.5, abs=1e-9)  # t / N^0.5 lowers the slope by 0.5


# ----------------------------------------------------------------------------- asv itself


@pytest.mark.slow
def test_asv_check_passes():
    if importlib.util.find_spec("asv") is None:
        pytest.skip("asv is not installed (pip install -e '.[dev]'); `asv check` not run")
    proc = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "No problems found" in out, out
