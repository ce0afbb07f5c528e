"""Tables that fit, rows that open, and the results views' tables (segments, custom metrics,
variants), on engine output: what :mod:`ablab.dashboards.views.tables` gives the grid and
what the views' formatters show.

The browser test (tests/browser) checks the drawn tables at 1,280 and 1,920 px; here the
width budget is checked on the estimate the pages use, for the widest content they show."""

from __future__ import annotations

import pandas as pd
import pytest

from ablab.dashboards import format as fmt
from ablab.dashboards.views import live, tables
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab_testing.dashboard_seed import FACTORIAL_VARIANTS, SEGMENTED_METRICS, add_segments

# Canvas measurements (14 px Source Sans, Chromium) of cells these pages draw.
MEASURED = {"Cost per correct answer": 137, "cost_per_1k_out (custom)": 153, "compressed_int8": 101,
            "12,000": 38, "$0.172 / 1k": 63, "-18.2% [-21.3%, -15.0%]": 138, "< 0.001": 41, "🟢 better": 56,
            "⚪ no difference": 97, "Relative (95% CI)": 98, "[1,198 ms, 1,262 ms]": 118, "e2e_ms_p99": 74,
            "Client-side latency (RUM)": 146, "[$0.170 / 1k, $0.175 / 1k]": 140}


@pytest.fixture(scope="module")
def factorial() -> dict:
    events = add_segments(synthetic_events(n_requests=6000, n_units=600, variants=FACTORIAL_VARIANTS, experiment="f", seed=5))
    spec = spec_dict(FACTORIAL_VARIANTS, key="f", metrics={"primary": ["e2e_ms"], **SEGMENTED_METRICS},
                     guardrails=[{"metric": "ttft_ms_p95", "max": 800}, {"metric": "accuracy", "margin": 0.05}])
    events = events.assign(dims=[{"domain": d} if isinstance(d, str) else None for d in events["domain"]],
                           measures=[{"tool_calls": t} if t == t else None for t in events["tool_calls"]])
    return analyze_events(events, parse_spec(spec))[0].model_dump(mode="json")


def test_text_width_estimate_is_never_short_of_the_drawn_width() -> None:
    for text, drawn in MEASURED.items():
        assert drawn <= tables.text_px(text) <= drawn * 1.25, text


def test_numbers_are_right_aligned_and_text_is_not() -> None:
    assert tables.is_numeric(pd.Series(["412 ms", "—", "-3.0% [-5.1, -0.9]", "< 0.001", "$0.17 / 1k", "1,204"]))
    assert tables.is_numeric(pd.Series([1, 2]))
    assert not tables.is_numeric(pd.Series(["control", "412 ms"]))
    assert not tables.is_numeric(pd.Series(["—", "—"]))  # nothing to align


def test_a_table_over_budget_gives_its_free_text_column_what_is_left() -> None:
    frame = pd.DataFrame({"Key": ["k"], "Name": ["x" * 200], "Status": ["🟢 running"]})
    widths = tables.column_widths(frame, flex=("Name",), budget=400)
    assert sum(widths.values()) <= 400 and widths["Name"] >= tables.MIN_FLEX_PX
    assert tables.column_widths(frame, budget=400)["Name"] == tables.MAX_COLUMN_PX  # no flex: as wide as allowed


def _fits(frame: pd.DataFrame, budget: int = tables.BUDGET_PX, flex: tuple[str, ...] = ()) -> None:
    widths = tables.column_widths(frame, flex=flex, budget=budget)
    assert sum(widths.values()) <= budget, widths
    for name in frame.columns:
        if name not in flex:  # nothing shrunk below its widest cell
            assert widths[name] >= max(tables.text_px(v) for v in [name, *frame[name]]), name


def test_every_results_table_fits_the_1280_px_budget(factorial: dict) -> None:
    exp = {"key": "f", "control": "control", "metrics": SEGMENTED_METRICS,
           "variants": [{"key": k, "weight": v.weight, "strategy": dict(v.strategy or {})} for k, v in FACTORIAL_VARIANTS.items()]}
    _fits(fmt.results_table(factorial), flex=("Metric",))
    for variant in FACTORIAL_VARIANTS:
        numbers, comparison = fmt.variant_table(factorial, variant)
        _fits(numbers, flex=("Metric",))
        _fits(comparison, flex=("Metric",))
    _fits(fmt.variants_table(exp, factorial), flex=("Strategy",))
    _fits(fmt.guardrail_table(factorial))
    _fits(fmt.power_table(factorial), flex=("Time to decision",))
    [segment] = factorial["segments"]
    _fits(fmt.heterogeneity_table(segment))
    _fits(fmt.segment_values_table(segment, "e2e_ms"), flex=("Segment",))
    _fits(fmt.segment_detail_table(segment, "code"), flex=("Metric",))
    for name in ("tool_calls", "cost_per_1k_out", "ttft_p90"):
        _fits(fmt.custom_metric_table(factorial, name), budget=530, flex=("Variant",))


