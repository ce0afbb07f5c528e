"""The dashboard client parses results into the API's typed models; every table and chart
the views build from them is the same as from the JSON they came from."""

from __future__ import annotations

import httpx
import numpy as np
import pandas as pd
import pytest

from ablab.dashboards import charts
from ablab.dashboards import format as fmt
from ablab.dashboards.client import ApiClient
from ablab.platform.analytics.schemas import Attribution, MetricRow, Results, Timeseries
from ablab.platform.stats.aggregates import OPTIONAL_COLUMNS, variant_stats_from_units
from ablab.platform.stats.attribution import attribute
from ablab.platform.stats.engine import analyze, json_ready
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.spec import parse_spec

CELLS = {"c00": {"f1": 0, "f2": 0}, "c10": {"f1": 1, "f2": 0}, "c01": {"f1": 0, "f2": 1}, "c11": {"f1": 1, "f2": 1}}
SPEC = parse_spec({
    "key": "f", "unit": "user", "control": "c00",
    "variants": [{"key": k, "weight": 0.25, "strategy": {}} for k in CELLS],
    "guardrails": [{"metric": "ttft_ms_p95", "max": 800}, {"metric": "error_rate", "max": 0.9}],
})


@pytest.fixture(scope="module")
def stats() -> dict:
    rng = np.random.default_rng(11)
    n = 800
    variant = np.array(list(CELLS) * (n // len(CELLS)))
    units = {"variant": variant}
    shift = np.array([1.0 + 0.3 * CELLS[v]["f1"] - 0.2 * CELLS[v]["f2"] for v in variant])
    for column in UNIT_COLUMNS:
        if column not in OPTIONAL_COLUMNS:
            units[column] = rng.uniform(1.0, 3.0, n) * shift
    return variant_stats_from_units(units)


@pytest.fixture(scope="module")
def result(stats) -> dict:
    return analyze(spec=SPEC, stats=stats)


@pytest.fixture(scope="module")
def attribution(stats) -> dict:
    return attribute(spec=SPEC, stats=stats, levels=CELLS)


def _served(payload: dict) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=payload)

    return ApiClient("http://api.test", "t", transport=httpx.MockTransport(handler))


def test_the_client_returns_typed_results(result) -> None:
    typed = _served(result).results("f")
    assert isinstance(typed, Results) and all(isinstance(r, MetricRow) for r in typed.metrics)
    assert typed.control == "c00" and typed.rows("e2e_ms")[1].p_value == result["metrics"][
        [i for i, r in enumerate(result["metrics"]) if r["metric"] == "e2e_ms"][1]]["p_value"]


def test_tables_from_typed_results_equal_those_from_json(result) -> None:
    typed = _served(result).results("f")
    pd.testing.assert_frame_equal(fmt.results_table(typed), fmt.results_table(result))
    assert fmt.results_csv(typed) == fmt.results_csv(result)
    pd.testing.assert_frame_equal(fmt.guardrail_table(typed), fmt.guardrail_table(result))
    metrics = ("e2e_ms", "ttft_ms", "e2e_ms_p95")
    assert charts.estimates_chart(typed, metrics).to_dict() == charts.estimates_chart(result, metrics).to_dict()
    assert dict(typed.srm) == {k: v for k, v in dict(typed.srm).items()} and typed["srm"]["p_value"] == result["srm"]["p_value"]


def test_charts_from_typed_attribution_and_series_equal_those_from_json(attribution) -> None:
    typed = _served(attribution).attribution("f")
    assert isinstance(typed, Attribution)
    pd.testing.assert_frame_equal(charts.pareto_frame(typed), charts.pareto_frame(attribution))
    shapley = attribution["factorial"]["e2e_ms"]["shapley"]
    assert shapley and shapley["shares"]
    pd.testing.assert_frame_equal(charts.waterfall_frame(typed["factorial"]["e2e_ms"]["shapley"]), charts.waterfall_frame(shapley))

    series = json_ready({"experiment": "f", "metric": "accuracy", "window_s": 10, "series": [{"variant": "a", "points": [
        {"ts": "2026-12-01T00:00:00", "late": 0, "n": 10, "value": 0.8, "ci": [0.7, 0.9],
         "cumulative": {"n": 10, "value": 0.8, "ci": [0.7, 0.9]}}]}]})
    typed_series = _served(series).timeseries("f", metric="accuracy")
    assert isinstance(typed_series, Timeseries)
    for cumulative in (True, False):
        pd.testing.assert_frame_equal(charts.timeseries_frame(typed_series, cumulative=cumulative),
                                      charts.timeseries_frame(series, cumulative=cumulative))
