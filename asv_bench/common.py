"""Shared helpers of the asv suite: the registry, size grids, skip rules, thread pinning, runners.

Everything here is derived from the registry record of a mechanism (verify.registry.Mechanism),
so the benchmark modules only loop over ``common.mechanisms()``.

Old commits. ``asv run A..B`` installs each commit's project and runs THIS suite against it
(the benchmarks come from the working tree, the code under test from the commit), so the
helpers below read the registry through the API of whichever commit is installed:

    loader        ``verify.mechanisms.mechanisms()`` from commit 519625b on; before it,
                  ``verify.registry.mechanisms()``.
    problems      ``Mechanism.problem(n, seed, variant)`` (default variant) where it exists,
                  else ``make_problem(n, seed)``.
    cost factor   ``Mechanism.cost_factor``, called ``extra_factor`` before 519625b.

A benchmark whose inputs a commit cannot provide is skipped (setup raises NotImplementedError,
shown as n/a), never an error.

Implementations (the ``implementation`` parameter of every generated class):

    "reference"  mech.reference(problem): NumPy float64, dense, the ground truth.
    "fast"       the runner of mech.fast_setup(problem, "cpu", torch.float32).
    "dense"      the runner of mech.dense_setup(...): the O(N^2) torch twin, same framework and
                 dtype as fast, so that fast vs dense is a fair race.

Skip rules (asv's skip: setup raises NotImplementedError, the result shows as n/a):

    fast       N > max(mech.fast_sizes).
    dense      no dense twin (mech.dense_setup is None).
    reference, dense
               N > max(mech.dense_sizes), or two float64 N x N matrices over the reference
               memory budget (reference.budget.dense_budget(), 2 GiB unless
               MASKBENCH_REFERENCE_BUDGET says otherwise).
"""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from reference.budget import dense_budget
from verify.registry import Mechanism


def _import_loader() -> tuple[Callable[[], list], str | None]:
    """The installed commit's registry loader, and why it is partial (None: it is complete).

    A commit whose loader raises while registering its families (e.g. 519625b, the skeleton of
    issue 8, where the tree family still passed ``extra_factor``) is benchmarked on the
    mechanisms registered before the error, with a warning on stderr (``asv run -e`` shows it);
    the benchmarks of the others fail at that commit ("benchmark not found").
    """
    try:  # the loader package, from commit 519625b on (verify.registry imports no family)
        from verify.mechanisms import mechanisms as load
        return load, None
    except ImportError as exc:
        error = exc
        try:  # older commits: verify.registry loaded the families itself
            from verify.registry import mechanisms as load
            return load, None
        except ImportError:
            pass
    except Exception as exc:  # noqa: BLE001 - a family of this commit fails to register
        error = exc
    from verify.registry import registered

    return registered, f"{type(error).__name__}: {error}"


_load_mechanisms, LOAD_ERROR = _import_loader()
if LOAD_ERROR is not None:
    print(f"asv_bench: the registry of the installed maskbench did not load ({LOAD_ERROR}); "
          "benchmarking only the mechanisms registered before the error", file=sys.stderr)

#: Problems are seeded, so every process and every commit times the very same inputs.
SEED = 0
DEVICE = "cpu"
DTYPE = torch.float32
IMPLEMENTATIONS = ("reference", "fast", "dense")

#: Keep every GRID_STRIDE-th power of two of a mechanism's registry sizes, counted down from the
#: largest, so the grid stays geometric and always holds the most telling (largest) N. Every
#: second power keeps >= 2 decades of N for the sequence mechanisms while halving the run time.
GRID_STRIDE = 2

#: Dense float64 N x N copies the reference holds at once (reference/attention.py checks 2).
DENSE_COPIES = 2

#: Significant digits of what the track_ benchmarks return. asv stores that value and prints it
#: with json.dumps, all 17 digits of a float; 4 are more than any of them resolves (exponents and
#: GFLOP/s vary from run to run in the second or third digit, a relative error of float32
#: rounding in the second), and they keep `make bench`'s output readable.
SIGNIFICANT_DIGITS = 4


def significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits, as a float (NaN and inf unchanged); what
    every track_ benchmark returns. O(1).

        >>> from asv_bench.common import significant
        >>> significant(1.0123456789), significant(3.14159e-07), significant(0.0)
        (1.012, 3.142e-07, 0.0)
    """
    return float(f"{float(value):.{digits}g}")

#: asv timing settings shared by the generated classes (see attention.py for the why).
TIME_SETTINGS = dict(
    # (min samples, max samples, max seconds): slow calls (~1 s) stop after 3 samples, fast
    # ones take 10 samples within a second.
    repeat=(3, 10, 2.0),
    # Two processes per parameter combination, interleaved by asv with the other benchmarks.
    rounds=2,
    warmup_time=0.1,
    # Seconds for one parameter combination in one process, setup included.
    timeout=180.0,
)


def mechanisms() -> list[Mechanism]:
    """Every registered mechanism of the installed project, in registration order."""
    return list(_load_mechanisms())


def make_problem(mech: Mechanism, n: int, seed: int = SEED) -> Any:
    """The seeded problem of ``mech``'s default variant at N = ``n`` (the API of old commits too)."""
    if hasattr(mech, "problem"):
        return mech.problem(n, seed)
    return mech.make_problem(n, seed)


