"""benchmarks/blocks.py: the alternation of the blocks, the ratio and its bootstrap interval on known
times (a fake clock), the table, and one real cell at a small size (skipped where the peer is not
installed). Nothing here judges a speed."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import blocks as B
from benchmarks import ops


class _Clock:
    """A fake timer: each call of a timed function advances it by that function's cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_blocks_alternate_their_order_pair_by_pair_and_warm_untimed():
    log = []
    clock = _Clock()

    def fn(name, cost):
        def call():
            log.append(name)
            clock.now += cost
        return call

    a, b = B.time_blocks(fn("a", 2.0), fn("b", 3.0), blocks=3, calls=2, warm=1, timer=clock)
    # pair 0: a (1 warm + 2 timed) then b; pair 1: b then a; pair 2: a then b
    assert log == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3 + ["a"] * 3 + ["b"] * 3
    assert a == [[2.0, 2.0]] * 3 and b == [[3.0, 3.0]] * 3


@pytest.mark.parametrize("kwargs, match", [({"blocks": 0}, "blocks"), ({"calls": 0}, "calls"), ({"warm": -1}, "warm")])
def test_time_blocks_names_a_bad_count(kwargs, match):
    with pytest.raises(ValueError, match=match):
        B.time_blocks(lambda: None, lambda: None, **kwargs)


def test_bootstrap_median_covers_the_median_and_narrows_with_less_spread():
    rng = np.random.default_rng(1)
    wide = 1.0 + 0.2 * rng.standard_normal(40)
    narrow = 1.0 + 0.02 * rng.standard_normal(40)
    m, low, high = B.bootstrap_median(wide)
    assert m == pytest.approx(float(np.median(wide))) and low <= m <= high
    m2, low2, high2 = B.bootstrap_median(narrow)
    assert high2 - low2 < (high - low) / 5
    assert B.bootstrap_median([2.0] * 5) == (2.0, 2.0, 2.0)  # no spread, no width
    assert B.bootstrap_median(wide, seed=3) == B.bootstrap_median(wide, seed=3)  # seeded


@pytest.mark.parametrize("values, kwargs, match", [([], {}, "non-empty"), ([1.0, float("nan")], {}, "finite"),
                                                   ([1.0], {"n_boot": 0}, "n_boot"), ([1.0], {"level": 1.0}, "level")])
def test_bootstrap_median_names_bad_arguments(values, kwargs, match):
    with pytest.raises(ValueError, match=match):
        B.bootstrap_median(values, **kwargs)


def test_markdown_lays_out_ratios_and_skips():
    rows = [{"op": "favor-causal", "pass": "forward", "peer": "performer-pytorch", "N": n, "d": 16, "m": 16,
             "ratio": r, "ratio_low": r - 0.1, "ratio_high": r + 0.1} for n, r in ((4096, 1.1), (8192, 0.9))]
    rows.append({"op": "elu", "pass": "forward+backward", "peer": "pytorch-fast-transformers", "N": 4096, "d": 16,
                 "m": 16, "skipped": "not installed"})
    text = B.markdown(rows)
    assert "| forward, d = m = 16 | 2^12 | 2^13 |" in text
    assert "| favor-causal: performer-pytorch / maskbench | 1.10 [1.00, 1.20] | 0.90 [0.80, 1.00] |" in text
    assert "| elu: pytorch-fast-transformers / maskbench | skipped |" in text and text.endswith("skipped: not installed")


def test_one_real_cell_and_the_command_line(tmp_path, capsys):
    """The ELU+1 comparison at a small size through the command line: a row with a positive ratio
    inside its interval, the JSON schema, the table (or the skip reason where fast-transformers is
    not installed)."""
    out = tmp_path / "blocks.json"
    assert B.main(["--ops", "elu", "--bench-N", "64", "--bench-d", "8", "--passes", "forward", "--blocks", "2",
                   "--calls", "2", "--warm", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "maskbench-blocks/1" and report["environment"]["blocks"] == 2
    (row,) = report["rows"]
    assert (row["op"], row["pass"], row["N"], row["d"], row["peer"]) == ("elu", "forward", 64, 8, ops.FAST_TRANSFORMERS)
    if "skipped" not in row:
        assert 0 < row["ratio_low"] <= row["ratio"] <= row["ratio_high"] and row["pairs"] == 2
        assert row["max_rel_diff"] <= 1e-4
    assert "| elu: pytorch-fast-transformers / maskbench |" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--ops", "nope"], ["--passes", "sideways"], ["--bench-N", "0"], ["--blocks", "0"],
                                  ["--bench-N", "x"]])
