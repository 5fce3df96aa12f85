"""Mechanism records with planted bugs, for tests that show a verify check failing on them.

They are never registered: a test hands the record to a check's ``check_for`` and, where the
check runs a child process (scale/), names it by ``module:attribute``
(``tests.verify.planted_mechanisms:HIDDEN_QUADRATIC``), which measure.scale_worker imports.

- HIDDEN_QUADRATIC: unmasked FAVOR+ attention (the "linear" record) whose fast path is exact and
  linear up to N = CHUNK, and beyond it loops over query chunks in Python, each chunk recomputing
  the key features and the key-value summary of ALL N keys: (N / CHUNK) x O(N) = O(N^2 / CHUNK).
  Its output is right (equivalence passes) and its sweep up to 2^16 is linear (complexity/ passes);
  at 2^20 it does 16 times the key-side work. scale/<id> must fail it.
- QUADRATIC: the "linear" record whose fast path is dense softmax attention on the same q, k, v
  (O(N^2 d), slope about 2 over its grid 2^9..2^13): complexity/<id> must fail it, on a quiet
  and on a busy machine (`python -m tests.verify.planted_mechanisms` runs that check for real).
- BUSY: a runner that spins on the CPU for BUSY_S seconds whatever N (the worker's watchdog must
  stop it once it passes its budget).
"""
from __future__ import annotations

import dataclasses
import time

import torch

import fast
from verify.favor import favor_tensors
from verify.mechanisms import get

#: HIDDEN_QUADRATIC is linear up to this N (the top of the linear record's quick sweep grid).
CHUNK = 2**16
#: CPU seconds one BUSY call spins.
BUSY_S = 60.0


def _hidden_quadratic_setup(problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)

    def runner() -> torch.Tensor:
        n = q.shape[-2]
        if n <= CHUNK:
            return fast.favor_attention(q, k, v, w, None)
        # the planted bug: every query chunk redoes the work on all N keys (exact, but O(N^2 / CHUNK))
        return torch.cat([fast.favor_attention(q[..., a:a + CHUNK, :], k, v, w, None) for a in range(0, n, CHUNK)],
                         dim=-2)

    return runner


def _quadratic_setup(problem, device, dtype, requires_grad: bool = False):
    q, k, v, _ = favor_tensors(problem, device, dtype, requires_grad)
    return lambda: fast.softmax_attention(q, k, v)  # the planted bug: an N x N score matrix


def _busy_setup(problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = favor_tensors(problem, device, dtype, requires_grad)

    def runner() -> torch.Tensor:
        start = time.process_time()
        while time.process_time() - start < BUSY_S:  # CPU seconds, as the scale worker's clock
            pass
        return v * 1.0

    return runner


_LINEAR = get("linear")
HIDDEN_QUADRATIC = dataclasses.replace(
    _LINEAR, id="hidden-quadratic", title="Unmasked FAVOR+ with a query-chunk loop that redoes all keys (planted)",
    fast_setup=_hidden_quadratic_setup, dense_setup=None, scale=True, scale_train=False)
QUADRATIC = dataclasses.replace(
    _LINEAR, id="planted-quadratic", title="Unmasked attention whose fast path is dense softmax (planted)",
    fast_setup=_quadratic_setup, fast_sizes=tuple(2**p for p in range(9, 14)),
    quick_fast_sizes=tuple(2**p for p in range(9, 14)), scale=False, scale_train=False)
BUSY = dataclasses.replace(_LINEAR, id="busy", title="A runner that spins for a minute (planted)",
                           fast_setup=_busy_setup, dense_setup=None, scale=True, scale_train=False)


if __name__ == "__main__":  # complexity/<id> of QUADRATIC, timed for real (quick mode): it must fail
    import json
    import sys

    from results.check import Context
    from verify.checks.complexity import check_for

    r = check_for(QUADRATIC).evaluate(Context(quick=True))
    print(json.dumps({"status": r.status, "statistic": r.statistic, "reasons": r.reasons,
                      "busy": r.details.get("busy"), "fit": r.details["fast"].get("fit"),
                      "attempts": [(a["verdict"], a["busy"]) for a in r.details["attempts"]]}, indent=1))
    sys.exit(0 if r.status == "fail" else 1)
