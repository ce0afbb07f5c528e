"""Experiment-defined metrics over real HTTP: the registry takes `metrics.custom`,
`metrics.segments` and `metrics.mde` in the contract's shape, refuses what the stats engine
could not analyze with the field named, and lets a guardrail or the primary metric name a
custom metric."""

from __future__ import annotations

import uuid

import pytest

from ablab_testing.metrics import CONTRACT_CUSTOM_METRICS

pytestmark = pytest.mark.integration

CUSTOM = CONTRACT_CUSTOM_METRICS


def _body(key: str, metrics: dict, **extra) -> dict:
    return {"key": key, "name": key, "traffic": 1.0, "control": "a", "metrics": metrics,
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}], **extra}


def test_custom_metrics_segments_and_mde_are_stored_and_used(api_server) -> None:
    key = f"cm-{uuid.uuid4().hex[:8]}"
    metrics = {"primary": ["judge_score"], "custom": CUSTOM, "segments": ["dims.domain"], "mde": {"judge_score": 0.02}}
    with api_server.client("editor") as c:
        created = c.post("/v1/experiments", json=_body(
            key, metrics, guardrails=[{"metric": "cost_per_1k_out", "margin": 0.1, "relative": True}]))
        assert created.status_code == 201, created.text
        stored = c.get(f"/v1/experiments/{key}").json()
    assert stored["metrics"]["custom"] == [{**m} for m in CUSTOM]
    assert stored["metrics"]["segments"] == ["dims.domain"] and stored["metrics"]["mde"] == {"judge_score": 0.02}
    assert stored["guardrails"][0]["metric"] == "cost_per_1k_out"


@pytest.mark.parametrize(("metrics", "guardrails", "field", "says"), [
    ({"custom": [{"name": "x", "type": "mean", "column": "nonsense"}]}, [], "metrics.custom.0.column", "unknown source"),
    ({"custom": [{"name": "e2e_ms", "type": "mean", "column": "e2e_ms"}]}, [], "metrics.custom.0.name", "e2e_ms"),
    ({"primary": ["not_defined"]}, [], "metrics", "primary: unknown metric 'not_defined'"),
    ({"segments": ["domain"]}, [], "metrics.segments.0", "dims."),
    ({"mde": {"judge": 0.1}}, [], "metrics.mde.judge", "unknown metric"),
    ({}, [{"metric": "judge_score", "max": 1}], "guardrails.0.metric", "judge_score"),
])
def test_what_the_engine_cannot_analyze_is_refused_with_the_field_named(api_server, metrics, guardrails, field, says) -> None:
    key = f"cm-{uuid.uuid4().hex[:8]}"
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=_body(key, metrics, guardrails=guardrails))
        assert c.get(f"/v1/experiments/{key}").status_code == 404  # nothing was created
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and says in r.json()["detail"], r.text
