"""The dashboard client checks results, time series and attribution against the API's models
and hands the views the JSON: the same document the API served (a round trip through the
model changes nothing), so every table and chart is the one the JSON gives; a response that
is not the contract's shape is refused at the client."""

from __future__ import annotations

import httpx
import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from ablab.dashboards import charts
from ablab.dashboards import format as fmt
from ablab.dashboards.client import ApiClient
from ablab.platform.analytics.schemas import Results, Timeseries
from ablab.platform.stats.aggregates import OPTIONAL_COLUMNS, variant_stats_from_units
from ablab.platform.stats.attribution import attribution_results
from ablab.platform.stats.engine import analyze_results, json_ready
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
    return analyze_results(spec=SPEC, stats=stats).model_dump(mode="json")


@pytest.fixture(scope="module")
def attribution(stats) -> dict:
    return attribution_results(spec=SPEC, stats=stats, levels=CELLS).model_dump(mode="json")


def _served(payload: dict) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=payload)

    return ApiClient("http://api.test", "t", transport=httpx.MockTransport(handler))


def test_the_client_hands_on_the_json_it_checked(result) -> None:
    got = _served(result).results("f")
    assert type(got) is dict and got == Results.model_validate(result).model_dump(mode="json")
    assert got == json_ready(result)  # the served document, unchanged by the check
    assert fmt.results_csv(got) == fmt.results_csv(result)
    pd.testing.assert_frame_equal(fmt.guardrail_table(got), fmt.guardrail_table(result))
    metrics = ("e2e_ms", "ttft_ms", "e2e_ms_p95")
    assert charts.estimates_chart(got, metrics).to_dict() == charts.estimates_chart(result, metrics).to_dict()


def test_a_response_off_the_contract_is_refused(result) -> None:
    with pytest.raises(ValidationError, match="extra"):
        _served({**result, "surprise": 1}).results("f")
    row = {**result["metrics"][0], "p_value": "low"}
    with pytest.raises(ValidationError):
        _served({**result, "metrics": [row]}).results("f")


def test_attribution_and_series_come_back_as_served(attribution) -> None:
    got = _served(attribution).attribution("f")
    assert type(got) is dict and got == attribution
    pd.testing.assert_frame_equal(charts.pareto_frame(got), charts.pareto_frame(attribution))
    shapley = attribution["factorial"]["e2e_ms"]["shapley"]
    assert shapley and shapley["shares"]
    pd.testing.assert_frame_equal(charts.waterfall_frame(got["factorial"]["e2e_ms"]["shapley"]), charts.waterfall_frame(shapley))

    series = json_ready({"experiment": "f", "metric": "accuracy", "window_s": 10, "series": [{"variant": "a", "points": [
        {"ts": "2026-12-01T00:00:00", "late": 0, "n": 10, "value": 0.8, "ci": [0.7, 0.9],
         "cumulative": {"n": 10, "value": 0.8, "ci": [0.7, 0.9]}}]}]})
    got_series = _served(series).timeseries("f", metric="accuracy")
    assert got_series == Timeseries.model_validate(series).model_dump(mode="json")
    for cumulative in (True, False):
        pd.testing.assert_frame_equal(charts.timeseries_frame(got_series, cumulative=cumulative),
                                      charts.timeseries_frame(series, cumulative=cumulative))
