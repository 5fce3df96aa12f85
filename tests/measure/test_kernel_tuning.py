"""measure/kernel_tuning.py: the launch-configuration sweep of the Triton causal scan, run on the
CPU under Triton's interpreter (its times mean nothing there; the checks and the JSON do)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from measure import kernel_tuning

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install triton; dev extras)")


def test_difference_tells_another_function_from_round_off():
    g = torch.Generator().manual_seed(0)
    x = [torch.rand(8, 5, generator=g) + 0.5, torch.rand(8, generator=g) + 0.5]
    assert kernel_tuning.difference(x, x) == 0.0
    assert kernel_tuning.difference([t * (1 + 2.0 ** -20) for t in x], x) <= kernel_tuning.AGREEMENT["float32"]
    wrong = [x[0].roll(1, dims=0), x[1]]  # a carry from the wrong row
    assert kernel_tuning.difference(wrong, x) > kernel_tuning.AGREEMENT["bfloat16"]


@needs_triton
def test_launch_config_answers_the_candidate_and_restores_the_default():
    import fast.kernels.causal_scan as scan
    default = scan.kernel_blocks
    with kernel_tuning.launch_config((16, 32, 4), (64, 16, 2)):
        assert scan.kernel_blocks(64, 64) == (16, 64, 32, 4)
        assert scan.kernel_blocks(20, 8, backward=True) == (64, 32, 16, 2)  # BM: every feature, as before
    assert scan.kernel_blocks is default


@needs_triton
def test_sweep_under_the_interpreter_checks_times_and_names_the_fastest(tmp_path):
    out = tmp_path / "kt.json"
    run = subprocess.run([sys.executable, "-m", "measure.kernel_tuning", "--device", "cpu", "--n", "40",
                          "--dtype", "float32", "--shape", "1,2,16,16", "--candidates", "2", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert len(got["rows"]) == 2 and not got["not_run"]
    for row in got["rows"]:
        assert row["agrees"] and row["difference"] <= kernel_tuning.AGREEMENT["float32"]
        assert len(row["forward"]) == len(row["forward+backward"]) == 3
    assert set(got["best"]) == {"40 float32 forward", "40 float32 forward+backward"}


@needs_triton
def test_stable_sweep_tunes_the_scan_with_per_key_constants(tmp_path):
    """--stable: the candidates are checked and timed on CausalMask.attend with key_log_scale (the
    stabilised kernel causal FAVOR+ runs), and the JSON says so."""
    out = tmp_path / "kt.json"
    run = subprocess.run([sys.executable, "-m", "measure.kernel_tuning", "--device", "cpu", "--n", "40",
                          "--dtype", "float32", "--shape", "1,2,16,16", "--candidates", "2", "--stable",
                          "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["stable"] is True and len(got["rows"]) == 2
    # the second candidate's chunk (32) is not the default's (16): agreement is two summation orders
    assert all(row["agrees"] for row in got["rows"]) and got["rows"][1]["difference"] > 0


def test_a_cpu_device_needs_the_interpreter(capsys):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process")
    with pytest.raises(SystemExit) as info:
        kernel_tuning.main(["--device", "cpu"])
    assert info.value.code == 2 and "TRITON_INTERPRET=1" in capsys.readouterr().err
