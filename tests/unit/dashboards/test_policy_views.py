"""The policy variant's per-arm view and the policy editor's widgets (issue 33 item 6): the
tables and charts read from the results' and the attribution's ``policies`` (and nothing shown
without them), then the editor run by Streamlit's AppTest: a variant switched to a policy makes
the strategy the registry validates, and a refusal shows under the field it names."""

from __future__ import annotations

import copy
from typing import Any

from streamlit.testing.v1 import AppTest

from ablab.dashboards import charts
from ablab.dashboards.views import policies

POLICY: dict[str, Any] = {
    "variant": "router", "kind": "slo_router", "requests": 4000, "units": 400, "model_version": "a1b2c3d4e5f60718",
    "exploring": False, "objective": "accuracy",
    "slo": [{"metric": "ttft_ms_p95", "field": "ttft_ms", "quantile": 0.95, "bound": 400.0, "observed": 352.0,
             "ci": [331.0, 377.0], "compliance": 0.962, "met": True},
            {"metric": "e2e_ms", "field": "e2e_ms", "quantile": None, "bound": 900.0, "observed": 950.0,
             "ci": [910.0, 990.0], "compliance": 0.7, "met": False}],
    "arms": [{"arm": "fast", "requests": 1000, "share": 0.25, "share_ci": [0.22, 0.28], "mean_propensity": 0.31,
              "slo_compliance": 0.99, "metrics": [{"metric": "accuracy", "n": 990, "estimate": 0.55, "ci": [0.52, 0.58]},
                                                  {"metric": "ttft_ms", "n": 1000, "estimate": 61.0, "ci": [59.0, 63.0]}]},
             {"arm": "expert", "requests": 3000, "share": 0.75, "share_ci": [0.72, 0.78], "mean_propensity": 0.9,
              "slo_compliance": 0.95, "metrics": [{"metric": "accuracy", "n": 2950, "estimate": 0.8, "ci": [0.78, 0.82]}]}],
    "notes": ["12 requests without arm were left out"],
}
CREDIT: dict[str, Any] = {
    "variant": "router", "metric": "accuracy", "baseline": "control", "gain": {"estimate": 0.05, "ci": [0.02, 0.08]},
    "arms": [{"arm": "fast", "share": 0.25, "mean": 0.55, "contribution": -0.01, "ci": [-0.02, 0.0]},
             {"arm": "expert", "share": 0.75, "mean": 0.8, "contribution": 0.06, "ci": [0.04, 0.08]}],
    "routing": {"estimate": 0.02, "ci": [0.0, 0.04]},
    "features": [{"feature": "prompt_tokens", "credit": 0.005, "ci": [-0.01, 0.02]},
                 {"feature": "attr.plan", "credit": 0.015, "ci": [0.0, 0.03]}],
    "notes": ["credit by Shapley over features"],
}


def test_nothing_is_read_where_the_field_is_absent_or_malformed() -> None:
    assert policies.entries({"metrics": []}) == []
    assert policies.entries({"policies": None}) == [] and policies.entries({"policies": {"router": 1}}) == []
    assert policies.entries(None) == []
    assert policies.entries({"policies": [POLICY, "junk"]}) == [POLICY]
    assert policies.credits_of({"policies": [CREDIT, {**CREDIT, "variant": "other"}]}, "router") == [CREDIT]


def test_slo_rows_compare_the_observed_statistic_with_its_bound() -> None:
    rows = policies.slo_table(POLICY).to_dict("records")
    assert rows[0] == {"SLO": "ttft_ms_p95", "Latency": rows[0]["Latency"], "Bound": "≤ 400 ms", "Observed": "352 ms",
                       "95% CI": "[331 ms, 377 ms]", "Within bound": "96.2%", "Status": "🟢 met"}
    assert rows[0]["Latency"].endswith(" p95") and rows[1]["Latency"].endswith(" mean")
    assert rows[1]["Status"] == "🔴 unmet"
    assert policies.slo_table({**POLICY, "slo": [{**POLICY["slo"][0], "met": None}]})["Status"].tolist() == ["🟡 not enough data"]


