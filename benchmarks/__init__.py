"""pytest-benchmark suite: single attention operations, maskbench beside its peer libraries.

Run by ``make bench-ops`` (docs/benchmarks.md, "Peer benchmarks (pytest-benchmark)"); not part
of ``make test`` (pyproject's testpaths is ``tests``). ``ops`` holds the operations and every
library's call of them, ``conftest`` the options and the grid, ``test_peers`` the benchmarks,
``summary`` turns pytest-benchmark's JSON into the peers summary (NumPy only, no torch).
"""
