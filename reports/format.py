"""Numbers as text for the page and the figures: units, fits, powers of two, comparison signs.

Pure functions of plain values (no matplotlib, no Jinja2); the templates call them as filters.
"""
from __future__ import annotations

import json
import math
from typing import Any

from results.schema import Fit

DASH = "–"
_SUPERSCRIPT = str.maketrans("0123456789.-", "⁰¹²³⁴⁵⁶⁷⁸⁹·⁻")
#: CheckResult.compare -> the sign printed between statistic and threshold.
COMPARE_SIGNS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">", "==": "=", "=": "=", "!=": "≠",
                 "≤": "≤", "≥": "≥"}
#: CheckResult.unit spellings that mean bytes / seconds.
BYTE_UNITS = {"bytes", "byte", "b"}
SECOND_UNITS = {"seconds", "second", "s", "sec"}


def finite(x: Any) -> bool:
    """True for an int or float that is neither inf nor nan (bools and None are not numbers here)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def as_float(x: Any) -> float | None:
    """A JSON value as a float: numbers, "inf" / "-inf" / "nan" strings (results.schema writes
    non-finite values so), else None (None, bools, other strings, other types)."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return float(x) if isinstance(x, (int, float)) else None


def number(x: Any, fmt: str = ".3g") -> str:
    """"1.23", "∞", "nan", "–" (None); other values as str."""
    if x is None:
        return DASH
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return format(x, fmt)
    return str(x)


def count_text(x: Any) -> str:
    """A structural number (a diameter, a depth): "4,095" when whole, else three digits."""
    if finite(x) and float(x).is_integer():
        return f"{int(x):,}"
    return number(x)


def bytes_text(b: float | None) -> str:
    """Bytes at three significant digits in binary units: "512 B", "3.5 KiB", "80 MiB", "1.25 GiB"."""
    if not finite(b):
        return number(b)
    sign, b = ("−" if b < 0 else ""), abs(float(b))
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{sign}{b / size:.3g} {unit}"
    return f"{sign}{b:.0f} B"


def seconds_text(t: float | None) -> str:
    """A duration at three significant digits: "1.3 s", "0.42 ms" -> "420 µs", "95 ns"."""
    if not finite(t):
        return number(t)
    a = abs(t)
    if a >= 1000:  # "1,360 s", not "1.36e+03 s"
        return f"{t:,.0f} s"
    if a >= 1 or a == 0:
        return f"{t:.3g} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{t * 1e6:.3g} µs"
    return f"{t * 1e9:.3g} ns"


def with_unit(x: Any, unit: str | None) -> str:
    """A check's statistic or threshold in its unit: bytes as B/KiB/MiB/GiB, seconds as s/ms/µs/ns,
    any other unit (exponent, relative, ...) as the bare number (the page names the unit beside it)."""
    u = (unit or "").strip()
    if u.lower() in BYTE_UNITS:
        return bytes_text(x)
    if u.lower() in SECOND_UNITS:
        return seconds_text(x)
    if u.lower() in ("count", "rows") and finite(x) and float(x).is_integer():
        return count_text(x)  # "3,080", not "3.08e+03"
    return number(x)


def compare_sign(compare: str | None) -> str | None:
    """"<=" -> "≤"; None (not recorded) stays None; an unknown spelling is shown as given."""
    if compare is None or compare == "":
        return None
    return COMPARE_SIGNS.get(str(compare).strip(), str(compare))


def class_text(complexity: str) -> str:
    """A complexity class for people: "N log^2 N" -> "N log² N", "N^2" -> "N²"."""
    return complexity.replace("^2", "²").replace("^3", "³")


def fit_text(fit: Fit | None, digits: int = 2) -> str:
    """"1.03 [0.98, 1.08]" (slope and its CI) or a dash."""
    if fit is None:
        return DASH
    return f"{fit.slope:.{digits}f} [{fit.low:.{digits}f}, {fit.high:.{digits}f}]"


def pow2_text(n: Any) -> str:
    """"2¹²" for powers of two, "5,000" otherwise, "–" for None."""
    if n is None:
        return DASH
    n = int(n)
    return f"2{str(n.bit_length() - 1).translate(_SUPERSCRIPT)}" if n > 0 and n & (n - 1) == 0 else f"{n:,}"


def n_text(n: float | None) -> str:
    """An N estimate (crossovers are real numbers): "1,024", "3.2e+07", "–"."""
    if not finite(n):
        return number(n)
    return f"{n:,.0f}" if abs(n) < 1e7 else f"{n:.2g}"


def value_text(x: Any) -> str:
    """An environment value: lists and dicts as compact JSON, None as a dash."""
    if x is None:
        return DASH
    if isinstance(x, (list, tuple, dict)):
        return json.dumps(x, default=str)
    if isinstance(x, float):
        return number(x, ".4g")
    return str(x)


