"""benchmarks/summary.py: pytest-benchmark's JSON -> the peers summary (schema maskbench-peers/1),
on synthetic reports whose round times are known (nothing is timed here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import summary as S

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = ["op", "pass", "peer", "B", "H", "N", "d", "m", "dtype", "device", "maskbench_s", "peer_s", "ratio",
            "ratio_low", "ratio_high", "rounds", "max_rel_diff"]
BENCH_KEYS = ["op", "pass", "impl", "peer", "B", "H", "N", "d", "m", "dtype", "device", "median_s", "rounds",
              "peak_memory_bytes", "peak_memory_extra_bytes", "max_rel_diff"]


def _bench(op, pass_, impl, peer, n, times, d=64, max_rel_diff=3e-7, **info):
    """A benchmark as test_peer_op writes it; ``info`` adds or overrides extra_info fields (dtype,
    device, peak memory); a suite from before dtypes wrote none of them."""
    return {"group": f"{op} {pass_} B=1 H=4 N={n} d=m={d}", "name": f"test_peer_op[{op}-{impl}-{n}]",
            "extra_info": {"op": op, "pass": pass_, "impl": impl, "peer": peer, "B": 1, "H": 4, "N": n, "d": d,
                           "m": d, "max_rel_diff": max_rel_diff, **info},
            "stats": {"median": float(np.median(times)), "rounds": len(times), "data": list(map(float, times))}}


def _report(benchmarks, skipped=()):
    return {"machine_info": {"cpu": {"brand_raw": "Test CPU 9000"}, "machine": "x86_64"},
            "commit_info": {"id": "0123456789abcdef", "dirty": False},
            "datetime": "2026-11-23T03:00:00+00:00", "version": "5.3.1", "benchmarks": benchmarks,
            "maskbench": {"torch": "2.13.0+cpu", "threads": 2, "device": "cpu", "device_name": None,
                          "dtype": "float32", "quick": True, "seed": 0,
                          "peers": {"performer-pytorch": "1.1.4", "pytorch-fast-transformers": None},
                          "skipped": list(skipped)}}


def _times(center, n, spread, seed):
    rng = np.random.default_rng(seed)
    return center * (1 + spread * rng.random(n))


def test_ratio_is_peer_median_over_maskbench_median_with_an_interval_around_it():
    mine, theirs = _times(0.010, 25, 0.05, 1), _times(0.020, 31, 0.05, 2)
    rep = _report([_bench("favor", "forward", "maskbench", "performer-pytorch", 1024, mine),
                   _bench("favor", "forward", "performer-pytorch", "performer-pytorch", 1024, theirs, max_rel_diff=4e-7)])
    out = S.summarize(rep, n_boot=500, seed=0)
    (row,) = out["rows"]
    assert list(row) == ROW_KEYS
    assert row["maskbench_s"] == pytest.approx(np.median(mine)) and row["peer_s"] == pytest.approx(np.median(theirs))
    assert row["ratio"] == pytest.approx(np.median(theirs) / np.median(mine))
    assert 1.8 < row["ratio_low"] <= row["ratio"] <= row["ratio_high"] < 2.2  # 2x slower peer, 5% noise
    assert row["rounds"] == [25, 31] and row["max_rel_diff"] == 4e-7
    assert (row["op"], row["pass"], row["peer"], row["N"], row["d"], row["m"], row["dtype"], row["device"]) == (
        "favor", "forward", "performer-pytorch", 1024, 64, 64, "float32", "cpu")  # a file from before dtypes


def test_dtypes_pair_apart_and_every_benchmark_is_listed_with_its_time_and_memory():
    # the same op and size in two dtypes are two rows, never one pair of mismatched benchmarks
    benches = []
    for i, dtype in enumerate(("float32", "bfloat16")):
        for impl, center in (("maskbench", 0.010), ("fla-core", 0.004 * (i + 1))):
            benches.append(_bench("linear-causal", "forward", impl, "fla-core", 4096, _times(center, 9, 0.01, i),
                                  dtype=dtype, device="cuda", peak_memory_bytes=10 ** 6 * (i + 1),
                                  peak_memory_extra_bytes=10 ** 5 * (i + 1)))
    benches.append(_bench("softmax-flash", "forward", "maskbench", "torch-sdpa-flash", 4096, _times(1e-3, 5, 0.1, 7),
                          dtype="bfloat16", device="cuda"))  # its peer skipped: no row, one benchmark
    out = S.summarize(_report(benches), n_boot=50)
    rows = out["rows"]
    assert [(r["dtype"], r["device"]) for r in rows] == [("float32", "cuda"), ("bfloat16", "cuda")]
    assert rows[0]["ratio"] == pytest.approx(0.4, rel=0.05) and rows[1]["ratio"] == pytest.approx(0.8, rel=0.05)
    listed = out["benchmarks"]
    assert len(listed) == 5 and all(list(b) == BENCH_KEYS for b in listed)
    fla32 = next(b for b in listed if b["impl"] == "fla-core" and b["dtype"] == "float32")
    assert fla32["median_s"] == pytest.approx(np.median(benches[1]["stats"]["data"]))
    assert (fla32["peak_memory_bytes"], fla32["peak_memory_extra_bytes"], fla32["rounds"]) == (10 ** 6, 10 ** 5, 9)
    lone = next(b for b in listed if b["op"] == "softmax-flash")
    assert lone["impl"] == "maskbench" and lone["peak_memory_bytes"] is None
    text = S.markdown(out)
    assert "| forward, d = m = 64, B = 1, H = 4, float32 | 2^12 |" in text
    assert "| forward, d = m = 64, B = 1, H = 4, bfloat16 | 2^12 |" in text


def test_schema_environment_peers_and_skipped():
    rep = _report([_bench("softmax", "forward", "maskbench", "torch-sdpa", 1024, _times(1e-3, 9, 0.1, 3)),
                   _bench("softmax", "forward", "torch-sdpa", "torch-sdpa", 1024, _times(1e-3, 9, 0.1, 4))],
                  skipped=["pytorch-fast-transformers not installed: pip install ..."])
    out = S.summarize(rep, n_boot=100)
    assert list(out) == ["schema", "environment", "peers", "skipped", "rows", "benchmarks"]
    assert out["schema"] == "maskbench-peers/1"
    assert out["environment"] == {"torch": "2.13.0+cpu", "threads": 2, "device": "cpu", "dtype": "float32",
                                  "allocator": "default", "machine": "Test CPU 9000",
                                  "datetime": "2026-11-23T03:00:00+00:00", "commit": "0123456"}
    rep["maskbench"]["allocator"] = "glibc mallopt: M_TRIM_THRESHOLD 1073741824, M_MMAP_THRESHOLD 33554432"
    assert S.summarize(rep, n_boot=10)["environment"]["allocator"] == rep["maskbench"]["allocator"]
    del rep["maskbench"]["allocator"]
    assert out["peers"] == {"performer-pytorch": "1.1.4", "pytorch-fast-transformers": None, "fla-core": None}
    assert out["skipped"] == ["pytorch-fast-transformers not installed: pip install ..."]
    rep["commit_info"]["dirty"] = True
    assert S.summarize(rep, n_boot=10)["environment"]["commit"] == "0123456+dirty"


def test_bootstrap_is_reproducible_and_narrows_with_more_rounds():
    a, b = _times(1.0, 20, 0.5, 5), _times(1.0, 20, 0.5, 6)
    first = S.bootstrap_ratio_of_medians(a, b, n_boot=400, seed=7)
    assert first == S.bootstrap_ratio_of_medians(a, b, n_boot=400, seed=7)
    assert first != S.bootstrap_ratio_of_medians(a, b, n_boot=400, seed=8)
    ratio, low, high = first
    assert low <= ratio <= high and low < 1 < high  # same distribution: parity inside
    big_a, big_b = _times(1.0, 2000, 0.5, 5), _times(1.0, 2000, 0.5, 6)
    _, low2, high2 = S.bootstrap_ratio_of_medians(big_a, big_b, n_boot=400, seed=7)
    assert high2 - low2 < (high - low) / 3  # 100x the rounds: about 10x narrower


def test_bootstrap_percentiles_match_a_direct_computation():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0, 8.0])
    ratio, low, high = S.bootstrap_ratio_of_medians(a, b, n_boot=300, seed=11, chunk=7)
    rng = np.random.default_rng(11)
    direct = []
    for start in range(0, 300, 7):
        k = min(7, 300 - start)
        ma = np.median(a[rng.integers(0, 3, size=(k, 3))], axis=1)
        mb = np.median(b[rng.integers(0, 4, size=(k, 4))], axis=1)
        direct.extend(mb / ma)
    assert ratio == 5.0 / 2.0
    assert (low, high) == tuple(np.percentile(direct, [2.5, 97.5]))


@pytest.mark.parametrize("bad", [[], [1.0, -1.0], [1.0, float("nan")]])
def test_bootstrap_refuses_bad_times(bad):
    with pytest.raises(ValueError, match="round times|non-empty"):
        S.bootstrap_ratio_of_medians(np.array(bad), np.array([1.0, 2.0]))


def test_unpaired_and_foreign_benchmarks_give_no_row():
    rep = _report([_bench("elu", "forward", "maskbench", "pytorch-fast-transformers", 1024, [1e-3, 2e-3]),
                   {"name": "test_other", "extra_info": {}, "stats": {"data": [1.0]}}])
    assert S.summarize(rep, n_boot=10)["rows"] == []
    assert "no peer rows" in S.markdown(S.summarize(rep, n_boot=10))


def test_missing_round_data_is_an_error_that_says_how_to_get_it():
    b1 = _bench("elu", "forward", "maskbench", "pytorch-fast-transformers", 1024, [1e-3, 2e-3])
    b2 = _bench("elu", "forward", "pytorch-fast-transformers", "pytorch-fast-transformers", 1024, [1e-3, 2e-3])
    del b2["stats"]["data"]
    with pytest.raises(ValueError, match="--benchmark-json"):
        S.summarize(_report([b1, b2]))
    with pytest.raises(ValueError, match="benchmarks"):
        S.summarize({"rows": []})


def test_markdown_table_has_an_op_row_and_an_N_column_per_pass_and_width():
    benches = []
    for pass_ in ("forward", "forward+backward"):
        for n in (1024, 4096):
            for op, peer in (("elu", "pytorch-fast-transformers"), ("softmax", "torch-sdpa")):
                benches += [_bench(op, pass_, "maskbench", peer, n, _times(1.0, 5, 0.01, n)),
                            _bench(op, pass_, peer, peer, n, _times(2.0, 5, 0.01, n + 1))]
    text = S.markdown(S.summarize(_report(benches), n_boot=50))
    assert "| forward, d = m = 64, B = 1, H = 4, float32 | 2^10 | 2^12 |" in text
    assert "| forward+backward, d = m = 64, B = 1, H = 4, float32 | 2^10 | 2^12 |" in text
    assert text.index("| forward,") < text.index("| forward+backward,")
    line = next(x for x in text.splitlines() if x.startswith("| elu: pytorch-fast-transformers / maskbench"))
    assert line.count("[") == 2 and " 2.0" in line


def test_cli_writes_the_summary_and_never_imports_torch(tmp_path):
    mine, theirs = _times(1e-3, 6, 0.1, 1), _times(3e-3, 6, 0.1, 2)
    src = tmp_path / "peers.json"
    src.write_text(json.dumps(_report([_bench("favor", "forward", "maskbench", "performer-pytorch", 4096, mine),
                                       _bench("favor", "forward", "performer-pytorch", "performer-pytorch", 4096,
                                              theirs)])))
    out = tmp_path / "sub" / "peers-summary.json"
    # the script as `make bench-ops` runs it, in a fresh interpreter that records what it imported
    probe = ("import sys, runpy; sys.argv = ['summary.py', %r, '--out', %r, '--boot', '50'];\n"
             "try:\n    runpy.run_path(%r, run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code)") % (
                 str(src), str(out), str(ROOT / "benchmarks" / "summary.py"))
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("NO-TORCH 0")
    assert "| favor: performer-pytorch / maskbench |" in run.stdout
    written = json.loads(out.read_text())
    assert written["schema"] == "maskbench-peers/1" and len(written["rows"]) == 1
    assert written["rows"][0]["ratio"] == pytest.approx(np.median(theirs) / np.median(mine))


def test_cli_missing_input_says_what_writes_it(tmp_path, capsys):
    assert S.main([str(tmp_path / "absent.json")]) == 2
    assert "make bench-ops" in capsys.readouterr().err
