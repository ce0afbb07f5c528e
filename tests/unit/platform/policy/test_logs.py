"""Reading logged requests from events: the rules both OPE faces share."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ablab.platform.policy.logs import requests_from_table
from ablab.platform.stats.spec import parse_spec

SPEC = parse_spec({
    "key": "e", "control": "a", "start": "2026-01-01T00:00:00+00:00",
    "variants": [
        {"key": "a", "weight": 1},
        {"key": "r", "weight": 3, "strategy": {"policy": {
            "kind": "rule", "arms": {"x": {}, "y": {}}, "default": "x",
            "rules": [{"when": {"attr.plan": {"eq": "pro"}}, "arm": "y"}]}}},
    ],
})


def _inf(trace: str, variant: str, unit: str, **kw) -> dict:
    return {"type": "inference", "ts": "2026-01-02T00:00:00Z", "trace_id": trace, "experiment": "e",
            "variant": variant, "unit_id": unit, "e2e_ms": 100.0, "prompt_tokens": 10, **kw}


def test_actions_propensities_labels_and_features() -> None:
    rows = [
        _inf("t1", "a", "u1", dims={"plan": "pro"}, measures={"max_tokens": 64.0}),
        _inf("t1", "a", "u1", ts="2026-01-02T00:00:01Z"),  # a duplicate delivery: the earlier one counts
        _inf("t2", "a", "u2", propensity=0.2),  # a fixed variant's logged propensity wins over the weights
        _inf("t3", "r", "u3", arm="y", propensity=0.9, policy_version="rule:abc", dims={"plan": "pro"}),
        _inf("t4", "r", "u3"),  # a policy request without arm and propensity: left out, counted
        _inf("t5", "a", "u1", ts="2025-12-31T00:00:00Z"),  # before the start
        _inf("t6", "a", "u1", shadow_of="t1"),  # a shadow
        _inf("t7", "zz", "u1"),  # not a variant
        _inf("t8", "a", "u9", experiment="other"),
        {"type": "feedback", "ts": "2026-01-02T00:00:05Z", "trace_id": "t1", "correct": 0},
        {"type": "feedback", "ts": "2026-01-02T00:00:09Z", "trace_id": "t1", "correct": 1},  # the latest label wins
        {"type": "feedback", "ts": "2026-01-02T00:00:01Z", "trace_id": "t3", "correct": 0, "score": 0.5},
    ]
    logs = requests_from_table(pa.Table.from_pylist(rows, schema=_schema(rows)), SPEC,
                               features=["prompt_tokens", "max_tokens", "attr.plan"], sources=["correct"])
    assert logs.actions == ("a", "r.x", "r.y")
    assert logs.n == 3  # t1, t2, t3, ordered by trace id
    assert [logs.actions[i] for i in logs.action] == ["a", "a", "r.y"]
    assert logs.propensity == pytest.approx([0.25, 0.2, 0.75 * 0.9])
    assert np.array_equal(logs.values["correct"], [1.0, np.nan, 0.0], equal_nan=True)
    assert np.array_equal(logs.values["score"], [np.nan, np.nan, 0.5], equal_nan=True)
    assert np.array_equal(logs.features["max_tokens"], [64.0, np.nan, np.nan], equal_nan=True)
    assert list(logs.features["attr.plan"]) == ["pro", None, "pro"]
    assert list(logs.policy_version) == ["", "", "rule:abc"]
    assert len(set(logs.unit.tolist())) == 3
    assert any("1 duplicate" in n for n in logs.notes) and any("1 requests of a policy variant" in n for n in logs.notes)


def _schema(rows: list[dict]) -> pa.Schema:
    """Every key of every row (``from_pylist`` infers the schema from the first row only)."""
    fields: dict[str, pa.DataType] = {}
    for row in rows:
        for k, v in row.items():
            if k not in fields:
                fields[k] = pa.array([v]).type
    return pa.schema(list(fields.items()))