def test_bad_arguments_exit_2(argv, tmp_path):
    with pytest.raises(SystemExit) as err:
        B.main(argv + ["--out", str(tmp_path / "b.json")])
    assert err.value.code == 2


_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

#: A child that frees about 2 MiB at the top of glibc's heap, 20 times over, and prints its minor
#: page faults per round: glibc's default trim threshold (twice its adjusted mmap threshold, here
#: about 128 KiB) gives those pages back each round, so the next round faults them in again.
_TRIM_CHILD = """
import resource, sys
import numpy as np
if sys.argv[1] == "steady":
    from benchmarks.blocks import steady_allocator
    steady_allocator()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(8192); del a  # one 64 KiB block from mmap, freed: glibc's mmap threshold moves to 64 KiB
def rounds(n):
    for _ in range(n):
        xs = [np.ones(6144) for _ in range(40)]  # 40 blocks of 48 KiB from the heap, then freed
        del xs
rounds(3)
start = faults()
rounds(20)
print((faults() - start) / 20)
"""


def _faults_per_round(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", _TRIM_CHILD, mode], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt only")
def test_steady_allocator_keeps_the_freed_top_of_the_heap():
    """Power and effect, each in a fresh process: with glibc's defaults the freed 2 MiB are given
    back and faulted in again each round (about 400 pages; more than 100 asserted); after
    steady_allocator none are (fewer than 10: the heap stays)."""
    assert _faults_per_round("default") > 100
    assert _faults_per_round("steady") < 10


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt only")
def test_steady_allocator_flag_is_recorded(tmp_path):
    """--steady-allocator through the command line (in a child: mallopt is process-wide): the JSON
    says which allocator setting the ratios were measured under."""
    out = tmp_path / "blocks.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.blocks", "--ops", "elu", "--bench-N", "64", "--bench-d",
                           "8", "--passes", "forward", "--blocks", "2", "--calls", "2", "--warm", "1",
                           "--steady-allocator", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["environment"]["allocator"] == (
        f"glibc mallopt: M_TRIM_THRESHOLD {B.STEADY_TRIM}, M_MMAP_THRESHOLD {B.STEADY_MMAP}")
    assert "allocator: glibc mallopt" in done.stdout


def test_steady_allocator_without_mallopt_exits_2(monkeypatch, tmp_path, capsys):
    """Where the C library has no mallopt, the flag is refused by name (exit 2), before any timing."""
    monkeypatch.setattr(B.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(SystemExit) as err:
        B.main(["--steady-allocator", "--out", str(tmp_path / "b.json")])
    assert err.value.code == 2 and "--steady-allocator needs glibc's mallopt" in capsys.readouterr().err


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt only")
def test_peer_suite_takes_the_steady_allocator_too(tmp_path):
    """``make bench-ops ARGS=--steady-allocator``: the peer suite holds the heap the same way and its
    JSON's maskbench block says so (a child pytest: mallopt is process-wide; softmax, whose peer,
    torch SDPA, is always there: with every peer skipped pytest-benchmark writes no JSON)."""
    out = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                           "--benchmark-enable", "--benchmark-json", str(out), "--steady-allocator", "--ops", "softmax",
                           "--bench-N", "64", "--bench-d", "8", "--benchmark-min-rounds=1",
                           "--benchmark-max-time=0.001"],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(out.read_text())["maskbench"]["allocator"] == (
        f"glibc mallopt: M_TRIM_THRESHOLD {B.STEADY_TRIM}, M_MMAP_THRESHOLD {B.STEADY_MMAP}")