def test_segments_flag_the_heterogeneous_effect_and_open_one_value(factorial: dict) -> None:
    [segment] = factorial["segments"]
    het = fmt.heterogeneity_table(segment)
    flagged = het[het["Effect differs"] == "🚩 yes"]
    assert {"int8", "compressed_int8"} <= set(flagged[flagged["Metric"] == "Latency (mean)"]["Variant"])  # INT8 is faster on code
    values = fmt.segment_values_table(segment, "e2e_ms")
    assert set(values["Segment"]) >= {"chat", "code", "math"}
    control = values[values["Variant"] == "control"]
    assert set(control["Relative (95% CI)"]) == {"—"}  # control rows carry the estimate only
    detail = fmt.segment_detail_table(segment, "code")
    assert set(detail["Variant"]) == set(FACTORIAL_VARIANTS) and "Latency (mean)" in set(detail["Metric"])


def test_custom_metric_definitions_in_words() -> None:
    [calls, ratio, quantile] = SEGMENTED_METRICS["custom"]
    assert dict(fmt.custom_definition(calls))["Computes"] == "mean of measures.tool_calls"
    assert dict(fmt.custom_definition(calls))["Direction"] == "higher is better"
    assert dict(fmt.custom_definition(ratio, lower_is_better=True))["Computes"] == "Σ cost_usd ÷ Σ output_tokens × 1000"
    assert dict(fmt.custom_definition(ratio, lower_is_better=True))["Direction"] == "lower is better (its source's default)"
    lines = dict(fmt.custom_definition({**quantile, "cuped": {"covariate": "pre_period"}}, mde=0.02))
    assert (lines["Computes"], lines["CUPED"], lines["MDE"]) == ("p90 of ttft_ms", "adjusted by pre_period", "2.0%")


def test_custom_metric_numbers_beside_the_definition(factorial: dict) -> None:
    table = fmt.custom_metric_table(factorial, "tool_calls")
    assert list(table["Variant"]) == list(FACTORIAL_VARIANTS)
    assert table.iloc[0]["Verdict"] == "control"


def test_variants_table_shows_what_each_strategy_changes(factorial: dict) -> None:
    exp = {"control": "control", "variants": [
        {"key": "control", "weight": 1, "strategy": {}},
        {"key": "int8", "weight": 3, "strategy": {"precision": "int8"}, "paused": True}]}
    table = fmt.variants_table(exp, factorial)
    assert list(table["Strategy"]) == ["baseline", "precision=int8"]
    assert list(table["Weight"]) == ["25%", "75%"]
    assert table["Variant"].iloc[1] == "int8 ⏸ paused"
    strategy = fmt.strategy_table({**exp, "variants": exp["variants"]}, "int8")
    assert strategy.to_dict("records") == [{"Factor": "precision", "This variant": "int8", "Control": "fp32"}]


def test_live_counts_windows_and_names_the_backends() -> None:
    series = {"series": [{"points": [{"ts": "2026-01-01T00:00:00"}, {"ts": "2026-01-01T00:00:10"}]},
                         {"points": [{"ts": "2026-01-01T00:00:10"}]}]}
    assert live.window_count(series) == (2, "2026-01-01T00:00:10")
    exp = {"variants": [{"strategy": {"backend": "smollm2"}}, {"strategy": {"backend": "smollm2"}}, {"strategy": {}}]}
    assert live.named_backends(exp) == ["smollm2"]
    line = live.backend_line("smollm2", {"kind": "llamacpp", "state": "building", "progress": 0.42,
                                         "detail": "building llama-cpp-python: 42% (120/280 compile steps)"})
    assert "**smollm2** (llama.cpp) is not serving yet" in line
    assert "building llama-cpp-python: 42% (120/280 compile steps)" in line.replace("\\", "")  # escaped text
    assert "42% built" in live.backend_line("smollm2", {"kind": "llamacpp", "state": "building", "progress": 0.42})
    assert "serving" in live.backend_line("smollm2", {"kind": "llamacpp", "state": "serving"})
    assert "not one this API knows" in live.backend_line("[x](javascript:y)", None)
    assert "[x](" not in live.backend_line("[x](javascript:y)", None)  # a name is text, never a link
