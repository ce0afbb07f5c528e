"""The per-unit plan: which columns an experiment needs, the one error rule, labels carrying
only a score, and bounded segment values — on the numpy rendering (the SQL rendering is
checked against it on real chDB in tests/integration/platform/analysis/test_unit_agg_store.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.custom_metric import CUSTOM_METRIC, MeanMetric, custom_columns
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.offline import aggregate_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict

SPEC = parse_spec(spec_dict())


def _metric(name, kind, cuped=None, **fields):
    """A custom metric as the registry and the spec validate it."""
    return CUSTOM_METRIC.validate_python({"name": name, "type": kind, **fields,
                                          **({"cuped": {"covariate": cuped}} if cuped else {})})


def test_the_plan_has_every_built_in_column_and_each_custom_metrics_columns():
    metrics = (
        _metric("judge", "mean", column="score", cuped="pre_period"),
        _metric("cpk", "ratio", numerator="cost_usd", denominator="output_tokens", scale=1000),
        _metric("steps_p90", "quantile", column="measures.steps", quantile=0.9),
        _metric("tools", "mean", column="measures.tools", cuped="e2e_ms"),
    )
    plan = ua.plan(replace(SPEC, custom=metrics, segments=("dims.domain",), start="2026-12-01T00:00:00Z"))
    names = {c.name for c in plan.columns}
    assert set(UNIT_COLUMNS) <= names
    for m in metrics:
        cols = custom_columns(m)
        assert {cols[r] for r in cols if not r.startswith("pre_")} <= names
        assert {cols[r] for r in cols if r.startswith("pre_")} <= {c.name for c in plan.pre_columns}
    assert [h.key for h in plan.histograms] == ["e2e_ms", "ttft_ms", "steps_p90"]
    assert plan.segments == ("domain",)
    ratio = {c.name: c for c in plan.columns}["c__cpk__x"]
    assert ratio.requires == ("cost_usd", "output_tokens")  # a request counts in both sums or in neither


def test_unknown_sources_and_segments_are_refused():
    with pytest.raises(ValueError, match="unknown source"):
        # built past validation: the plan refuses a source it cannot read on its own
        ua.plan(replace(SPEC, custom=(MeanMetric.model_construct(name="x", type="mean", column="latency"),)))
    with pytest.raises(ValueError, match="dims"):
        ua.plan(replace(SPEC, segments=("country",)))


def _events(rows):
    base = {"experiment": SPEC.key, "ts": "2026-12-01T01:00:00Z"}
    return pd.DataFrame([{**base, **r} for r in rows])


def _inference(trace, unit, variant="control", **kw):
    return {"type": "inference", "trace_id": trace, "unit_id": unit, "variant": variant, "e2e_ms": 100.0,
            "ttft_ms": 50.0, "cost_usd": 0.001, "output_tokens": 10, **kw}


def test_one_error_rule_present_and_not_empty():
    ev = _events([
        _inference("t1", "u1", error="timeout"),
        _inference("t2", "u1", error="false"),  # a code the producer sent: a failure, as the store counts it
        _inference("t3", "u1", error=""),
        _inference("t4", "u1", error=None),
    ])
    agg = aggregate_events(ev, SPEC)
    assert agg.units["errors"].sum() == 2 and agg.units["requests"].sum() == 4
    assert "present and not empty" in ua.ERROR_RULE


def test_a_label_may_carry_only_a_score_and_the_latest_per_field_wins():
    spec = replace(SPEC, custom=(_metric("judge", "mean", column="score"),))
    ev = _events([
        _inference("t1", "u1"),
        _inference("t2", "u2"),
        {"type": "feedback", "trace_id": "t1", "score": 3.0, "ts": "2026-12-01T01:00:01Z"},
        {"type": "feedback", "trace_id": "t1", "score": 7.5, "ts": "2026-12-01T01:00:09Z"},
        {"type": "feedback", "trace_id": "t1", "correct": 1, "ts": "2026-12-01T01:00:05Z"},
        {"type": "feedback", "trace_id": "t2", "correct": 0, "ts": "2026-12-01T01:00:05Z"},
        {"type": "feedback", "trace_id": "t2"},  # neither: refused, counted
    ])
    agg = aggregate_events(ev, spec)
    cols = custom_columns(spec.custom[0])
    assert agg.units[cols["x"]].sum() == 7.5 and agg.units[cols["y"]].sum() == 1
    assert agg.units["labeled"].sum() == 2 and agg.units["correct"].sum() == 1
    assert agg.data_quality["rejected"] == {"bad_feedback": 1}


def test_segment_values_are_bounded_other_and_none():
    values = np.array([f"v{i % 30}" for i in range(300)] + ["v1"] * 50 + [""] * 7, dtype=object)
    present = values != ""
    top = ua.top_values(values, present)
    assert len(top) == ua.MAX_SEGMENT_VALUES and top[0] == "v1"
    assert top[1:] == sorted(top[1:])  # equal counts: by value
    folded = ua.fold_values(values, present, top)
    assert (folded[~present] == ua.NONE).all()
    assert set(folded[present]) == set(top) | {ua.OTHER}


def test_measures_as_a_map_a_struct_or_flat_columns_read_the_same():
    spec = replace(SPEC, custom=(_metric("tools", "mean", column="measures.tools"),), segments=("dims.domain",))
    rows = [_inference(f"t{i}", f"u{i % 3}", measures={"tools": float(i)} if i % 4 else {}, dims={"domain": "a" if i % 2 else "b"})
            for i in range(12)]
    structs = aggregate_events(_events(rows), spec)
    flat = aggregate_events(_events([{**{k: v for k, v in r.items() if k not in ("measures", "dims")},
                                      "measures.tools": r["measures"].get("tools"), "dims.domain": r["dims"]["domain"]}
                                     for r in rows]), spec)
    col = custom_columns(spec.custom[0])
    for agg in (structs, flat):
        assert agg.units[col["y"]].sum() == 9 and agg.units[col["x"]].sum() == sum(i for i in range(12) if i % 4)
        assert set(agg.segments["dims.domain"]) == {"a", "b"}


def test_rollup_key_is_canonical_says_whether_segments_are_kept_and_refuses_unknown_metrics():
    assert ua.rollup_key({"ttft_ms": 200, "tpot_ms": 25}) == ua.rollup_key({"tpot_ms": 25.0, "ttft_ms": 200.0})
    assert ua.rollup_key({}) != ua.rollup_key({"ttft_ms": 200})
    plain, with_segments = ua.rollup_key({"ttft_ms": 200}), ua.rollup_key({"ttft_ms": 200}, segments=True)
    assert plain != with_segments  # turning a breakdown on makes every unit's rows stale
    assert not ua.key_keeps_segments(plain) and ua.key_keeps_segments(with_segments)
    with pytest.raises(ValueError, match="slos.accuracy"):
        ua.rollup_key({"accuracy": 0.9})
