"""Charts carry titles and axis labels, and the data behind them is right."""

from __future__ import annotations

import pytest

from ablab.dashboards import charts
from ablab.platform.stats.attribution import attribution_results
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab_testing.dashboard_seed import FACTORIAL_VARIANTS


@pytest.fixture(scope="module")
def attribution() -> dict:
    events = synthetic_events(n_requests=6000, n_units=600, variants=FACTORIAL_VARIANTS, experiment="f", seed=5)
    spec = parse_spec(spec_dict(FACTORIAL_VARIANTS, key="f"))
    _, agg = analyze_events(events, spec)
    return attribution_results(spec=spec, stats=agg.stats).model_dump(mode="json")


def test_pareto_frame_and_chart(attribution):
    frame = charts.pareto_frame(attribution)
    assert set(frame["variant"]) == set(FACTORIAL_VARIANTS)
    on = set(frame[frame["frontier"] == "on the frontier"]["variant"])
    assert on == {p["variant"] for p in attribution["pareto"]["points"] if p["on_frontier"]}
    spec = charts.pareto_chart(attribution).to_dict()
    assert "Pareto" in str(spec["title"])
    text = str(spec)
    assert "latency (ms)" in text and "Accuracy (%)" in text and "Cost per 1k requests" in text


def test_waterfall_ends_at_the_total(attribution):
    shapley = attribution["factorial"]["e2e_ms"]["shapley"]
    frame = charts.waterfall_frame(shapley)
    factors = frame[frame["kind"] == "factor"]
    assert factors["end"].iloc[-1] == pytest.approx(shapley["total"]["estimate"])
    assert frame[frame["kind"] == "total"]["end"].iloc[0] == pytest.approx(shapley["total"]["estimate"])
    assert "Shapley" in str(charts.waterfall_chart(shapley, "e2e_ms").to_dict()["title"])


def test_timeseries_frame_scales_percent():
    series = {"metric": "accuracy", "series": [{"variant": "a", "points": [
        {"ts": "2026-12-01T00:00:00", "n": 10, "value": 0.8, "ci": [0.7, 0.9], "cumulative": {"n": 10, "value": 0.8, "ci": [0.7, 0.9]}}]}]}
    frame = charts.timeseries_frame(series, cumulative=True)
    assert frame["value"].iloc[0] == pytest.approx(80.0)
    assert "Accuracy (%)" in str(charts.timeseries_chart(series).to_dict())