def test_the_arm_tables_give_shares_and_each_metric_per_arm() -> None:
    table = policies.arm_table(POLICY)
    assert list(table["Arm"]) == ["fast", "expert"]
    fast = table.to_dict("records")[0]
    assert fast == {"Arm": "fast", "Requests": "1,000", "Share": "25.0%", "Share 95% CI": "[22.0%, 28.0%]",
                    "Mean propensity": "0.310", "SLO compliance": "99.0%"}
    metrics = policies.arm_metric_table(POLICY)
    assert [(r["Arm"], r["n"], r["Estimate"], r["95% CI"]) for r in metrics.to_dict("records")][:2] == [
        ("fast", "990", "55.0%", "[52.0%, 58.0%]"), ("expert", "2,950", "80.0%", "[78.0%, 82.0%]")]  # accuracy's arms together
    assert len(metrics) == 3 and metrics["Arm"].iloc[2] == "fast"  # expert reports no TTFT: no row


def test_the_share_chart_reads_percentages_with_intervals() -> None:
    frame = charts.arm_share_frame(POLICY).round(9)
    assert frame[["arm", "share", "lo", "hi"]].to_dict("records") == [
        {"arm": "fast", "share": 25.0, "lo": 22.0, "hi": 28.0}, {"arm": "expert", "share": 75.0, "lo": 72.0, "hi": 78.0}]
    spec = charts.arm_share_chart(POLICY).to_dict()
    assert "Arm shares of router" in str(spec["title"])


def test_the_credit_waterfall_ends_at_the_gain() -> None:
    frame = charts.credit_frame(CREDIT)
    assert list(frame["step"]) == ["arm fast", "arm expert", "gain"]  # routing is another difference: no step
    parts = frame[frame["kind"] == "part"]
    assert abs(parts["contribution"].sum() - 5.0) < 1e-9  # percentage points: -1 + 6
    assert abs(parts["end"].iloc[-1] - frame[frame["kind"] == "gain"]["end"].iloc[0]) < 1e-9
    # parts that do not add up: the rest is its own step, so the bars still end at the gain
    short = charts.credit_frame({**CREDIT, "gain": {"estimate": 0.07, "ci": [0.0, 0.1]}})
    rest = short[short["kind"] == "rest"]
    assert len(rest) == 1 and abs(rest["contribution"].iloc[0] - 2.0) < 1e-9
    assert list(policies.credit_table(CREDIT)["Contribution"]) == ["-1.00%", "+6.00%"]
    assert list(policies.feature_table(CREDIT)["Feature"]) == ["prompt_tokens", "attr.plan"]
    assert len(charts.feature_credit_frame(CREDIT)) == 2


def _section(result, attribution):  # unannotated: AppTest runs its source alone
    from ablab.dashboards.views import policies

    policies.render(result, attribution)


def test_the_section_shows_shares_slo_arms_and_credit() -> None:
    at = AppTest.from_function(_section, args=({"policies": [POLICY]}, {"policies": [CREDIT]}), default_timeout=30).run()
    assert not at.exception, at.exception
    assert [h.value for h in at.subheader] == ["Policy variants: per-arm view"]
    text = " ".join(str(m.value) for m in at.markdown)
    assert "SLO compliance" in text and "1 unmet" in text and "add up to it" in text and "**Routing**" in text
    assert len(at.dataframe) == 5  # SLO, per arm, per arm and metric, credit, features
    assert list(at.dataframe[1].value["Arm"]) == ["fast", "expert"]
    assert not at.info  # a fitted model: not exploring
    assert any("12 requests without arm" in str(c.value) for c in at.caption)


