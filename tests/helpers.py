"""Helpers shared by the tests: explicit generators, random inputs, comparisons.

Plain functions rather than fixtures, because hypothesis tests call them with drawn seeds.
Every random tensor comes from an explicit ``torch.Generator`` (never the global RNG).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

#: The devices a device-parametrized test runs on: always "cpu" (so CI, which has no GPU, runs
#: the test's logic), plus "cuda" when present. Use ``@pytest.mark.parametrize("device", DEVICES)``:
#: the ids are the strings themselves, so ``pytest -k cuda`` still selects the CUDA instances.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: For the few tests that need a GPU by nature (e.g. "mixed devices are refused" needs two
#: devices); every other device test is parametrized over DEVICES instead. Put "cuda" in such a
#: test's name: make gpu-check selects the CUDA tests with ``pytest -k cuda``.
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: Two float64 computations of the same quantity that differ only in the order of operations
#: (BLAS blocking, chunk boundaries, a compacted vs a masked sum) differ by a small multiple of
#: the unit round-off 1.1e-16 times the sum lengths (<= a few hundred here), i.e. < 1e-13.
#: 1e-12 leaves room for that and nothing else: a leak of one changed token into an output moves
#: it by O(weight share) >= 1e-3 in every test below.
F64_RTOL = 1e-12

#: fast vs reference, relative Frobenius error (the registry's metric): float64 is round-off
#: (~1e-16 x sum length) with a wide margin; float32 has unit round-off 6e-8, and sums of a few
#: hundred terms grow it to ~1e-5 worst case, so 1e-4 (the same bounds verify uses).
EQUIV_TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed`` (explicit; never torch.manual_seed)."""
    return torch.Generator().manual_seed(int(seed))


def randn(shape, g: torch.Generator, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=g, dtype=dtype)


def positive(shape, g: torch.Generator, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    """Positive features in [0.1, 1.1) * scale: every denominator is bounded away from zero."""
    return scale * (torch.rand(*shape, generator=g, dtype=dtype) + 0.1)


def unit_rows(shape, g: torch.Generator, dtype=torch.float64, norm: float = 1.0) -> torch.Tensor:
    x = torch.randn(*shape, generator=g, dtype=dtype)
    return norm * x / x.norm(dim=-1, keepdim=True)


class GenericMask:
    """Exposes only ``n`` and ``matmul`` of a mask operator, so the driver takes its generic
    column-block path instead of a specialised ``attend``. Its matmul is the mask's unchecked
    product (``matmul_unscaled``), as a user's own operator would be: no host read of its own."""

    def __init__(self, mask):
        self.n = mask.n
        self._matmul = mask.matmul_unscaled

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x)


def rel_frobenius(actual, expected) -> float:
    a = actual.detach().double().cpu().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual, float)
    e = expected.detach().double().cpu().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected, float)
    assert a.shape == e.shape, (a.shape, e.shape)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), np.finfo(float).tiny))


def assert_unchanged(actual: torch.Tensor, expected: torch.Tensor, rtol: float = F64_RTOL) -> None:
    """Entrywise equality up to float64 round-off, relative to the largest entry (see F64_RTOL)."""
    assert actual.shape == expected.shape
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1e-300))


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def dense_causal_units(q, k, v, c):
    """The causal products in the units attend promises: sum_{j <= i} (q_i . k_j) exp(c_j - r_i) (v_j | 1),
    r_i = max_{j <= i} c_j, formed densely (q, k (..., N, m), v (..., N, d), c (..., N))."""
    n = q.shape[-2]
    r = torch.cummax(c, -1).values
    tri = torch.ones(n, n, dtype=torch.bool).tril()
    w = (c[..., None, :] - r[..., :, None]).masked_fill(~tri, -torch.inf).exp()
    a = (q @ k.transpose(-1, -2)) * w
    return a @ v, a.sum(-1)


# ------------------------------------------------------------------------ paper-check modules


def evaluate_quick(module, check_id: str, seed: int = 0):
    """The check ``check_id`` of a verify.checks module (its ``checks()``) run once in quick mode."""
    from results.check import Context

    check = next(c for c in module.checks() if c.id == check_id)
    return check.evaluate(Context(quick=True, seed=seed))


def quick_results(module, seed: int = 0) -> dict:
    """{id: result} of every check of a verify.checks module, quick mode."""
    return {c.id: evaluate_quick(module, c.id, seed) for c in module.checks()}


def assert_ids_kinds_ratio(module, ids: list[tuple[str, str]]) -> None:
    """The module's checks are ``ids`` ((id, kind) in order), all quick, judged as ratio <= 1."""
    assert [(c.id, c.kind) for c in module.checks()] == ids
    assert all(c.quick and c.threshold == 1.0 and c.compare == "<=" and c.unit == "ratio" for c in module.checks())


def saved_bytes(fn) -> tuple[int, object]:
    """(bytes of the distinct storages autograd saves while fn() runs, fn's result): every saved tensor passes
    the pack hook, each storage counted once at its full size (tests/fast/test_training_memory.py)."""
    storages: dict[int, int] = {}
    keep = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        keep.append(t)
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out


def run_interpreted(script: str) -> dict:
    """Run ``script`` (Python that prints one line "RESULT <json>") in a subprocess with Triton's
    interpreter on and fast/'s kernels forced (TRITON_INTERPRET=1 must be set before triton is
    imported, so not in this process), and return the parsed JSON; the script's stderr when it fails."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", MASKBENCH_CAUSAL_KERNEL="force", PYTHONPATH=str(root))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))
