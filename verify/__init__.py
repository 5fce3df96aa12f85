"""The harness pairing reference/ and fast/: problems, the mechanism registry, statistics, checks, CLI.

``python -m verify`` runs every check; see ``python -m verify --help``.

Layering (module level, acyclic; tests/test_layering.py enforces it), between the layers of
measure/ (see measure):

- core: verify.registry, verify.problems, verify.stats, verify.dense, verify.favor, verify.plots,
  verify.ranks and verify.sharding (gloo ranks on this machine, the sharded cases they run),
  verify.mechanisms: what a check needs to describe a mechanism. They import fast/, reference/,
  results/ and measure's instruments (measure.timing, measure.roofline: a mechanism record declares
  what its perf check times), nothing else of measure/;
- checks: verify.checks (generic families by kind, paper claims by paper), verify.runner,
  verify.shard and verify.merge (``--shard I/K`` and joining the shards) and the CLI add measure's workers (verify.checks.scale drives measure.scale_worker), never measure's
  pipeline, which runs them.
"""
