"""The editor's custom-metric table and segments, and the results view's CUPED, power and
segment sections, on the results shape of docs/contracts.md ("Analysis output").

The result below is written out by hand in that shape (the engine that produces it is
tested in tests/unit/platform/stats); these tests check what the dashboard makes of each
field, and that absent fields (an older API) are tolerated."""

from __future__ import annotations

import pytest

from ablab.dashboards import charts, forms
from ablab.dashboards import format as fmt

CUSTOM = [
    {"name": "judge_score", "type": "mean", "column": "score"},
    {"name": "e2e_per_user", "type": "mean", "column": "e2e_ms", "aggregation": "unit_mean",
     "lower_is_better": True, "cuped": {"covariate": "pre_period"}},
    {"name": "cost_per_1k_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000.0},
    {"name": "ttft_p90", "type": "quantile", "column": "ttft_ms", "quantile": 0.9},
]


def test_custom_metrics_round_trip_through_the_editor_table() -> None:
    rows = forms.custom_rows(CUSTOM)
    assert [r["name"] for r in rows] == [m["name"] for m in CUSTOM]
    assert set(rows[0]) == set(forms.CUSTOM_COLUMNS)
    assert rows[1]["cuped"] == "pre_period"
    assert forms.custom_from_rows(rows) == CUSTOM


def test_an_edited_table_becomes_metrics_custom() -> None:
    rows = forms.custom_rows(CUSTOM)
    rows[0]["column"] = "  measures.tool_calls "  # edit
    del rows[2]  # remove
    rows.append({"name": "thumbs", "type": "proportion", "column": "correct", "aggregation": None,
                 "scale": float("nan"), "quantile": None, "lower_is_better": None, "cuped": "  "})  # add
    rows.append({"name": "", "type": "mean"})  # a half-typed new row is ignored
    custom = forms.custom_from_rows(rows)
    assert [m["name"] for m in custom] == ["judge_score", "e2e_per_user", "ttft_p90", "thumbs"]
    assert custom[0]["column"] == "measures.tool_calls"
    assert custom[3] == {"name": "thumbs", "type": "proportion", "column": "correct"}


def test_segments_and_api_errors_under_a_field() -> None:
    assert forms.parse_segments(" dims.domain, dims.length,\ndims.domain ,") == ["dims.domain", "dims.length"]
    errors = {"metrics.custom.1.column": "unknown source 'e2e'", "metrics.custom": "duplicate name", "metrics.primary": "x"}
    assert forms.errors_under(errors, "metrics.custom") == ["metrics.custom.1.column: unknown source 'e2e'", "duplicate name"]


@pytest.fixture
def result() -> dict:
    unadjusted = {"abs_diff": -12.0, "abs_ci": [-30.0, 6.0], "rel_diff": -0.03, "rel_ci": [-0.075, 0.015], "p_value": 0.19}
    return {
        "alpha": 0.05,
        "metrics": [
            {"metric": "e2e_per_user", "variant": "control", "method": "control", "n": 500, "estimate": 400.0,
             "custom": True, "type": "mean", "aggregation": "unit_mean"},
            {"metric": "e2e_per_user", "variant": "fast", "method": "welch", "n": 510, "estimate": 388.0,
             "abs_diff": -12.0, "rel_diff": -0.03, "rel_ci": [-0.05, -0.01], "p_value": 0.003, "custom": True,
             "type": "mean", "aggregation": "unit_mean", "lower_is_better": True,
             "cuped": {"covariate": "pre_period", "theta": 0.82, "variance_reduction": 0.64, "unadjusted": unadjusted},
             "power": {"mde_rel": 0.05, "n_needed": 2040, "n": 510, "seconds_to_decision": 5400.0}},
            {"metric": "judge_score", "variant": "fast", "method": "welch", "n": 510, "estimate": 0.7, "custom": True,
             "power": {"mde_rel": 0.02, "n_needed": 400, "n": 510, "seconds_to_decision": 0}},
            {"metric": "e2e_ms", "variant": "fast", "method": "delta", "n": 510, "estimate": 380.0},
        ],
        "segments": [{
            "dimension": "dims.domain",
            "rows": [
                {"value": "code", "metric": "judge_score", "variant": "fast", "n": 200, "estimate": 0.8, "abs_diff": 0.1,
                 "rel_diff": 0.14, "rel_ci": [0.05, 0.23], "p_value": 0.001, "p_value_adjusted": 0.002},
                {"value": "[chat](javascript:x)", "metric": "judge_score", "variant": "fast", "n": 310, "estimate": 0.65,
                 "abs_diff": -0.01, "rel_diff": -0.015, "rel_ci": [-0.08, 0.05], "p_value": 0.6, "p_value_adjusted": 0.6},
            ],
            "heterogeneity": [{"metric": "judge_score", "variant": "fast", "q": 9.1, "df": 1, "p_value": 0.0026, "flagged": True}],
        }],
    }


def test_cuped_shows_theta_reduction_and_the_unadjusted_comparison(result: dict) -> None:
    table = fmt.cuped_table(result)
    assert len(table) == 1
    row = table.iloc[0]
    assert (row["Covariate"], row["θ (theta)"], row["Variance reduction"]) == ("pre_period", "0.82", "64.0%")
    assert row["Adjusted"].startswith("-3.0%") and row["Unadjusted"].startswith("-3.0%")
    assert row["Adjusted p"] != row["Unadjusted p"]
    frame = charts.cuped_frame(result)
    assert list(frame["comparison"]) == ["CUPED-adjusted", "unadjusted"]
    assert frame["hi"].iloc[1] - frame["lo"].iloc[1] > frame["hi"].iloc[0] - frame["lo"].iloc[0]
    assert charts.cuped_chart(result).to_dict()["title"]


def test_power_shows_units_needed_and_time_to_decision(result: dict) -> None:
    table = fmt.power_table(result).set_index("Metric")
    assert table.loc["e2e_per_user", "Needed"] == "2,040"
    assert table.loc["e2e_per_user", "Progress"] == "25%"
    assert table.loc["e2e_per_user", "Time to decision"] == "1.5 h"
    assert table.loc["judge_score", "Time to decision"] == "now"
    assert fmt.fmt_duration(None) == "—" and fmt.fmt_duration(90) == "1.5 min"


def test_segments_show_effects_and_flag_heterogeneity(result: dict) -> None:
    [(dimension, rows, het)] = fmt.segment_tables(result)
    assert dimension == "dims.domain"
    assert list(rows["Segment"]) == ["code", "[chat](javascript:x)"]
    assert list(het["Effect differs by segment"]) == ["🚩 yes"]
    frame = charts.segment_frame(result["segments"][0], "judge_score")
    assert frame["rel"].round(6).tolist() == [14.0, -1.5]
    spec = charts.segment_chart(result["segments"][0], "judge_score").to_dict()
    assert "judge_score by dims.domain" in spec["title"]


def test_results_table_marks_custom_metrics(result: dict) -> None:
    table = fmt.results_table(result)
    assert "e2e_per_user (custom)" in set(table["Metric"])
    assert "Latency (mean)" in set(table["Metric"])


def test_an_older_result_without_the_new_fields_shows_nothing_new() -> None:
    old = {"alpha": 0.05, "metrics": [{"metric": "e2e_ms", "variant": "fast", "n": 3, "estimate": 1.0}]}
    assert fmt.cuped_table(old).empty and fmt.power_table(old).empty and fmt.segment_tables(old) == []
    assert charts.cuped_frame(old).empty


def test_the_sections_render_real_engine_output() -> None:
    """The engine's own output (CUPED on a pre-period, power, a segment breakdown with a
    planted heterogeneous effect) goes through every new table and chart."""
    import numpy as np

    from ablab.platform.stats.aggregates import variant_stats_from_units
    from ablab.platform.stats.custom_metric import custom_columns
    from ablab.platform.stats.engine import analyze_results
    from ablab.platform.stats.metrics import UNIT_COLUMNS
    from ablab.platform.stats.spec import parse_spec

    spec = parse_spec({
        "key": "k", "variants": [{"key": "control"}, {"key": "treat"}],
        "metrics": {"custom": [{"name": "judge", "type": "mean", "column": "score", "aggregation": "unit_mean",
                                "cuped": {"covariate": "pre_period"}}],
                    "primary": ["judge"], "report": ["judge"], "segments": ["dims.domain"]},
        "analysis": {"sequential": False},
    })
    cols = custom_columns(spec.custom[0])
    rng = np.random.default_rng(11)

    def units(n: int, lift: float) -> dict:
        out = {"variant": np.array(["control"] * n + ["treat"] * n), **{c: np.zeros(2 * n) for c in UNIT_COLUMNS}}
        y = (rng.poisson(3, 2 * n) + 1).astype(float)
        base = rng.normal(10, 2, 2 * n)
        mean = base + np.r_[np.zeros(n), np.full(n, 10 * lift)] + rng.normal(0, 0.5, 2 * n)
        out[cols["x"]], out[cols["y"]] = mean * y, y
        out[cols["pre_x"]], out[cols["pre_y"]] = base * y, y
        return out

    segments = {"dims.domain": {v: variant_stats_from_units(units(400, lift), custom=spec.custom)
                                for v, lift in {"code": 0.2, "chat": 0.0, "math": 0.0}.items()}}
    stats = variant_stats_from_units(units(1200, 0.05), custom=spec.custom)
    result = analyze_results(spec=spec, stats=stats, segments=segments).model_dump(mode="json")

    cuped = fmt.cuped_table(result)
    assert len(cuped) == 1 and cuped.iloc[0]["Covariate"] == "pre_period"
    assert cuped.iloc[0]["Variance reduction"] not in ("—", "0.0%")
    assert not fmt.power_table(result).empty
    [(dimension, rows, het)] = fmt.segment_tables(result)
    assert dimension == "dims.domain" and set(rows["Segment"]) == {"code", "chat", "math"}
    assert list(het["Effect differs by segment"]) == ["🚩 yes"]
    assert charts.segment_chart(result["segments"][0], "judge").to_dict()
    assert charts.cuped_chart(result).to_dict()
