"""measure/memory.py: the one peak-memory helper, and its child processes at tiny N."""
from __future__ import annotations

import json
import mmap
import sys
import time
from types import SimpleNamespace

import pytest

from measure import memory
from measure.memory import METHOD_CUDA, METHOD_HWM, METHOD_MAXRSS, Peak, peak_memory
from tests.helpers import cuda_only

MIB = 1024 * 1024
LINUX = sys.platform.startswith("linux")


def test_rss_and_peak_readings_are_consistent():
    rss = memory.rss_bytes()
    assert rss > 10 * MIB  # a Python process with numpy and torch imported
    assert memory.peak_rss_bytes() >= rss - MIB  # the high-water mark is never below the current RSS
    assert memory.maxrss_bytes() >= memory.peak_rss_bytes() - MIB  # ru_maxrss is monotone, VmHWM resettable
    assert memory.peak_method("cpu") in (METHOD_HWM, METHOD_MAXRSS)
    assert memory.peak_method("cuda:0") == METHOD_CUDA


def test_peak_memory_sees_a_temporary_allocation():
    """A 64 MiB anonymous mapping written then closed inside the block: the peak rises by about
    64 MiB over the baseline (pages are counted once touched) and the block's own overhead is far
    below that. A fresh mapping, not a NumPy array: malloc may serve an array from pages an
    earlier test freed but the process kept resident, and then the peak does not move (seen once
    in the whole suite)."""
    size = 64 * MIB
    with peak_memory() as pk:
        buf = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):  # touch every page: only touched pages count
            buf[offset] = 1
        buf.close()
    assert pk.method in (METHOD_HWM, METHOD_MAXRSS)
    if pk.method == METHOD_HWM:
        assert pk.resolved and 0.9 * size <= pk.extra <= 1.5 * size, pk
        # an empty block right after: the reset makes the previous peak disappear
        with peak_memory() as quiet:
            pass
        assert quiet.extra < size / 4, quiet
    else:  # ru_maxrss: an upper bound only
        assert pk.peak >= pk.baseline


