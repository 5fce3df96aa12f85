"""The results schema shared by verify/ (checks) and measure/ (measurements): pure data.

- results.check: a check's declaration (``Check``), what a run measured (``Outcome``), its run
  context (``Context``) and the JSON record of its result (``CheckResult``);
- results.schema: the results JSON that ``python -m measure`` writes and reports/ renders
  (``Results`` and its records: sweeps, comparisons, memory curves, the training demo, ...).

Layering: the bottom package. It imports nothing of the project (no fast/, reference/, verify/,
measure/, reports/) and no torch, so every other package, reports/ included, may import it
(tests/test_layering.py enforces it).
"""
