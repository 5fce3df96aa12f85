"""The import graph of verify/ (docs/design.md, "Layout"): no cycle; the registry imports no family;
the families import nothing from each other; the loader is the only module that imports them.

Static: every module's imports are read with ast (module level and inside functions alike, since a
lazy import inside a function is still a dependency), resolved to verify modules, and the graph is
searched for a cycle."""
from __future__ import annotations

from tests.import_graph import find_cycle, import_graph

FAMILIES = {"verify.mechanisms.sequence", "verify.mechanisms.positional", "verify.mechanisms.tree"}


def graph() -> dict[str, set[str]]:
    return import_graph(("verify",))


def test_graph_reads_real_imports():
    g = graph()
    assert FAMILIES <= g["verify.mechanisms"]  # the loader imports the families
    assert "verify.registry" in g["verify.mechanisms.tree"]


def test_no_import_cycle_in_verify():
    assert find_cycle(graph()) is None


def test_cycle_finder_finds_a_plantedfind_cycle():
    g = graph()
    g["verify.registry"] = g["verify.registry"] | {"verify.mechanisms"}  # the old lazy loader
    found = find_cycle(g)
    assert found is not None and "verify.registry" in found


def test_registry_and_families():
    g = graph()
    assert not g["verify.registry"] & ({"verify.mechanisms"} | FAMILIES)
    for fam in FAMILIES:
        assert not g[fam] & (FAMILIES | {"verify.mechanisms"}), fam
    importers = {m for m, deps in g.items() if deps & FAMILIES}
    assert importers == {"verify.mechanisms"}
