"""Shared pytest configuration: hypothesis profiles.

The "ci" profile is loaded by default (docs/methods.md): derandomized, so every run explores the same
examples and a failure reproduces; no deadline, because the first call into torch pays one-off
start-up costs; a modest number of examples so the whole suite stays around a minute on two
cores. Set HYPOTHESIS_PROFILE=dev for a longer, randomized search.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=100,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    # The tests use tiny tensors, where intra-op parallelism only adds overhead: with torch 2.13
    # on our 2-core machines a 2-thread ``tril`` of a 3 x 3 tensor takes ~14 ms against 6 us on one
    # thread, which made gradcheck of the chunked causal scan 100x slower. Results do not depend
    # on the thread count (every comparison allows round-off), so run single-threaded; override with
    # MASKBENCH_TEST_THREADS.
    import torch

    torch.set_num_threads(int(os.environ.get("MASKBENCH_TEST_THREADS", "1")))
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # pytest-xdist (make test runs one worker per core): the workers start after this hook and
        # inherit these. NumPy's OpenBLAS would run a thread per core in every worker, and its
        # threads spin while they wait: on 2 cores -n 2 then took 1.6x the CPU time of a serial run.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
    # In a worker, PYTEST_XDIST_WORKER leaks into every child a test starts: a child pytest (the
    # peer suite in tests/benchmarks, measure.gpu's peers stage) then takes itself for a worker and
    # pytest-benchmark switches its timing off. xdist keeps the worker's identity in
    # config.workerinput, not in the variable.
    os.environ.pop("PYTEST_XDIST_WORKER", None)