def cost_factor(mech: Mechanism) -> Callable[[Any], float] | None:
    """``mech``'s per-problem cost cofactor (the diameter for "N diam"), or None."""
    return getattr(mech, "cost_factor", None) or getattr(mech, "extra_factor", None)


def admissible(mech: Mechanism, n: int) -> int:
    """The N ``mech`` is defined at for a requested ``n`` (the hypercube needs 2^k)."""
    rule = getattr(mech, "admissible", None)
    return int(rule(n)) if rule is not None else int(n)


def class_name(mech_id: str) -> str:
    """A Python identifier for a mechanism id: "toeplitz-1d" -> "toeplitz_1d".

    asv splits benchmark names at "-" (the parameter index), so ids cannot be used verbatim.
    """
    name = re.sub(r"\W", "_", mech_id)
    return f"m_{name}" if name[:1].isdigit() else name


def install_classes(namespace: dict, classes: list[type]) -> None:
    """Put the generated benchmark ``classes`` into a module's ``namespace`` (its globals()).

    The classes a previous import generated are removed first, so that importlib.reload of a
    module after (un)registering a mechanism leaves exactly the classes of the registry now.
    Two mechanisms whose ids map to one class name, or a name taken by a module attribute,
    are refused (RuntimeError naming both).
    """
    for name in namespace.get("_GENERATED", ()):
        namespace.pop(name, None)
    taken: dict[str, str] = {}
    for cls in classes:
        mech_id = cls.mechanism.id
        if cls.__name__ in taken or cls.__name__ in namespace:
            other = taken.get(cls.__name__, "a module attribute")
            raise RuntimeError(f"benchmark class name {cls.__name__!r} of mechanism {mech_id!r} is taken by {other}")
        taken[cls.__name__] = repr(mech_id)
    namespace.update({cls.__name__: cls for cls in classes})
    namespace["_GENERATED"] = tuple(taken)


def size_grid(mech: Mechanism, stride: int = GRID_STRIDE) -> list[int]:
    """The N grid of ``mech``: every ``stride``-th of its fast and dense sizes, from the top, ascending."""
    sizes = sorted(set(mech.fast_sizes) | set(mech.dense_sizes))
    return sorted(sizes[::-1][::stride])


def within_dense_budget(n: int) -> bool:
    """Whether ``DENSE_COPIES`` float64 N x N matrices fit the reference memory budget."""
    return DENSE_COPIES * 8 * n * n <= dense_budget()


def skip_reason(mech: Mechanism, impl: str, n: int) -> str | None:
    """Why ``impl`` of ``mech`` is not run at ``n`` (None: it is run). Rules in the module docstring."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "fast":
        if n > max(mech.fast_sizes):
            return f"{mech.id}: fast runs up to N={max(mech.fast_sizes)} (registry fast_sizes)"
        return None
    if impl == "dense" and mech.dense_setup is None:
        return f"{mech.id}: no dense twin (the mechanism is dense itself)"
    if n > max(mech.dense_sizes):
        return f"{mech.id}: {impl} runs up to N={max(mech.dense_sizes)} (registry dense_sizes)"
    if not within_dense_budget(n):
        return f"{mech.id}: {impl} at N={n} needs {DENSE_COPIES} dense N x N float64 matrices, over the budget"
    return None


def pin_threads() -> None:
    """One torch thread in every benchmark.

    Why: on a 2-core machine a second intra-op thread competes with asv itself and with
    whatever else runs, which makes timings swing between processes; one thread is also what
    the exponent fits of measure/timing.py use (docs/methods.md), so the two sets of numbers agree.
    NumPy's BLAS (OpenBLAS, used by the reference) is pinned through OPENBLAS_NUM_THREADS=1,
    which must be set before NumPy is loaded (asv_bench/__init__.py and the Makefile set it).
    """
    torch.set_num_threads(1)


@dataclass
class Prepared:
    """The untimed part of one (mechanism, implementation, N): the problem and a runner."""

    problem: Any
    runner: Callable[[], object]


def _build(mech: Mechanism, impl: str, n: int) -> Prepared:
    problem = make_problem(mech, n)
    if impl == "reference":
        runner = functools.partial(mech.reference, problem)
    elif impl == "fast":
        runner = mech.fast_setup(problem, DEVICE, DTYPE)
    else:
        runner = mech.dense_setup(problem, DEVICE, DTYPE)
    return Prepared(problem, runner)


# asv_runner re-runs setup before every timed sample (so that state a benchmark mutates is
# fresh each time). Our runners are pure functions of their inputs, so the problem and runner
# are built once per process and reused: re-building a 2^17-token problem per sample would only
# slow the run down. One entry at most, so a process never holds two problems at once.
_PREPARED: dict[tuple[str, str, int], Prepared] = {}


def prepare(mech: Mechanism, impl: str, n: int) -> Prepared:
    """Pin threads, skip (NotImplementedError) per ``skip_reason``, else the seeded problem and runner."""
    pin_threads()
    reason = skip_reason(mech, impl, n)
    if reason is not None:
        raise NotImplementedError(reason)
    key = (mech.id, impl, int(n))
    if key not in _PREPARED:
        _PREPARED.clear()
        _PREPARED[key] = _build(mech, impl, int(n))
    return _PREPARED[key]