def read_json(path) -> tuple[bool, Any, str]:
    """(found, data, error) of a JSON file the page reads: (False, None, "") when there is no file,
    (True, None, "Type: message") when it cannot be read or parsed, never an exception."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        return False, None, ""
    try:
        return True, json.loads(p.read_text(encoding="utf-8")), ""
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return True, None, f"{type(exc).__name__}: {exc}"


def duration_text(t: float | None) -> str:
    """A wall time for people: "22 min 40 s", "1 h 3 min", "42 s", "1.3 s"; below a second as
    seconds_text ("420 ms").

    >>> from reports.format import duration_text
    >>> duration_text(1360.4), duration_text(3790), duration_text(42.2), duration_text(0.42)
    ('22 min 40 s', '1 h 3 min', '42 s', '420 ms')
    """
    if not finite(t) or abs(t) < 10:
        return seconds_text(t)
    s = round(abs(float(t)))
    sign = "−" if t < 0 else ""
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{sign}{h} h {m} min"
    return f"{sign}{m} min {sec} s" if m else f"{sign}{sec} s"


def load_text(load: Any) -> str:
    """A (1, 5, 15)-minute load average triple as "2.1 / 2.4 / 2.9 (1, 5, 15 min)"; anything else
    via value_text.

    >>> from reports.format import load_text
    >>> load_text([2.1, 2.4, 2.93])
    '2.1 / 2.4 / 2.93 (1, 5, 15 min)'
    """
    if isinstance(load, (list, tuple)) and len(load) == 3 and all(finite(x) for x in load):
        return " / ".join(f"{x:.3g}" for x in load) + " (1, 5, 15 min)"
    return value_text(load)


def _key_unit(key: str) -> str:
    """The unit a details key names by its spelling: "seconds", "bytes" or ""."""
    k = key.lower()
    if k.endswith(("seconds", "_s", "_sec", "_secs")) or k in SECOND_UNITS:
        return "seconds"
    if k.endswith(("bytes", "_b")) or k in BYTE_UNITS:
        return "bytes"
    return ""


def brief_text(x: Any, key: str = "", max_items: int = 8) -> str:
    """One value of a check's details in one short line: numbers at three digits (seconds and
    bytes in their units where the key says so: "*_seconds", "*_bytes"), lists as "1, 2, 3, …
    (40 values)", small dicts as "a: 1, b: 2", anything longer cut at 200 characters.

    >>> from reports.format import brief_text
    >>> brief_text(0.0123, "fit_seconds"), brief_text(list(range(40))), brief_text({"a": 1.23456})
    ('12.3 ms', '0, 1, 2, 3, 4, 5, 6, 7, … (40 values)', 'a: 1.23')
    """
    unit = _key_unit(key)
    if isinstance(x, (list, tuple)):
        head = ", ".join(brief_text(v, key, max_items) for v in x[:max_items])
        text = head + (f", … ({len(x)} values)" if len(x) > max_items else "")
    elif isinstance(x, dict):
        text = ", ".join(f"{k}: {brief_text(v, str(k), max_items)}" for k, v in list(x.items())[:max_items])
        text += f", … ({len(x)} entries)" if len(x) > max_items else ""
    elif unit == "seconds" and finite(x) and abs(x) >= 60:
        text = duration_text(x)
    elif unit and finite(x):
        text = with_unit(x, unit)
    elif isinstance(x, int) and not isinstance(x, bool):
        text = f"{x:,}"
    else:
        text = number(x) if x is None or isinstance(x, (int, float)) else str(x)
    return text if len(text) <= 200 else text[:199] + "…"


def details_rows(details: Any, skip: tuple[str, ...] = ("plots",)) -> list[tuple[str, str]]:
    """A check's details as (key, value text) rows for a small two-column table: one row per top
    key, nested dicts one level deep as "outer.inner", every value through brief_text; keys in
    ``skip`` (the curves drawn elsewhere) left out.

    >>> from reports.format import details_rows
    >>> details_rows({"n": 4096, "fit": {"slope": 1.0312, "r2": 0.999}, "elapsed_seconds": 1360.4, "plots": []})
    [('n', '4,096'), ('fit.slope', '1.03'), ('fit.r2', '0.999'), ('elapsed_seconds', '22 min 40 s')]
    """
    if not isinstance(details, dict):
        return [] if details in (None, "", {}) else [("value", brief_text(details))]
    rows: list[tuple[str, str]] = []
    for k, v in details.items():
        if k in skip:
            continue
        if isinstance(v, dict) and v and len(v) <= 12 and not any(isinstance(x, dict) for x in v.values()):
            rows += [(f"{k}.{kk}", brief_text(vv, str(kk))) for kk, vv in v.items()]
        else:
            rows.append((str(k), brief_text(v, str(k))))
    return rows
