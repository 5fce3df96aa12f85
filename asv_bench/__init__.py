"""asv benchmarks for maskbench, generated from the mechanism registry (verify.registry).

Layout:

    common.py     shared helpers: the N grid of each mechanism, the skip rules (memory budget,
                  registry size limits), thread pinning, seeded problems and runners.
    attention.py  one class per registered mechanism (named after its id, "-" -> "_"), with
                  params implementation x N and two benchmarks: time_attention (seconds per
                  call) and peakmem_attention (peak RSS of the benchmark process).
    accuracy.py   one class per mechanism: track_relative_error of the fast path and of the
                  dense torch twin against the float64 NumPy reference, on the same draws.
    machine.py    track_matmul_gflops: the fp32 torch matmul rate of this machine, the
                  roofline ceiling that the other numbers are read against.

A mechanism registered in verify/ appears here with no further wiring.

What asv is for here: history across commits (did a change make causal attention slower or
hungrier?) and charts (``asv publish``). asv runs every parameter combination in its own
process, and on our 2-core machines timings spread by up to 2x between processes, so exponent
fits and crossover N come from the in-process, interleaved sweeps of verify/timing.py
(docs/methods.md, "Complexity and speed"), never from these numbers.

Run it with ``make bench`` (``ARGS=--quick`` runs each benchmark once) and ``make publish``;
the configuration is asv.conf.json at the repository root (environment_type "existing": the
installed project is benchmarked, and results are saved under HEAD's hash).
"""
