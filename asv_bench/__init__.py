"""asv benchmarks for maskbench, generated from the mechanism registry (verify.mechanisms).

Layout:

    common.py       shared helpers: the registry (through the API of whichever commit asv
                    installed), the N grid of each mechanism, the skip rules (memory budget,
                    registry size limits), thread pinning, seeded problems and runners.
    attention.py    one class per registered mechanism (named after its id, "-" -> "_"), with
                    params implementation x N and two benchmarks: time_attention (seconds per
                    call) and peakmem_attention (peak RSS of the benchmark process).
    accuracy.py     one class per mechanism: track_relative_error of the fast path and of the
                    dense torch twin against the float64 NumPy reference, on the same draws.
    complexity.py   one class per mechanism: track_exponent, the fitted exponent of a small
                    in-process sweep of the fast path, so asv charts the scaling itself.
    machine.py      track_matmul_gflops: the fp32 torch matmul rate of this machine, the
                    roofline ceiling that the other numbers are read against.
    offline_html.py not a benchmark: the step of ``make publish`` that serves the page's
                    JavaScript libraries from local npm packages (www/package.json).

A mechanism registered in verify/ appears here with no further wiring.

What asv is for here: history across commits (did a change make causal attention slower or
hungrier, or change how it scales?) and charts (``asv publish``). asv runs every parameter
combination in its own process, and on our 2-core machines timings spread by up to 2x between
processes, so exponent fits and crossover N come from in-process, interleaved sweeps
(measure/timing.py, docs/methods.md "Complexity and speed"): complexity.py runs a short one.

Run it with ``make bench`` (the installed project at HEAD), ``make bench-history RANGE=A..B``
(each commit built into asv's virtualenv), ``make publish``; docs/benchmarks.md has the details
and asv.conf.json the configuration.
"""
import os
import sys

# NumPy's BLAS (OpenBLAS, used by the float64 reference) reads its thread count once, when NumPy
# loads; one thread, as the benchmarks pin torch (common.pin_threads). asv imports this package
# before any benchmark module imports NumPy, so plain `asv run` gets the setting too; a caller
# that loaded NumPy already (or set the variable) is left alone.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
