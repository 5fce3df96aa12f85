"""python -m measure: every measurement the report shows, in one results JSON.

    python -m measure [--quick] [--out FILE] [--device cpu] [--rounds K] [--only MECH_ID ...]
        [--skip-variants] [--skip-memory] [--skip-verify] [--verify-full] [--verify-json PATH]
        [--skip-training] [--skip-distributed] [--skip-peers] [--skip-history] [--no-progress]

writes one results.schema.Results (default reports/out/results.json); ``python -m reports`` renders
it. Each stage shows a tqdm bar and prints status lines on stderr; its wall time goes to
``stage_seconds`` and the machine's load at its start and end to ``environment["load"]``
(measure.environment states the load_warning rule). Stages, in order (their times below):

1. sweeps: every mechanism's fast path and dense twin on its default variant, then every other
   variant with sweep=True (fast path only, on its quick grid in both modes; an N gets no further
   round once it has used stages.VARIANT_POINT_BUDGET_S = 0.5 s, as the old tree stage did),
   measure.timing.sweep with torch threads pinned to 1, interleaved rounds (3 quick, 5 full: the
   complexity checks' counts), seed 0. Fits (the one fit rule, measure.timing.fit_points),
   cost-factor fits, metrics; comparisons of the default variant with its dense twin (speed-up,
   its fit, crossover with a bootstrap 95% interval, measure.timing.crossover_interval).
2. memory: peak memory vs N per (mechanism, impl), default variant, one child process per
   mechanism (measure.memory), two at a time; quick caps N at 2^15 (fast) and 2^12 (dense).
3. favor_error: FAVOR+ RMSE vs m against verify.stats.prf_variance (1000 draws quick, 4000 full);
   then favor_accuracy: FAVOR+ attention against exact softmax over the q, k std and m
   (measure.experiments.favor_accuracy; N = 512 and 2 seeds quick, 1024 and 4 full).
4. gallery: the dense mask of every mechanism that has one at N = 64 (admissible), matrices
   included.
5. checks: verify.runner.run_checks (quick unless --verify-full) sharing the sweep cache, so
   complexity/<id> fits the sweep stage's own sweep whenever it covers the check's grid with at
   least as many rounds (measure.timing.covering_sweep: always, since full sweeps cover the quick
   grid), judged at the check's own grid; --verify-json PATH loads a ``python -m
   verify --json`` file instead; --only restricts them to the checks about those mechanisms.
6. training: the training demo of issue 13 (measure.training: NodeFormer, SGFormer, DIFFormer and
   an MLP on three small graphs, 3 seeds x 80 epochs quick, 5 x 150 full, torch on 1 thread),
   into ``training``; --skip-training leaves it out, and so does --only (a run restricted to some
   mechanisms: the demo belongs to none of them).
7. distributed: sharded FAVOR+ on 1, 2 and 4 gloo ranks of this machine (measure.distributed):
   weak scaling (2^16 tokens per rank), strong scaling (N = 2^18), bytes sent per rank against
   N = 2^12 .. 2^18, world size 1 on CUDA where a GPU is present; --skip-distributed and --only
   leave it out.
8. peers: the peer suite of benchmarks/ on its quick grid and its summary
   (benchmarks/out/peers-summary.json, the report's Peers section; measure.suites.run_peers).
9. history: asv's exponent benchmarks for the current commit into .asv/results (the report's
   History section; measure.suites.run_history). --skip-peers, --skip-history and --only leave
   them out; what each did is the environment's "peers_run" / "history_run" line.

Time, 23 mechanisms, 2 cores, quiet machine, ``make report`` in a fresh clone (venv and rendering
included; commit 0fa78fd): full 11.7 minutes (sweeps 312 s, memory 92 s, checks 137 s, training
37 s, peers 37 s, history 20 s, rendering 27 s), quick 7.3 minutes.

Exit status: 0 when the JSON was written (even if checks failed: ``python -m verify`` is the
gate), 2 on bad arguments.

Layering (module level, acyclic; tests/test_layering.py enforces it). measure/ holds two layers on
either side of verify's checks, so that the checks can time and the pipeline can run the checks:

- instruments: measure.timing, measure.roofline import only fast/ and results/ (the mechanism
  records of verify.mechanisms declare their roofline case with them; the checks time with them);
- workers: measure.memory, measure.scale_worker, measure.datasets, measure.training,
  measure.experiments, measure.suites, measure.distributed add verify's core (registry, mechanisms, problems, stats), never
  verify.checks or verify.runner (verify.checks.scale drives measure.scale_worker);
- pipeline: measure.environment, measure.stages, measure.pipeline, measure.cli, measure.gpu run
  everything above, verify.checks and verify.runner included; nothing outside measure/ imports them.

This file imports nothing, so that importing an instrument does not load the pipeline.
"""
