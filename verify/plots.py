"""Figures a check asks the report to draw: plain data in ``details["plots"]``.

A check that measures a curve (error against the number of walks with the theorem's bound beside
it, an expm action's error against its tolerance) records it as data, and the report draws every
such curve the same way (reports.sections.verification), so a new family needs no report code:

    details["plots"] = [plot("error vs walks", "walks n", "relative Frobenius error",
                             [series("measured", ns, errors, lower=lo, upper=hi),
                              series("n^-1/2 through the first point", ns, guide, kind="line"),
                              series("Thm 3.1 bound", ns, bound, kind="bound")])]

A plot is a dict: title, xlabel, ylabel, xlog, ylog (bools) and series, a list of dicts with
label, kind ("points": markers, with optional lower/upper error bars; "line": a solid line;
"bound": a dashed line, a claim the points must respect), x and y (equal-length lists of finite
floats; y may hold None for a point that has no value). JSON-ready as built; ``validate_plot``
is what the report reads through, so a malformed plot is refused where it is made.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

SERIES_KINDS = ("points", "line", "bound")
#: Plots per check and series per plot the report draws (more are dropped with a note).
MAX_PLOTS, MAX_SERIES = 4, 8


def _floats(name: str, values: Iterable[Any], allow_none: bool = False) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        if v is None and allow_none:
            out.append(None)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must hold numbers, got {v!r}") from None
        if not math.isfinite(f):
            if allow_none:
                out.append(None)  # a non-finite value has no place on a log axis: drawn as a gap
                continue
            raise ValueError(f"{name} must hold finite numbers, got {v!r}")
        out.append(f)
    return out


def series(label: str, x: Sequence[Any], y: Sequence[Any], *, kind: str = "points",
           lower: Sequence[Any] | None = None, upper: Sequence[Any] | None = None) -> dict[str, Any]:
    """One series: x, y (equal lengths; y's non-finite entries become None, a gap), and for
    kind "points" optional lower/upper ends of an interval around each y."""
    if kind not in SERIES_KINDS:
        raise ValueError(f"series kind must be one of {SERIES_KINDS}, got {kind!r}")
    xs, ys = _floats("x", x), _floats("y", y, allow_none=True)
    if len(xs) != len(ys):
        raise ValueError(f"series {label!r}: x and y differ in length ({len(xs)} vs {len(ys)})")
    out: dict[str, Any] = {"label": str(label), "kind": kind, "x": xs, "y": ys}
    for name, band in (("lower", lower), ("upper", upper)):
        if band is not None:
            if kind != "points":
                raise ValueError(f"series {label!r}: {name} is for kind 'points' only")
            b = _floats(name, band, allow_none=True)
            if len(b) != len(xs):
                raise ValueError(f"series {label!r}: {name} has {len(b)} entries for {len(xs)} points")
            out[name] = b
    return out


def plot(title: str, xlabel: str, ylabel: str, series_list: Sequence[dict[str, Any]], *,
         xlog: bool = True, ylog: bool = True) -> dict[str, Any]:
    """One panel of a check's figure (module docstring)."""
    out = {"title": str(title), "xlabel": str(xlabel), "ylabel": str(ylabel), "xlog": bool(xlog),
           "ylog": bool(ylog), "series": list(series_list)}
    return validate_plot(out)


def validate_plot(p: Any) -> dict[str, Any]:
    """The plot ``p`` (a dict as ``plot`` builds, e.g. read back from JSON) checked and normalised;
    ValueError naming what is wrong."""
    if not isinstance(p, dict):
        raise ValueError(f"a plot must be a dict, got {type(p).__name__}")
    missing = [k for k in ("title", "xlabel", "ylabel", "series") if k not in p]
    if missing:
        raise ValueError(f"a plot needs the keys {missing}")
    raw = p["series"]
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"plot {p['title']!r}: series must be a non-empty list")
    checked = []
    for s in raw:
        if not isinstance(s, dict) or not {"label", "x", "y"} <= set(s):
            raise ValueError(f"plot {p['title']!r}: each series needs label, x and y, got {s!r:.80}")
        checked.append(series(s["label"], s["x"], s["y"], kind=s.get("kind", "points"),
                              lower=s.get("lower"), upper=s.get("upper")))
    return {"title": str(p["title"]), "xlabel": str(p["xlabel"]), "ylabel": str(p["ylabel"]),
            "xlog": bool(p.get("xlog", True)), "ylog": bool(p.get("ylog", True)), "series": checked}
