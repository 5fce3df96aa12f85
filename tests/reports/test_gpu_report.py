"""The GPU section (reports/sections/gpu.py, templates/sections/gpu.html.j2) from a synthetic GPU run."""
from __future__ import annotations

import json

import pytest

from reports.__main__ import main, parse_args
from reports.sections.gpu import SCHEMA, gpu_view, load_gpu, plot_gpu_sweeps
from tests.reports.synthetic import (GPU_FAILED_CHECK, GPU_FAILED_TEST, MALICIOUS, gpu_run, make_results)

PNG = b"\x89PNG\r\n\x1a\n"


def _write(tmp_path, run, name="gpu.json"):
    path = tmp_path / name
    path.write_text(json.dumps(run))
    return path


def test_load_missing_unreadable_and_other_schema(tmp_path):
    assert not load_gpu(tmp_path / "none.json").found
    (tmp_path / "bad.json").write_text("{not json")
    bad = load_gpu(tmp_path / "bad.json")
    assert bad.found and "JSONDecodeError" in bad.error
    other = load_gpu(_write(tmp_path, {"schema": "maskbench-peers/1"}, "other.json"))
    assert other.found and SCHEMA in other.error and not other.data


def test_view_lists_failures_tests_checks_sweeps_and_peers(tmp_path):
    view = gpu_view(load_gpu(_write(tmp_path, gpu_run())))
    assert view.found and not view.error
    assert any(GPU_FAILED_TEST in f for f in view.failures) and any(GPU_FAILED_CHECK in f for f in view.failures)
    assert view.tests_tally == {"passed": 1, "failed": 1, "error": 0, "skipped": 0}
    assert [c["id"] for c in view.tests_bad] == [GPU_FAILED_TEST]
    assert view.checks_tally == {"pass": 2, "fail": 1, "inconclusive": 0, "skip": 0}
    failed = [c for c in view.checks if c.status == "fail"]
    assert [(c.id, c.reason) for c in failed] == [(GPU_FAILED_CHECK, "same seed, different bits")]
    assert [r.mechanism for r in view.sweeps] == ["causal", "toeplitz-1d"]
    assert view.sweeps[0].points.endswith("(8 N)")
    assert "OutOfMemoryError" in view.sweeps[1].error and not view.sweeps[0].error
    assert view.peers is not None and view.peers.rows
    assert dict((s, note) for s, _, note in view.stage_rows)["checks"] == "exit status 1"
    assert view.checks_only == []
    run = gpu_run()
    run["checks_only"] = ["scale/", "reproducibility/"]
    assert gpu_view(load_gpu(_write(tmp_path, run, "only.json"))).checks_only == ["scale/", "reproducibility/"]


def test_view_of_a_stopped_run_says_so(tmp_path):
    view = gpu_view(load_gpu(_write(tmp_path, gpu_run(finished=False))))
    assert view.failures[0].startswith("the run did not finish")
    assert not view.sweeps and view.peers is None and view.peers_note == "the peer suite was not run"
    assert dict((s, note) for s, _, note in view.stage_rows)["sweeps"] == "not run"


def test_sweep_figure(tmp_path):
    run = load_gpu(_write(tmp_path, gpu_run()))
    assert plot_gpu_sweeps(run, tmp_path) == "gpu_sweeps.png"
    assert (tmp_path / "gpu_sweeps.png").read_bytes()[:8] == PNG
    assert plot_gpu_sweeps(load_gpu(_write(tmp_path, gpu_run(finished=False), "s.json")), tmp_path) is None
    assert plot_gpu_sweeps(None, tmp_path) is None


