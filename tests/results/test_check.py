"""results/check.py: the docs/design.md JSON schema of a check result, and the Check declaration
as the one place for a check's metadata."""
from __future__ import annotations

import json
import math

import pytest

from results.check import COMPARES, KINDS, STATUSES, UNITS, Check, CheckResult, Context, Outcome, judged, passes

#: The docs/design.md schema, plus compare and unit (additive).
SCHEMA = {"id", "title", "source", "kind", "status", "statistic", "threshold", "seconds", "details", "compare", "unit"}


def _result(**kw):
    base = dict(id="x/y", title="t", source="s", kind="bound", status="pass", statistic=0.5, threshold=1.0)
    base.update(kw)
    return CheckResult(**base)


def test_kinds_and_statuses_are_the_design_ones():
    assert set(KINDS) == {"equivalence", "statistical", "bound", "complexity", "scale", "erratum", "guard",
                         "reproducibility", "numerics", "perf"}
    assert set(STATUSES) == {"pass", "fail", "skip", "inconclusive"}  # inconclusive: complexity/<id> on a busy machine
    assert set(COMPARES) == {"<=", ">=", "<", ">", ""}
    assert {"", "bytes", "seconds", "relative", "ratio", "slope", "exponent", "absolute", "count"} <= set(UNITS)


@pytest.mark.parametrize("field, value", [("kind", "statistics"), ("kind", ""), ("status", "PASS"), ("status", "ok"),
                                          ("compare", "=<"), ("compare", "=="), ("unit", "MiB")])
def test_rejects_unknown_kind_status_compare_or_unit(field, value):
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
    assert d["compare"] == "" and d["unit"] == ""  # defaults: old producers still build results
    json.loads(json.dumps(d, allow_nan=False))  # no bare Infinity / NaN tokens
    assert _result(statistic=None).to_dict()["statistic"] is None
    assert _result().to_dict()["statistic"] == 0.5
    assert r.statistic == math.inf  # the record itself is not mutated


@pytest.mark.parametrize("stat, op, thr, want", [
    (1.0, "<=", 1.0, True), (1.0, "<", 1.0, False), (1.0, ">=", 1.0, True), (1.0, ">", 1.0, False),
    (0.5, "<", 1.0, True), (2.0, ">", 1.0, True), (2.0, "<=", 1.0, False), (math.nan, "<=", 1.0, False),
    (None, "<=", 1.0, None), (1.0, "", 1.0, None), (1.0, "<=", None, None)])
def test_passes(stat, op, thr, want):
    assert passes(stat, op, thr) is want


def test_reasons_given_error_or_the_failed_comparison():
    assert _result().reasons == []  # passing: no reasons, whatever details say
    assert _result(status="fail", details={"reasons": ["a", "b"], "error": "E"}).reasons == ["a", "b"]
    assert _result(status="fail", details={"error": "ValueError: x"}).reasons == ["ValueError: x"]
    assert _result(status="fail", statistic=2.0, threshold=1.0, compare="<=").reasons == [
        "statistic 2 is not <= threshold 1"]
    assert _result(status="fail", statistic=2.0, threshold=1.0).reasons == ["failed (the check gave no reason)"]


def test_judged():
    o = judged(False, 3.0, ["too big"], statistic="what the statistic is", n=4)
    assert (o.status, o.statistic, o.threshold) == ("fail", 3.0, None)
    assert o.details == {"statistic": "what the statistic is", "n": 4, "reasons": ["too big"]}
    assert judged(True, 1.0).details == {"reasons": []}
    with pytest.raises(ValueError, match="status must be one of"):
        Outcome("ok")


# ---------------------------------------------------------------------- metadata declared once


def _decl(run, **kw):
    return Check("fam/name", "the title", "paper Eq. 1", "bound", run=run, **kw)


def test_check_metadata_reaches_the_result():
    c = _decl(lambda ctx: judged(True, 0.25, [], n=3), threshold=1.0, compare="<=", unit="relative")
    r = c.evaluate(Context())
    assert (r.id, r.title, r.source, r.kind) == ("fam/name", "the title", "paper Eq. 1", "bound")
    assert (r.status, r.statistic, r.threshold, r.compare, r.unit) == ("pass", 0.25, 1.0, "<=", "relative")
    assert r.details == {"n": 3, "reasons": []} and r.seconds >= 0


def test_run_cannot_return_its_own_metadata():
    """A run returning a CheckResult (which could name another id or kind) is refused."""
    c = _decl(lambda ctx: CheckResult("other/id", "t", "s", "erratum", "pass", 0.0, 1.0))
    with pytest.raises(TypeError, match="must return an Outcome"):
        c.evaluate(Context())
    assert not {"id", "title", "source", "kind", "compare", "unit"} & set(Outcome.__dataclass_fields__)


def test_threshold_from_the_run_only_where_none_is_declared():
    dynamic = _decl(lambda ctx: Outcome("pass", 1.0, threshold=ctx.seed + 2.0), compare="<")
    assert dynamic.evaluate(Context(seed=3)).threshold == 5.0
    same = _decl(lambda ctx: Outcome("pass", 1.0, threshold=2.0), threshold=2.0)
    assert same.evaluate(Context()).threshold == 2.0
    contradicting = _decl(lambda ctx: Outcome("pass", 1.0, threshold=3.0), threshold=2.0)
    with pytest.raises(ValueError, match="declares 2.0"):
        contradicting.evaluate(Context())


def test_check_validates_its_declaration():
    run = lambda ctx: judged(True, 0.0)  # noqa: E731
    with pytest.raises(ValueError, match="kind must be one of"):
        Check("a/b", "t", "s", "boundary", run=run)
    with pytest.raises(ValueError, match="compare must be one of"):
        Check("a/b", "t", "s", "bound", run=run, compare="≤")
    with pytest.raises(ValueError, match="unit must be one of"):
        Check("a/b", "t", "s", "bound", run=run, unit="GiB")
    with pytest.raises(ValueError, match="family/name"):
        Check("no-family", "t", "s", "bound", run=run)


def test_error_result():
    c = _decl(lambda ctx: None, threshold=1.0, compare="<=", unit="bytes")
    r = c.error_result(RuntimeError("boom"), "Traceback ...")
    assert (r.id, r.kind, r.status, r.statistic) == ("fam/name", "bound", "fail", None)
    assert (r.threshold, r.unit) == (1.0, "bytes")
    assert r.details["error"] == "RuntimeError: boom" and r.reasons == ["RuntimeError: boom"]


def test_check_and_context_defaults():
    c = Check("a/b", "t", "s", "bound", run=lambda ctx: judged(True, 0.5))
    assert c.quick is True and c.threshold is None and c.compare == "" and c.unit == ""
    ctx = Context()
    assert ctx.quick and ctx.device == "cpu" and ctx.seed == 0 and ctx.sweeps == {}
    ctx.note("no-op")
    assert c.evaluate(ctx).status == "pass"
