"""maskbench reports: render a results JSON (results/schema.py), asv results and the peer suite's
summary into one HTML page.

reports/ only draws. ``python -m measure --out FILE`` measures and writes FILE;
``python -m reports --from-json FILE`` renders it (``make report`` runs both). This package
imports nothing that measures (no fast/, reference/, torch, measure/, verify.mechanisms,
subprocess): only results/ and verify.plots (pure data), NumPy, matplotlib, Jinja2 and the standard
library (tests/reports/test_imports.py checks it).

    asv_history  asv result files -> series across commits, per-mechanism histories
    format       numbers as text: units (bytes, seconds), fits, powers of two, comparison signs
    style        the figures' shared look: matplotlib (Agg), colours, markers, guides, log axes, legends, saving
    sections/    one module per section of the page (its view, its figures; its template partial is
                 templates/sections/<module>.html.j2): summary, gallery, time_vs_n, crossover, memory,
                 peers, roofline, variants, verification, numerics, favor, training, gpu, history, environment
    page         the sections in page order and the Jinja2 rendering (templates/index.html.j2, autoescaped)
    render       Results -> every section's PNGs and index.html in one folder
"""