def test_an_exploring_policy_says_so_and_a_result_without_policies_shows_nothing() -> None:
    exploring = {**copy.deepcopy(POLICY), "exploring": True, "model_version": "uniform:abc"}
    at = AppTest.from_function(_section, args=({"policies": [exploring]}, None), default_timeout=30).run()
    assert "exploring uniformly: no model yet" in at.info[0].value
    assert len(at.dataframe) == 3  # no attribution: no credit
    at = AppTest.from_function(_section, args=({"metrics": []}, {"pareto": {}}), default_timeout=30).run()
    assert not at.subheader and not at.dataframe and not at.exception


def _editor(strategy, errors):  # unannotated: AppTest runs its source alone
    import streamlit as st

    from ablab.dashboards import forms
    from ablab.dashboards.views.policy_editor import variant_strategy

    st.session_state["out"] = variant_strategy("v1", strategy, forms.strategy_factors(), errors, "variants.1.strategy",
                                               custom=[{"name": "solved", "type": "proportion", "column": "correct"}],
                                               disabled=False)


def test_switching_a_variant_to_a_policy_builds_it_from_the_widgets() -> None:
    at = AppTest.from_function(_editor, args=({"precision": "int8"}, {}), default_timeout=30).run()
    assert at.session_state["out"] == {"precision": "int8"}
    at.radio(key="v1_mode").set_value("policy").run()
    assert not at.exception, at.exception
    at.text_input(key="v1_pol_arm0_name").input("fast")
    at.text_input(key="v1_pol_arm1_name").input("expert")
    at.selectbox(key="v1_pol_arm1_precision").select("int8")
    at.text_input(key="v1_pol_attrs").input("plan")
    at.number_input(key="v1_pol_slo0_max").set_value(400.0)
    at.selectbox(key="v1_pol_slo0_latency").select("ttft_ms")
    assert "solved (custom)" in at.selectbox(key="v1_pol_objective").options
    at.number_input(key="v1_pol_explore").set_value(0.1).run()
    policy = at.session_state["out"]["policy"]
    assert policy == {"kind": "slo_router", "arms": {"fast": {}, "expert": {"precision": "int8"}},
                      "features": ["prompt_tokens", "attr.plan"], "slo": {"ttft_ms_p95": 400.0}, "objective": "accuracy",
                      "explore": 0.1}
    at.selectbox(key="v1_pol_kind").select("rule").run()
    at.text_input(key="v1_pol_rule0_c0_value").input("800")
    at.selectbox(key="v1_pol_rule0_arm").select("fast")
    at.selectbox(key="v1_pol_default").select("expert").run()
    policy = at.session_state["out"]["policy"]
    assert policy == {"kind": "rule", "arms": {"fast": {}, "expert": {"precision": "int8"}},
                      "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "fast"}], "default": "expert",
                      "explore": 0.1}  # the floor typed for the router stays the rule's


def test_a_stored_policy_opens_in_its_widgets_and_refusals_sit_under_them() -> None:
    stored = {"policy": {"kind": "slo_router", "arms": {"fast": {}, "expert": {"precision": "int8"}},
                         "features": ["prompt_tokens"], "slo": {"e2e_ms": 900.0}, "objective": "solved", "explore": 0.6}}
    errors = {"variants.1.strategy.policy.explore": "variants.1.strategy.policy.explore: 0.6 × 2 arms exceeds 1",
              "variants.1.strategy.policy.arms.expert": "variants.1.strategy.policy.arms.expert: precision: bad level"}
    at = AppTest.from_function(_editor, args=(stored, errors), default_timeout=30).run()
    assert not at.exception, at.exception
    assert at.radio(key="v1_mode").value == "policy"
    assert at.session_state["out"] == stored  # nothing touched: the same strategy
    assert at.selectbox(key="v1_pol_slo0_q").value == "mean" and at.selectbox(key="v1_pol_objective").value == "solved"
    shown = [str(e.value) for e in at.error]
    assert sorted(shown) == ["0\\.6 × 2 arms exceeds 1", "precision\\: bad level"]  # each once: the arm's in its tab
