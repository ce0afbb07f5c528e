"""Number formats and the results table built from real engine output."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from ablab.dashboards import format as fmt
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events


@pytest.fixture(scope="module")
def result() -> dict:
    variants = {"control": VariantEffect(weight=0.5), "fast": VariantEffect(weight=0.5, latency=0.6, cost=0.5)}
    events = synthetic_events(n_requests=4000, n_units=400, variants=variants, experiment="e", seed=3)
    spec = parse_spec(spec_dict(variants, key="e", guardrails=[{"metric": "ttft_ms_p95", "max": 800}]))
    return analyze_events(events, spec)[0].model_dump(mode="json")


@pytest.mark.parametrize(("value", "text"), [(412.4, "412 ms"), (12.34, "12.3 ms"), (15_300, "15.3 s"), (None, "—"), (float("nan"), "—")])
def test_ms(value, text):
    assert fmt.fmt_ms(value) == text


def test_money_and_percent_and_p():
    assert fmt.fmt_usd(0.000123) == "$0.123 / 1k"
    assert fmt.fmt_usd(1.5) == "$1.5000"
    assert fmt.fmt_pct(0.1234) == "12.3%"
    assert fmt.fmt_pct(-0.05, signed=True) == "-5.0%"
    assert fmt.fmt_p(0.0001) == "< 0.001"
    assert fmt.fmt_p(0.04321) == "0.043"
    assert fmt.fmt_value("accuracy", -0.012, signed=True) == "-1.20%"
    assert fmt.fmt_value("e2e_ms", 25.0, signed=True) == "+25.0 ms"


def test_verdict_uses_adjusted_p_and_direction():
    row = {"method": "delta", "abs_diff": -10.0, "p_value": 0.01, "p_value_adjusted": 0.2, "lower_is_better": True}
    assert fmt.verdict(row, 0.05) == "flat"
    assert fmt.verdict({**row, "p_value_adjusted": 0.01}, 0.05) == "better"
    assert fmt.verdict({**row, "p_value_adjusted": 0.01, "lower_is_better": False}, 0.05) == "worse"
    assert fmt.verdict({"method": "control"}, 0.05) == "control"


def test_results_table_from_engine_output(result):
    table = fmt.results_table(result)
    assert list(table.columns) == ["Metric", "Variant", "n", "Estimate", "Relative (95% CI)", "p (adj.)", "Verdict"]
    assert table["Metric"].iloc[0] == "Latency (mean)"  # the headline metric first
    fast = table[(table["Metric"] == "Latency (mean)") & (table["Variant"] == "fast")].iloc[0]
    assert fast["Verdict"] == "🟢 better"  # 40 % faster on 4 000 requests is unmistakable
    row = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] == "fast")
    lo, hi = row["rel_ci"]
    assert fast["Relative (95% CI)"] == f"{row['rel_diff'] * 100:+.1f}% [{lo * 100:+.1f}, {hi * 100:+.1f}]"
    control = table[table["Variant"] == "control"]
    assert set(control["Relative (95% CI)"]) == {"—"} and set(control["Verdict"]) == {"control"}


def test_variant_details_split_into_its_numbers_and_the_comparison(result):
    numbers, comparison = fmt.variant_table(result, "fast")
    assert list(numbers.columns) == ["Metric", "n", "Estimate", "95% CI", "Control"]
    assert list(comparison.columns) == ["Metric", "Difference", "Relative (95% CI)", "p (adj.)", "Verdict"]
    latency = comparison[comparison["Metric"] == "Latency (mean)"].iloc[0]
    assert latency["Difference"].startswith("-") and latency["Difference"].endswith("ms")
    own = numbers[numbers["Metric"] == "Latency (mean)"].iloc[0]
    control_row = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] == "control")
    assert own["Control"] == fmt.fmt_value("e2e_ms", control_row["estimate"])
    numbers, comparison = fmt.variant_table(result, "control")
    assert comparison.empty and not numbers.empty  # the control is compared with nothing


def test_csv_has_raw_numbers(result):
    frame = pd.read_csv(io.StringIO(fmt.results_csv(result)))
    assert len(frame) == len(result["metrics"])
    row = frame[(frame.metric == "e2e_ms") & (frame.variant == "fast")].iloc[0]
    source = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] == "fast")
    assert row.estimate == pytest.approx(source["estimate"])
    assert row.ci_lo == pytest.approx(source["ci"][0])


def test_guardrail_table(result):
    table = fmt.guardrail_table(result)
    assert set(table["Variant"]) == {"control", "fast"}
    assert set(table["Kind"]) == {"SLA"}
    assert table["Threshold"].iloc[0] == "800 ms"
    assert "Why" not in table.columns  # the long reasons are listed under the table
    assert all(" · TTFT p95: " in line for line in fmt.guardrail_reasons(result))


def test_experiments_table_empty_keeps_columns():
    assert list(fmt.experiments_table([]).columns)[:4] == ["Key", "Name", "Status", "Owner"]
