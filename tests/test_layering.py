"""The layering of the packages (issue 22), read statically: every import of every module (module
level and inside functions alike: a lazy import is still a dependency), resolved with ast.

Layers, lowest first; a module imports only modules of its own layer or below, and the graph of
all modules is acyclic:

    0  results.*                               the results schema: pure data, imports no project module
    1  measure, measure.timing, measure.roofline   instruments: time and count (fast/ and results/ only)
    2  verify core: registry, problems, stats, dense, favor, plots, ranks, sharding, mechanisms.*
    3  measure workers: memory, scale_worker, datasets, training, experiments, suites, distributed
    4  verify.checks.*, verify.runner, verify.shard, verify.merge, verify.__main__ (and the verify package)
    5  measure pipeline: environment, stages, pipeline, cli, gpu, __main__

So verify and measure interleave on purpose (the checks time with measure's instruments and drive
its scale workers; the pipeline runs the checks), and these rules are the explicit exceptions to
"one direction": verify -> measure only into layers 1 and 3, measure -> verify only from layers 3
and 5. fast/ and reference/ import neither each other nor any of results/, verify/, measure/.
"""
from __future__ import annotations

from tests.import_graph import find_cycle, import_graph

PACKAGES = ("fast", "reference", "results", "verify", "measure")

INSTRUMENTS = {"measure", "measure.timing", "measure.roofline"}
VERIFY_CORE = {"verify.registry", "verify.problems", "verify.stats", "verify.dense", "verify.favor", "verify.plots",
               "verify.ranks", "verify.sharding"}
WORKERS = {"measure.memory", "measure.scale_worker", "measure.datasets", "measure.training", "measure.experiments",
           "measure.suites", "measure.distributed"}
PIPELINE = {"measure.environment", "measure.stages", "measure.pipeline", "measure.cli", "measure.gpu",
            "measure.kernel_tuning", "measure.__main__"}


def layer(module: str) -> int | None:
    """The layer of a module of results/, verify/ or measure/ (None for fast/ and reference/)."""
    top = module.split(".")[0]
    if top == "results":
        return 0
    if module in INSTRUMENTS:
        return 1
    if module in VERIFY_CORE or module == "verify.mechanisms" or module.startswith("verify.mechanisms."):
        return 2
    if module in WORKERS:
        return 3
    if module in ("verify", "verify.runner", "verify.shard", "verify.merge", "verify.__main__") \
            or module.startswith("verify.checks"):
        return 4
    if module in PIPELINE:
        return 5
    if top in ("fast", "reference"):
        return None
    raise AssertionError(f"{module} has no layer: place it in tests/test_layering.py and in its package's docstring")


def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGES)


def test_graph_reads_real_imports():
    g = graph()
    assert "results.check" in g["results.schema"]
    assert "measure.timing" in g["verify.checks.complexity"]
    assert "verify.runner" in g["measure.stages"]


def test_every_module_has_a_layer():
    for module in graph():
        layer(module)


def test_no_module_imports_a_higher_layer():
    bad = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})" for m, deps in graph().items()
           if layer(m) is not None for d in sorted(deps) if layer(d) is not None and layer(d) > layer(m)]
    assert not bad, bad


def test_fast_and_reference_import_no_harness_and_not_each_other():
    for m, deps in graph().items():
        top = m.split(".")[0]
        if top in ("fast", "reference"):
            assert {d.split(".")[0] for d in deps} <= {top}, (m, sorted(deps))


def test_results_imports_no_project_module():
    for m, deps in graph().items():
        if m.split(".")[0] == "results":
            assert {d.split(".")[0] for d in deps} <= {"results"}, (m, sorted(deps))


def test_measure_package_file_imports_nothing():
    # importing an instrument (measure.timing) runs measure/__init__.py first: it must not load the pipeline
    assert graph()["measure"] == set()


def test_no_importfind_cycle():
    assert find_cycle(graph()) is None


def test_the_rules_catch_a_planted_violation():
    g = graph()
    g["measure.timing"] = g["measure.timing"] | {"verify.checks.complexity"}
    assert find_cycle(g) is not None
    assert layer("measure.timing") < layer("verify.checks.complexity")
