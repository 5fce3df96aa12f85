"""verify/result.py: the docs/design.md JSON schema of a check result."""
from __future__ import annotations

import json
import math

import pytest

from verify.result import KINDS, STATUSES, Check, CheckResult, Context

SCHEMA = {"id", "title", "source", "kind", "status", "statistic", "threshold", "seconds", "details"}


def _result(**kw):
    base = dict(id="x/y", title="t", source="s", kind="bound", status="pass", statistic=0.5, threshold=1.0)
    base.update(kw)
    return CheckResult(**base)


def test_kinds_and_statuses_are_the_design_ones():
    assert set(KINDS) == {"equivalence", "statistical", "bound", "complexity", "scale", "erratum"}
    assert set(STATUSES) == {"pass", "fail", "skip"}


@pytest.mark.parametrize("field, value", [("kind", "statistics"), ("kind", ""), ("status", "PASS"), ("status", "ok")])
def test_rejects_unknown_kind_or_status(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        _result(**{field: value})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", STATUSES)
def test_accepts_every_known_kind_and_status(kind, status):
    assert _result(kind=kind, status=status).to_dict()["kind"] == kind


def test_to_dict_has_the_schema_and_is_strict_json():
    r = _result(statistic=math.inf, threshold=math.nan, details={"n": 3})
    d = r.to_dict()
    assert set(d) == SCHEMA
    assert d["statistic"] == "inf" and d["threshold"] == "nan"
    json.loads(json.dumps(d, allow_nan=False))  # no bare Infinity / NaN tokens
    assert _result(statistic=None).to_dict()["statistic"] is None
    assert _result().to_dict()["statistic"] == 0.5
    assert r.statistic == math.inf  # the record itself is not mutated


def test_check_and_context_defaults():
    c = Check("a/b", "t", "s", "bound", run=lambda ctx: _result())
    assert c.quick is True
    ctx = Context()
    assert ctx.quick and ctx.device == "cpu" and ctx.seed == 0
    ctx.note("no-op")
    assert c.run(ctx).status == "pass"