@pytest.mark.parametrize("kind", ["full", "stopped", "no-peers", "missing"])
def test_page_has_the_gpu_section(tmp_path, kind):
    out = tmp_path / "out"
    make_results().write(out / "results.json")
    if kind != "missing":
        run = {"full": gpu_run(), "stopped": gpu_run(finished=False), "no-peers": gpu_run(peers=False)}[kind]
        _write(out, run)
    assert main(["--out", str(out), "--asv-results", str(tmp_path / "none"), "--peers-json",
                 str(tmp_path / "none.json"), "--no-progress"]) == 0
    html = (out / "index.html").read_text()
    section = html[html.index('<section id="gpu">'):html.index('<section id="history">')]
    assert '<a href="#gpu">' in html and "14. GPU" in section and "15. History" in html
    assert MALICIOUS not in html  # escaped
    if kind == "missing":  # the shipped sample run, labelled as such, with the command that replaces it
        assert "Sample, not your run" in section and "docs/runs/gpu-h100-2026-11-27.json" in section
        assert "NVIDIA H100 80GB HBM3, 2026-11-27" in section and "Run <code>make gpu-check</code>" in section
        assert "gpu_sweeps.png" in section
        # the section folds, and its heading says it holds a sample
        note = "sample run (NVIDIA H100 80GB HBM3, 2026-11-27, commit b9500da), not yours"
        assert f'<small class="sample-note">{note}</small>' in section
        # the causal tables of the later causal run, named, with the crossover against SDPA flash
        later = "docs/runs/causal-h100-2026-11-28b.json, NVIDIA H100 80GB HBM3, 2026-11-28, commit 384810c"
        assert later in section and "N from which causal FAVOR+ beats SDPA flash" in section
        return
    assert "Sample, not your run" not in section
    assert "NVIDIA H100 80GB HBM3" in section and "580.159.03" in section and "2.11.0+cu130" in section
    assert GPU_FAILED_TEST in section and GPU_FAILED_CHECK in section and "same seed, different bits" in section
    if kind == "stopped":
        assert "the run did not finish" in section and "No sweep was recorded" in section
    elif kind == "no-peers":
        assert "gpu_sweeps.png" in section and "the peer suite wrote no JSON" in section
    else:
        assert "gpu_sweeps.png" in section and "gpu_peers.png" in section
        assert (out / "gpu_peers.png").read_bytes()[:8] == PNG
        assert "ratio = peer time / maskbench time" in section
        peers_part = section[section.index("Peers on the GPU"):]
        assert "make gpu-check" in peers_part and "make bench-ops" not in peers_part


def test_option_default_is_beside_the_page():
    assert parse_args(["--out", "somewhere"]).gpu_json == "somewhere/gpu.json"
    assert parse_args(["--gpu-json", "x.json"]).gpu_json == "x.json"


def test_causal_stage_tables_and_crossover(tmp_path):
    # measure.gpu.causal_summary's shape (issue 25): fla vs maskbench, FAVOR+ vs features given,
    # and the bfloat16 crossover against SDPA flash with its interval
    run = gpu_run()
    run["causal"] = {"summary": {
        "vs_fla": [{"n": 2 ** 14, "dtype": "bfloat16", "pass": "forward", "fla_s": 2e-3, "maskbench_s": 1e-3,
                    "fla_over_maskbench": 2.0, "attend_s": 8e-4, "fla_over_attend": 2.5}],
        "favor_vs_given": [{"n": 2 ** 14, "pass": "forward", "favor_s": 1.2e-3, "given_s": 1e-3,
                            "favor_over_given": 1.2}],
        "crossover": {"forward": {"sizes": [2048, 4096], "favor_over_sdpa": [1.5, 0.5], "n": 3000.0,
                                  "interval": [2500.0, None]},
                      "forward+backward": {"sizes": [2048], "favor_over_sdpa": [0.5], "n": "below",
                                           "interval": ["below", "below"]}}}}
    view = gpu_view(load_gpu(_write(tmp_path, run)))
    (row,) = view.causal_vs_fla
    assert row[1:3] == ("bfloat16", "forward") and row[5:] == ("2.00", "2.50") and row[3] != row[4]
    assert [r[-1] for r in view.causal_favor] == ["1.20"]
    assert view.causal_crossover == [("forward", "3,000", "[2,500, no crossover on the grid]"),
                                     ("forward+backward", "below the grid", "[below the grid, below the grid]")]
    assert not view.causal_note
    bare = gpu_view(load_gpu(_write(tmp_path, gpu_run(), "bare.json")))
    assert not bare.causal_vs_fla and bare.causal_note == "the causal stage was not run"
    assert "causal" in [s for s, _, _ in bare.stage_rows]


def test_sample_takes_the_later_causal_run_and_keeps_its_own_without_one(tmp_path):
    from reports.sections.gpu import SAMPLE, GpuView, _sample_causal, gpu_or_sample
    view = gpu_view(gpu_or_sample(load_gpu(tmp_path / "none.json")))
    assert view.sample_for and view.causal_source.startswith("docs/runs/causal-h100-2026-11-28b.json")
    assert [r[0] for r in view.causal_crossover] == ["forward", "forward+backward"]
    assert [r[1] for r in view.causal_favor] == ["forward"] * 3 + ["forward+backward"] * 3
    assert not view.causal_vs_fla  # that run had no fla-core
    own = {"summary": {"vs_fla": []}}
    lonely = GpuView(found=True, path="gpu.json")
    assert _sample_causal(lonely, own, tmp_path / "absent.json") is own and not lonely.causal_source
    assert SAMPLE.exists()
