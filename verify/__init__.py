"""The harness pairing reference/ and fast/: problems, the mechanism registry, statistics, checks, CLI.

``python -m verify`` runs every check; see ``python -m verify --help``.
"""
