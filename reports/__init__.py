"""maskbench reports: sweeps, peak memory, verification and figures -> one HTML page.

``python -m reports [--quick] [--out DIR]`` (what ``make report`` runs) writes DIR/index.html,
the PNG figures beside it and DIR/results.json with every number. Modules:

    sweeps       in-process timing sweeps over the registry, exponent fits, crossovers
    memory       peak memory per (mechanism, impl), one subprocess each (also the child)
    favor        FAVOR+ kernel estimation error vs the number of features m
    gallery      dense masks M of small instances (heatmaps; summaries in results.json)
    asv_history  asv result files -> per-benchmark series across commits
    data         ReportData: everything the page shows; results.json schema
    figures      matplotlib (Agg) figures
    html         the index.html page
    render       ReportData -> files

This package imports nothing at import time: ``python -m reports.memory`` children stay light.
"""