@cuda_only
def test_peak_memory_on_cuda_sees_a_temporary_tensor():
    """The CUDA branch (peak statistics reset on entry, max_memory_allocated on exit, synchronised): a
    64 MiB tensor allocated and freed inside the block raises the peak by its size, plus at most the
    1 MiB remainder the caching allocator leaves unsplit when it reuses a slightly larger cached block
    (requests round up to 512 B multiples, and 64 MiB is one); an empty block right after moves it by
    nothing (the reset forgets the previous peak). gc.collect() first: a tensor of an earlier test freed
    inside the block would lower the peak."""
    import gc

    import torch

    size = 64 * MIB
    gc.collect()
    with peak_memory("cuda") as pk:
        x = torch.empty(size // 4, dtype=torch.float32, device="cuda")
        del x
    assert pk.method == METHOD_CUDA and pk.resolved and size <= pk.extra <= size + MIB, pk
    with peak_memory("cuda") as quiet:
        pass
    assert quiet.extra == 0, quiet


@pytest.mark.skipif(not LINUX, reason="VmHWM reset is Linux-only")
def test_peak_memory_falls_back_to_ru_maxrss(monkeypatch):
    monkeypatch.setattr(memory, "reset_peak", lambda: False)
    with peak_memory() as pk:
        pass
    assert pk.method == METHOD_MAXRSS and pk.peak == memory.maxrss_bytes()
    assert pk.resolved is False  # ru_maxrss did not move: an upper bound, flagged


def test_peak_extra_is_never_negative():
    assert Peak(METHOD_HWM, baseline=100, peak=40).extra == 0
    assert Peak(METHOD_HWM, baseline=100, peak=140).extra == 40


def test_memory_sizes_caps_quick_grids():
    mech = SimpleNamespace(sizes=lambda impl, quick, variant=None: {
        ("fast", True): (2**16, 2**10, 2**15), ("dense", True): (2**13, 2**14), ("fast", False): (2**18, 2**12)}[
        impl, quick])
    assert memory.memory_sizes(mech, "fast", True) == (2**10, 2**15)  # increasing, capped at 2^15
    assert memory.memory_sizes(mech, "dense", True) == (2**13,)  # nothing under the cap: the smallest
    assert memory.memory_sizes(mech, "fast", False) == (2**12, 2**18)  # full grids are not capped


def test_memory_curves_one_child_for_both_impls_at_tiny_n():
    """One real child (linear, fast at N = 64, 128 and dense at 64): points in bytes, increasing
    order, the method, the variant."""
    from verify.mechanisms import get

    ticks = []
    fast, dense = memory.memory_curves("linear", [("fast", [128, 64]), ("dense", [64])],
                                       on_point=lambda: ticks.append(1), timeout=120)
    assert fast.error is None and dense.error is None, (fast.error, dense.error)
    assert [p.n for p in fast.points] == [64, 128] and [p.n for p in dense.points] == [64] and len(ticks) == 3
    assert (fast.impl, dense.impl) == ("fast", "dense")
    for curve in (fast, dense):
        assert curve.method in (METHOD_HWM, METHOD_MAXRSS) and curve.mechanism == "linear"
        assert curve.variant == get("linear").default_variant.name
        assert curve.import_baseline_bytes > 10 * MIB
        for p in curve.points:
            assert p.peak_bytes >= 0 and p.baseline_bytes > 10 * MIB
            assert p.peak_bytes < 64 * MIB  # N <= 128 attention needs kilobytes, not tens of MiB


def test_memory_curve_records_a_failing_child():
    """A child that exits with an error (here argparse's, before torch is imported: fast): every
    unfinished curve carries it."""
    curve = memory.memory_curve("linear", "bogus", [64], timeout=120)
    assert curve.points == [] and "status 2" in curve.error and "invalid choice" in curve.error
    assert memory.memory_curves("linear", []) == []


def test_scale_worker_forward_in_process(capsys):
    """The worker's main() in this process (no child: keeps the test fast), forward only."""
    from measure import scale_worker

    assert scale_worker.main(["linear", "256", "--calls", "1"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["mechanism"] == "linear" and rep["n"] == 256 and rep["train"] is False
    assert rep["finite"] and rep["shape"][-2] == 256 and len(rep["calls_s"]) == 1
    assert rep["peak_rss"] >= rep["after_setup_rss"] - MIB and rep["peak_method"] in (METHOD_HWM, METHOD_MAXRSS)
    assert rep["peak_reset_after_setup"] == (rep["peak_method"] == METHOD_HWM)


def test_scale_worker_child_trains_at_tiny_n():
    """run_scale_worker in a child, --train: forward + backward per call, JSON with train true."""
    rep = memory.run_scale_worker("linear", 256, calls=2, train=True, timeout=120)
    assert rep["train"] is True and rep["finite"] and len(rep["calls_s"]) == 2
    assert rep["mechanism"] == "linear" and rep["shape"][-2] == 256


def test_scale_worker_failure_names_the_mechanism():
    with pytest.raises(RuntimeError, match="linear at N=0"):  # argparse refuses N = 0 before importing torch
        memory.run_scale_worker("linear", 0, timeout=120)


def test_scale_worker_times_references_and_predicts(capsys):
    """--reference times the same call (here forward + backward) at smaller N with one thread;
    the class line through them predicts N (linear: c = max t / N); the stop budget is
    --stop-ratio x the prediction; on CPU the judged clock is the CPU seconds."""
    from measure import scale_worker

    assert scale_worker.main(["linear", "512", "--calls", "2", "--train", "--reference", "256", "128",
                              "--stop-ratio", "100"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ref = rep["reference"]
    assert ref["sizes"] == [128, 256] and ref["threads"] == 1 and [len(r) for r in ref["calls_s"]] == [2, 2]
    assert ref["seconds"] == [min(r) for r in ref["calls_s"]] and min(ref["seconds"]) > 0
    assert ref["per_unit"] == pytest.approx([t / n for t, n in zip(ref["seconds"], ref["sizes"])])
    assert ref["coefficient"] == max(ref["per_unit"]) and ref["cost_factors"] is None  # "linear" has none
    assert rep["complexity"] == "N" and rep["predicted_s"] == pytest.approx(512 * ref["coefficient"])
    assert rep["budget_s"] == pytest.approx(100 * rep["predicted_s"]) and rep["stopped"] is False
    assert rep["clock"] == "cpu" and rep["timed_s"] == rep["calls_cpu_s"] and len(rep["calls_s"]) == 2


def test_scale_worker_loads_a_record_by_module_path_and_stops_a_slow_call():
    """A record outside the registry (tests.verify.planted_mechanisms:BUSY spins for a minute of
    CPU per call) is loaded by module:attribute in the child, whose watchdog stops the call once
    its CPU seconds pass --budget and still reports."""
    from tests.verify import planted_mechanisms

    start = time.perf_counter()
    rep = memory.run_scale_worker("tests.verify.planted_mechanisms:BUSY", 256, calls=2, budget=0.5, timeout=120)
    assert time.perf_counter() - start < planted_mechanisms.BUSY_S / 2
    assert rep["mechanism"] == "busy" and rep["stopped"] is True and rep["timed_s"] == []
    assert 0.5 < rep["stopped_after_s"] < 0.5 + 2.0 and rep["budget_s"] == 0.5
    assert rep["peak_rss"] > 10 * MIB and rep["clock"] == "cpu"


def test_scale_worker_refuses_what_is_not_a_record():
    from measure.scale_worker import load_mechanism

    assert load_mechanism("causal").id == "causal"
    with pytest.raises(ValueError, match="names a tuple, not a verify.registry.Mechanism"):
        load_mechanism("verify.registry:COMPLEXITY_CLASSES")
    with pytest.raises(ValueError, match="use 'module:attribute'"):
        load_mechanism("verify.registry:")


@pytest.mark.parametrize("argv, words", [
    (["linear", "64", "--stop-ratio", "2"], "--stop-ratio needs --reference"),
    (["linear", "64", "--reference", "0"], "--reference sizes must be >= 1"),
    (["linear", "64", "--budget", "0"], "--budget must be > 0"),
    (["linear", "64", "--threads", "0"], "--threads must be >= 1"),
])
def test_scale_worker_refuses_bad_arguments(capsys, argv, words):
    from measure import scale_worker

    with pytest.raises(SystemExit) as exc:
        scale_worker.main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err
