"""The registry and the spec read a custom metric with the same closed model per type:
what the API validated reaches the engine as is, and is stored as its author wrote it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablab.platform.registry.schemas import ExperimentCreate, Metrics
from ablab.platform.stats.custom_metric import MeanMetric, QuantileMetric, RatioMetric
from ablab.platform.stats.spec import parse_spec

CUSTOM = [
    {"name": "judge", "type": "mean", "column": "score", "cuped": {"covariate": "pre_period"}},
    {"name": "cpk", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
    {"name": "steps_p90", "type": "quantile", "column": "measures.steps", "quantile": 0.9, "direction": "lower"},
]


def test_the_registry_holds_the_stats_models_discriminated_by_type() -> None:
    metrics = Metrics.model_validate({"primary": ["judge"], "custom": CUSTOM})
    judge, cpk, steps = metrics.custom
    assert isinstance(judge, MeanMetric) and isinstance(cpk, RatioMetric) and isinstance(steps, QuantileMetric)
    assert judge.cuped is not None and judge.cuped.covariate == "pre_period" and cpk.scale == 1000
    # stored as written: the defaults (aggregation, lower_is_better…) stay implicit
    assert metrics.model_dump(mode="json")["custom"] == CUSTOM
    # the spec reads the same objects: one definition each, the direction resolved
    spec = parse_spec({"key": "k", "variants": [{"key": "a"}, {"key": "b"}],
                       "metrics": {"primary": ["judge"], "custom": metrics.custom}})
    assert list(metrics.custom) == list(spec.custom)
    by = {m.name: m for m in spec.custom}
    assert not by["judge"].lower_is_better and by["cpk"].lower_is_better and by["steps_p90"].lower_is_better
    assert by["judge"].covariate == "pre_period" and by["cpk"].scale == 1000.0 and by["cpk"].column is None
    assert by["steps_p90"].sources == ("measures.steps",) and by["steps_p90"].covariate is None


@pytest.mark.parametrize(("metric", "says"), [
    ({"name": "x", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "column": "e2e_ms"},
     "metrics.custom[0].column: a ratio takes numerator and denominator, not column"),
    ({"name": "x", "type": "mean", "column": "score", "quantile": 0.5}, "metrics.custom[0].quantile: only type quantile"),
    ({"name": "x", "type": "quantile", "column": "e2e_ms", "quantile": 0.5, "cuped": {"covariate": "pre_period"}},
     "metrics.custom[0].cuped: CUPED adjusts means and ratios"),
    ({"name": "x", "type": "median", "column": "score"}, "metrics.custom[0].type: must be one of"),
    ({"name": "x", "column": "score"}, "metrics.custom[0].type: required"),
    ({"name": "e2e_ms", "type": "mean", "column": "e2e_ms"}, "metrics.custom[0].name: 'e2e_ms' is a built-in"),
])
def test_a_bad_metric_is_refused_with_its_field_named(metric: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ExperimentCreate.model_validate({
            "key": "k", "name": "k", "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}], "metrics": {"custom": [metric]},
        })
    errors = caught.value.errors()
    assert errors[0]["loc"] == ("metrics", "custom") and says in errors[0]["msg"], errors
