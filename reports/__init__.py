"""maskbench reports: render a results JSON (verify/schema.py), asv results and the peer suite's
summary into one HTML page.

reports/ only draws. ``python -m verify.measure --out FILE`` measures and writes FILE;
``python -m reports --from-json FILE`` renders it (``make report`` runs both). This package
imports nothing that measures (no fast/, reference/, torch, verify.timing, verify.measure,
verify.memory, verify.mechanisms, subprocess): only verify.schema and verify.result (pure data),
NumPy, matplotlib, Jinja2 and the standard library (tests/reports/test_imports.py checks it).

    asv_history  asv result files -> series across commits, per-mechanism histories
    format       numbers as text: units (bytes, seconds), fits, powers of two, comparison signs
    figures      matplotlib (Agg) figures, one function per PNG
    page         the view model and the Jinja2 rendering (templates/*.html.j2, autoescaped)
    peers        the peers section: the peer suite's summary JSON (make bench-ops) read, tabulated, drawn
    roofline     the roofline section: the perf/<id> checks' fractions tabulated and drawn
    training     the training section: learned latent graphs trained end to end (Results.training)
    render       Results -> the PNGs and index.html in one folder
"""
