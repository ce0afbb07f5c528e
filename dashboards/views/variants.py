"""The Variants view: every variant in one table (a click opens it), and one variant's
details: its strategy beside the control's, its decision and reasons, every metric with
its interval and the absolute difference, its guardrails."""

from __future__ import annotations

from typing import Any

import streamlit as st

from ablab.dashboards.format import (
    DECISION_BADGES,
    VERDICT_HELP,
    fmt_pct,
    guardrail_reasons,
    guardrail_table,
    md_escape,
    strategy_table,
    variant_table,
    variants_table,
)
from ablab.dashboards.views import policies, tables
from ablab.dashboards.views.common import Context, call
from ablab.dashboards.views.nav import open_view


def render(ctx: Context, exp: dict[str, Any], result: Any, variant: str | None) -> None:
    keys = [v["key"] for v in exp.get("variants") or []]
    if variant is not None and variant not in keys:
        st.error(f"This experiment has no variant “{md_escape(variant[:100])}”; pick one below.", icon="🔎")
        variant = None
    if variant is None:
        _all(exp, result)
    else:
        _one(ctx, exp, result, variant)


def _all(exp: dict[str, Any], result: Any) -> None:
    st.subheader("Variants")
    st.caption("Click a row for the variant's details.")
    table = variants_table(exp, result)
    picked = tables.show(table, key="var_table", open_rows=True, flex=("Strategy",))
    if picked is not None and picked < len(table):
        open_view(exp["key"], "variants", variant=exp["variants"][picked]["key"])


def _one(ctx: Context, exp: dict[str, Any], result: Any, variant: str) -> None:
    key = exp["key"]
    spec = next(v for v in exp["variants"] if v["key"] == variant)
    is_control = variant == exp.get("control")
    if st.button("← All variants", key="var_back"):
        open_view(key, "variants")
    st.subheader(f"Variant {md_escape(variant)}" + (" (control)" if is_control else ""))
    total = sum(float(v.get("weight") or 0) for v in exp["variants"]) or 1.0
    paused = f" · ⏸ paused: {md_escape(spec.get('paused_reason') or 'no reason given')}" if spec.get("paused") else ""
    st.caption(f"{fmt_pct(float(spec.get('weight') or 0) / total, digits=0)} of the experiment's traffic{paused}")
    decision = next((d for d in result.get("decisions") or [] if d["variant"] == variant), None)
    if decision:
        st.markdown(f"**Decision:** {DECISION_BADGES.get(decision['decision'], md_escape(decision['decision']))}")
        for reason in decision.get("reasons", []):
            st.caption(md_escape(reason))
    st.markdown("**Strategy** (the factors it sets away from the defaults, beside the control's level)")
    strategy = strategy_table(exp, variant)
    if strategy.empty:
        st.caption("The runtime's defaults: no factor set.")
    else:
        tables.show(strategy, key="var_strategy", flex=("This variant", "Control"))
    numbers, comparison = variant_table(result, variant)
    st.markdown("**Every metric**: its estimate and 95% interval" + ("" if is_control else ", beside the control's"))
    tables.show(numbers.drop(columns=["Control"]) if is_control else numbers, key="var_numbers", flex=("Metric",))
    if not comparison.empty:
        st.markdown("**Against the control**: the difference, its interval and the adjusted p-value")
        tables.show(comparison, key="var_comparison", flex=("Metric",), help={"Verdict": VERDICT_HELP})
    if any(p.get("variant") == variant for p in policies.entries(result)):
        attribution = call(ctx.client.attribution, key, what="load the policy's credit")
        policies.render(result, attribution, only=variant)
    guards = guardrail_table(result)
    if not guards.empty:
        mine = guards[guards["Variant"] == variant].drop(columns=["Variant"])
        if not mine.empty:
            st.markdown("**Guardrails**")
            tables.show(mine.reset_index(drop=True), key="var_guardrails")
            for line in guardrail_reasons(result, variant=variant):
                st.caption(md_escape(line))
