"""The typed shapes of results, time series and attribution read what the engine builds,
keep every value, and are closed: a field they do not declare is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from pydantic import ValidationError

from ablab.platform.analytics.schemas import Attribution, MetricRow, Results, Timeseries
from ablab.platform.stats.aggregates import OPTIONAL_COLUMNS, variant_stats_from_units
from ablab.platform.stats.attribution import attribution_results
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.timeseries import timeseries

SPEC = parse_spec({
    "key": "exp", "unit": "user", "control": "a",
    "variants": [
        {"key": "a", "weight": 0.5, "strategy": {}},
        {"key": "b", "weight": 0.5, "strategy": {"precision": "int8"}},
    ],
    "guardrails": [{"metric": "error_rate", "max": 0.5}],
})


def _stats() -> dict:
    rng = np.random.default_rng(3)
    n = 400
    units = {"variant": np.array(["a", "b"] * (n // 2))}
    for column in UNIT_COLUMNS:
        if column not in OPTIONAL_COLUMNS:
            units[column] = rng.uniform(1.0, 3.0, n)
    return variant_stats_from_units(units)


def _same(model_dump: object, built: object) -> None:
    """Every value the engine built comes back from the model unchanged."""
    if isinstance(built, dict):
        assert isinstance(model_dump, dict)
        for key, value in built.items():
            _same(model_dump[key], value)
    elif isinstance(built, list):
        assert isinstance(model_dump, list) and len(model_dump) == len(built)
        for a, b in zip(model_dump, built):
            _same(a, b)
    else:
        assert model_dump == built or (isinstance(built, float) and model_dump == pytest.approx(built))


def test_results_read_the_engine_output_and_keep_every_value() -> None:
    built = analyze_results(spec=SPEC, stats=_stats()).model_dump(mode="json")
    results = Results.model_validate(built)
    assert results.experiment == "exp" and results.control == "a"
    assert {r.metric for r in results.metrics} >= {"e2e_ms", "error_rate", "accuracy"}
    row = next(r for r in results.rows("e2e_ms") if r.variant == "b")
    assert row.p_value is not None and row.method and row.abs_ci[0] is not None
    assert results.guardrails and results.guardrails[0].metric == "error_rate"
    assert {d.variant for d in results.decisions} == {"b"}
    _same(results.model_dump(mode="json"), built)


def test_results_accept_the_analysis_additions() -> None:
    built = analyze_results(spec=SPEC, stats=_stats()).model_dump(mode="json")
    row = next(r for r in built["metrics"] if r["variant"] == "b")
    row.update(custom=True, type="ratio", aggregation="unit_mean",
               cuped={"covariate": "pre_period", "theta": 0.4, "variance_reduction": 0.3,
                      "unadjusted": {"abs_diff": 1.0, "abs_ci": [0.1, 1.9], "rel_diff": 0.1, "rel_ci": [0.0, 0.2], "p_value": 0.03}},
               power={"mde_rel": 0.05, "n_needed": 1200, "n": 200, "seconds_to_decision": None})
    built["segments"] = [{"dimension": "dims.domain",
                          "rows": [{"value": "math", "metric": "e2e_ms", "variant": "b", "n": 40, "estimate": 2.0,
                                    "abs_diff": 0.1, "rel_diff": 0.05, "rel_ci": [-0.1, 0.2], "p_value": 0.4,
                                    "p_value_adjusted": 0.8}],
                          "heterogeneity": [{"metric": "e2e_ms", "variant": "b", "q": 1.2, "df": 1, "p_value": 0.27,
                                             "flagged": False}]}]
    results = Results.model_validate(built)
    typed = next(r for r in results.metrics if r.custom)
    assert typed.cuped is not None and typed.cuped.unadjusted is not None and typed.cuped.unadjusted.p_value == 0.03
    assert typed.power is not None and typed.power.n_needed == 1200 and typed.power.seconds_to_decision is None
    assert results.segments[0].rows[0].value == "math" and results.segments[0].heterogeneity[0].q == 1.2
    _same(results.model_dump(mode="json"), built)
    # closed: a field the shapes do not declare is refused, as is a wrong type
    with pytest.raises(ValidationError, match="later"):
        MetricRow.model_validate({"metric": "m", "variant": "v", "later": 1})
    with pytest.raises(ValidationError):
        MetricRow.model_validate({"metric": "m", "variant": "v", "aggregation": "median"})


def test_the_models_are_read_by_attribute_not_as_mappings() -> None:
    # a model is not a dict in disguise: its JSON (model_dump) is the mapping
    row = MetricRow.model_validate({"metric": "e2e_ms", "variant": "b", "p_value": 0.2})
    assert row.p_value == row.model_dump(mode="json")["p_value"] == 0.2
    assert not hasattr(row, "get") and not hasattr(row, "keys")
    with pytest.raises(TypeError):
        row["p_value"]


def test_timeseries_and_attribution_shapes() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [{"variant": v, "window_start": t0 + timedelta(seconds=10 * w), "n": 50, "errors": 1,
             "e2e_sum": 5000.0 + w, "e2e_sumsq": 5000.0 * 110, "labeled": 10, "correct": 8}
            for w in range(3) for v in ("a", "b")]
    built = timeseries(rows, experiment="exp", metric="e2e_ms")
    series = Timeseries.model_validate(built)
    assert series.window_s == 10 and len(series.series) == 2 and series.series[0].points[-1].cumulative is not None
    _same(series.model_dump(mode="json"), built)

    built = attribution_results(spec=SPEC, stats=_stats()).model_dump(mode="json")
    attribution = Attribution.model_validate(built)
    assert {p.variant for p in attribution.pareto.points} == {"a", "b"}
    assert (attribution.pareto.points[0].model_extra or {}).get("e2e_ms") is not None  # the objectives ride as extra fields
    assert attribution.factors["b"]["precision"] == "int8" and attribution.factorial
    _same(attribution.model_dump(mode="json"), built)


def test_the_engine_output_with_custom_metrics_validates_without_extras() -> None:
    # the shapes name every field the engine writes: nothing falls into the open extras
    from ablab.platform.stats.custom_metric import custom_columns

    spec = parse_spec({
        "key": "k", "variants": [{"key": "control", "strategy": {}}, {"key": "big", "strategy": {}}],
        "metrics": {"primary": ["per_user"], "custom": [
            {"name": "per_user", "type": "mean", "column": "e2e_ms", "aggregation": "unit_mean", "cuped": {"covariate": "pre_period"}},
            {"name": "cost_per_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000}]},
        "analysis": {"sequential": False},
    })
    rng = np.random.default_rng(5)
    n = 600
    frame: dict[str, list] = {c: [] for c in UNIT_COLUMNS}
    for m in spec.custom:
        for column in custom_columns(m).values():
            frame[column] = []
    variants = []
    for v in ("control", "big"):
        variants += [v] * n
        y = (rng.poisson(3, n) + 1).astype(float)
        level = rng.normal(900, 150, n)
        for c in UNIT_COLUMNS:
            frame[c].append(y if c == "requests" else np.zeros(n))
        values = {"per_user": {"x": (level + rng.normal(0, 40, n)) * y, "y": y, "pre_x": level * 2, "pre_y": np.full(n, 2.0)},
                  "cost_per_out": {"x": y * rng.gamma(5, 2e-4, n), "y": y * 100}}
        for m in spec.custom:
            for role, column in custom_columns(m).items():
                frame[column].append(np.asarray(values[m.name][role], dtype=float))
    units = {"variant": np.array(variants), **{k: np.concatenate(v) for k, v in frame.items()}}
    built = analyze_results(spec=spec, stats=variant_stats_from_units(units, custom=spec.custom)).model_dump(mode="json")
    results = Results.model_validate(built)
    treated = next(r for r in results.rows("per_user") if r.variant == "big")
    assert treated.custom and treated.aggregation == "unit_mean" and treated.cuped is not None and treated.power is not None
    assert not results.model_extra and not any(r.model_extra for r in results.metrics)
    _same(results.model_dump(mode="json"), built)
