"""The Custom metrics view: each metric the experiment defines (``metrics.custom``) with its
definition in words beside its numbers per variant."""

from __future__ import annotations

from typing import Any

import streamlit as st

from ablab.dashboards.format import VERDICT_HELP, custom_definition, custom_metric_table, md_escape
from ablab.dashboards.views import tables

# The table's column (5/7 of a bordered box) is about 545 px wide at a 1,280 px window.
COLUMN_BUDGET_PX = 530


def render(exp: dict[str, Any], result: Any) -> None:
    defined = list(((exp.get("metrics") or {}).get("custom")) or [])
    mde = ((exp.get("metrics") or {}).get("mde")) or {}
    st.subheader("Custom metrics")
    if not defined:
        st.info("This experiment defines no custom metrics. Add them under **metrics → custom** on the settings page "
                "(a mean, proportion, ratio or quantile of any measured field, `measures.*` included).", icon="📐")
        return
    st.caption("Each metric as the experiment defines it (metrics.custom), beside its numbers; the same rows are in the "
               "overview's table and the CSV.")
    for metric in defined:
        name = str(metric.get("name"))
        rows = [r for r in result.get("metrics", []) if r["metric"] == name]
        resolved = next((r.get("lower_is_better") for r in rows if r.get("lower_is_better") is not None), None)
        with st.container(border=True):
            left, right = st.columns([2, 5])
            left.markdown(f"**{md_escape(name)}**")
            left.markdown("\n".join(f"- {md_escape(field)}: {md_escape(text)}"
                                    for field, text in custom_definition(metric, mde=mde.get(name), lower_is_better=resolved)))
            with right:
                if not rows:
                    st.caption("No numbers yet for this metric (its source has no values in this experiment's events).")
                else:
                    tables.show(custom_metric_table(result, name), key=f"cm_{name}", flex=("Variant",),
                                budget=COLUMN_BUDGET_PX, help={"Verdict": VERDICT_HELP})
