"""The shadows section's pure formatting (issue 34): the paired table (Δ, CI, p-values,
verdict), the coverage table and its warnings, from the JSON as written and as the client
hands it on after checking it against the model."""

from __future__ import annotations

import sys

import pytest

from ablab.dashboards.views.shadows import (
    coverage_notes,
    coverage_table,
    paired_table,
    render_shadows,
    shadow_verdict,
)
from ablab.platform.analytics.schemas import Results

COVERAGE = {"requests": 1000, "chosen": 200, "sent": 150, "dropped": 50, "shadowed": 140, "failed": 7, "orphaned": 2}


def _row(metric: str, **kw) -> dict:
    row = {"variant": "t", "metric": metric, "n_pairs": 133, "primary_mean": 412.0, "shadow_mean": 498.5,
           "mean_diff": 86.5, "sd_diff": 40.0, "ci": [79.6, 93.4], "p_value": 1e-9, "p_value_adjusted": 2e-9,
           "sign_p_value": 3e-7, "wilcoxon_p_value": 1e-8, "method": "paired_t", "lower_is_better": True,
           "custom": False, "type": "mean", "coverage": COVERAGE}
    row.update(kw)
    return row


RESULT = {
    "experiment": "x", "control": "c", "unit": "user", "alpha": 0.05,
    "shadows": [
        _row("e2e_ms"),
        _row("accuracy", n_pairs=90, primary_mean=0.61, shadow_mean=0.7, mean_diff=0.09, ci=[-0.02, 0.2],
             p_value=0.11, p_value_adjusted=0.22, sign_p_value=None, wilcoxon_p_value=None, lower_is_better=False,
             type="proportion"),
        _row("cost_usd", n_pairs=133, primary_mean=0.002, shadow_mean=0.0012, mean_diff=-0.0008, ci=[-0.0009, -0.0007],
             p_value=1e-5, p_value_adjusted=1e-5, sign_p_value=None, wilcoxon_p_value=None),
        _row("score", n_pairs=1, mean_diff=0.5, ci=[None, None], p_value=None, p_value_adjusted=None,
             sign_p_value=None, wilcoxon_p_value=None, lower_is_better=False),
    ],
}


@pytest.mark.parametrize("result", [RESULT, Results.model_validate(RESULT).model_dump(mode="json")], ids=["json", "checked"])
def test_paired_table_shows_delta_interval_p_values_and_verdict(result):
    table = paired_table(result)
    assert list(table.columns) == ["Variant", "Metric", "Pairs", "Primary", "Shadow", "Δ shadow − primary", "95% CI",
                                   "p (paired t)", "p adj.", "p sign", "p Wilcoxon", "Verdict"]
    e2e, acc, cost, score = (table.iloc[i].to_dict() for i in range(4))
    assert (e2e["Pairs"], e2e["Primary"], e2e["Shadow"], e2e["Δ shadow − primary"]) == ("133", "412 ms", "498 ms", "+86.5 ms")
    assert e2e["95% CI"] == "[+79.6 ms, +93.4 ms]"
    assert (e2e["p (paired t)"], e2e["p sign"], e2e["p Wilcoxon"], e2e["Verdict"]) == ("< 0.001", "< 0.001", "< 0.001",
                                                                                        "🔴 shadow worse")
    assert (acc["Δ shadow − primary"], acc["95% CI"], acc["p adj."], acc["p sign"]) == ("+9.00%", "[-2.00%, +20.00%]",
                                                                                        "0.220", "")
    assert acc["Verdict"] == "⚪ no difference"
    assert cost["Verdict"] == "🟢 shadow better" and cost["Δ shadow − primary"].startswith("−$")
    assert (score["95% CI"], score["p (paired t)"], score["Verdict"]) == ("—", "—", "… too few pairs")


def test_coverage_table_and_notes():
    table = coverage_table(RESULT)
    assert table.to_dict("records") == [{
        "Variant": "t", "Requests": "1,000", "Chosen": "200", "Sent": "150", "Dropped (cap full)": "50",
        "Got a shadow": "140", "Failed": "7", "Orphaned": "2", "Shadowed share of chosen": "70.0%",
    }]
    notes = coverage_notes(RESULT)
    assert notes == [
        "t: 50 of 200 chosen requests (25.0%) had their shadow dropped: the shadow cap was full.",
        "t: 7 of 140 shadows failed; latency, token and cost differences leave them out, the error rate counts them.",
        "t: 10 shadows were sent but none of their events has arrived.",
        "t: 2 shadow events name a primary request not (yet) loaded.",
    ]
    hostile = {"shadows": [_row("e2e_ms", variant="[x](http://e.example)", coverage={**COVERAGE, "failed": 0})]}
    assert "](" not in coverage_notes(hostile)[0]  # a variant key is shown as text


def test_verdict_follows_the_metric_direction():
    assert shadow_verdict(_row("e2e_ms", mean_diff=-5.0), 0.05) == "better"
    assert shadow_verdict(_row("accuracy", mean_diff=-0.1, lower_is_better=False), 0.05) == "worse"
    assert shadow_verdict(_row("e2e_ms", p_value_adjusted=0.3), 0.05) == "flat"
    assert shadow_verdict(_row("e2e_ms", n_pairs=1), 0.05) == "no data"


def test_no_shadows_draws_nothing():
    before = "streamlit" in sys.modules
    render_shadows(None, {"experiment": "x", "metrics": []})
    render_shadows(None, Results.model_validate({"experiment": "x", "control": "c", "unit": "user", "alpha": 0.05}))
    assert ("streamlit" in sys.modules) == before  # returned before drawing anything
    assert paired_table({"shadows": []}).empty and coverage_table({}).empty
