"""The Segments view: per dimension (``metrics.segments``), the heterogeneity test's flags,
each segment's effect on one metric (forest plot and table; a click on a row opens that
segment), and one segment's effects on every metric."""

from __future__ import annotations

from typing import Any

import streamlit as st

from ablab.dashboards import charts
from ablab.dashboards.format import (
    heterogeneity_table,
    md_escape,
    metric_label,
    ordered_metrics,
    segment_detail_table,
    segment_values_table,
)
from ablab.dashboards.views import tables
from ablab.dashboards.views.nav import open_view


def render(exp: dict[str, Any], result: Any, dimension: str | None, value: str | None) -> None:
    key = exp["key"]
    segments = {str(s.get("dimension")): s for s in result.get("segments") or []}
    if not segments:
        configured = ((exp.get("metrics") or {}).get("segments")) or []
        if configured:
            st.info("No segment rows yet: segments appear once events carry the dimensions "
                    f"{', '.join(md_escape(d) for d in configured)}.", icon="🧩")
        else:
            st.info("This experiment is not sliced by segments. Add dimensions under **metrics → segments** on the "
                    "settings page (e.g. `dims.domain`); events carry them in `dims`.", icon="🧩")
        return
    names = list(segments)
    if dimension is not None and dimension not in segments:
        st.error(f"This experiment has no segment dimension “{md_escape(dimension[:100])}”.", icon="🔎")
        dimension, value = None, None
    dimension = dimension or names[0]
    if len(names) > 1:
        chosen = st.selectbox("Dimension", names, index=names.index(dimension), key="seg_dimension")
        if chosen != dimension:
            open_view(key, "segments", dim=chosen)
    segment = segments[dimension]
    values = list(dict.fromkeys(str(r.get("value")) for r in segment.get("rows") or []))
    if value is not None and value not in values:
        st.error(f"No segment “{md_escape(value[:100])}” in {md_escape(dimension)}.", icon="🔎")
        value = None
    if value is None:
        _dimension(key, dimension, segment)
    else:
        _value(key, dimension, segment, value)


def _flags(dimension: str, segment: Any) -> None:
    flagged = [h for h in segment.get("heterogeneity") or [] if h.get("flagged")]
    if flagged:
        names = ", ".join(f"{md_escape(metric_label(str(h.get('metric'))))} ({md_escape(h.get('variant'))})" for h in flagged)
        st.warning(f"🚩 The effect differs by {md_escape(dimension)}: {names}. Read the per-segment effects before "
                   "shipping one result everywhere.")
    else:
        st.success(f"No effect differs significantly by {md_escape(dimension)} (heterogeneity test).", icon="✅")


def _dimension(key: str, dimension: str, segment: Any) -> None:
    st.subheader(f"Segments by {md_escape(dimension)}")
    st.caption("Effects per segment, p-values corrected across segments; the heterogeneity test (Cochran's Q) flags a "
               "treatment whose effect differs between segments. Values: the top 20 by requests, then (other) and (none).")
    _flags(dimension, segment)
    het = heterogeneity_table(segment)
    if not het.empty:
        tables.show(het, key="seg_het")
    metrics = ordered_metrics(list(dict.fromkeys(str(r.get("metric")) for r in segment.get("rows") or [])))
    if not metrics:
        return
    flagged = [str(h.get("metric")) for h in segment.get("heterogeneity") or [] if h.get("flagged")]
    default = metrics.index(flagged[0]) if flagged and flagged[0] in metrics else 0
    metric = st.selectbox("Metric", metrics, index=default, key=f"seg_metric_{dimension}", format_func=metric_label)
    st.altair_chart(charts.segment_chart(segment, metric), width="stretch")
    st.caption("Click a row to see that segment on every metric.")
    table = segment_values_table(segment, metric)
    picked = tables.show(table, key=f"seg_values_{dimension}", open_rows=True, flex=("Segment",))
    if picked is not None and picked < len(table):
        open_view(key, "segments", dim=dimension, value=str(table.loc[picked, "Segment"]))


def _value(key: str, dimension: str, segment: Any, value: str) -> None:
    if st.button(f"← All segments by {dimension}", key="seg_back"):
        open_view(key, "segments", dim=dimension)
    st.subheader(f"{md_escape(dimension)} = {md_escape(value)}")
    flagged = [h for h in segment.get("heterogeneity") or [] if h.get("flagged")]
    if flagged:
        st.caption("🚩 flagged across this dimension: " + ", ".join(
            f"{md_escape(metric_label(str(h.get('metric'))))} ({md_escape(h.get('variant'))})" for h in flagged))
    tables.show(segment_detail_table(segment, value), key="seg_detail", flex=("Metric",))
