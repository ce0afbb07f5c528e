"""Results at a glance: decisions, SRM, guardrails, the per-variant table (custom metrics
included), CUPED, power, segments, live windows, latency distributions, the Pareto
trade-off and the factor attribution."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards import charts
from ablab.dashboards.client import ApiError
from ablab.dashboards.format import (
    DECISION_BADGES, STATUS_BADGES, cuped_table, fmt_count, fmt_p, fmt_pct, fmt_value, guardrail_table, md_escape,
    metric_label, power_table, results_csv, results_table, segment_tables,
)
from ablab.dashboards.views.common import Context, goto, show_api_error

SERIES_METRICS = ("e2e_ms", "ttft_ms", "tpot_ms", "accuracy", "cost_usd", "error_rate", "e2e_ms_p95", "ttft_ms_p95")
DISTRIBUTION_METRICS = ("e2e_ms_p50", "e2e_ms_p95", "e2e_ms_p99")
REFRESH_S = 10


def _fetch(fn: Any, *args: Any, **kw: Any) -> tuple[Any, ApiError | None]:
    try:
        return fn(*args, **kw), None
    except ApiError as exc:
        return None, exc


def _has_data(result: dict[str, Any]) -> bool:
    return any((r.get("n") or 0) > 0 for r in result.get("metrics", []))


def render(ctx: Context, key: str | None) -> None:
    if not key:
        st.info("Pick an experiment on the Experiments page to see its results.")
        return
    exp, err = _fetch(ctx.client.get_experiment, key)
    if err:
        show_api_error(err, what=f"load experiment {md_escape(key)}")
        return
    st.title(f"Results: {md_escape(exp['name'])}")
    archived = " · 🗄️ archived" if exp.get("archived_at") else ""
    st.caption(f"{md_escape(exp['key'])} · {STATUS_BADGES.get(exp['status'], md_escape(exp['status']))}{archived} · "
               f"control {md_escape(exp['control'])} · unit {md_escape(exp['unit'])} · traffic {fmt_pct(exp['traffic'], digits=0)}")
    if st.button("⚙️ Experiment settings", key="res_settings"):
        goto("edit", key)
    result, err = _fetch(ctx.client.results, key)
    if err:
        if err.status == 503:
            st.warning(f"Results are not available from this API: {md_escape(err.detail)}", icon="🛠️")
        else:
            show_api_error(err, what="load results")
        return
    if not _has_data(result):
        hint = "Start it on the settings page" if exp["status"] == "draft" else "Events appear within a few seconds of arriving"
        st.info(f"No events for this experiment yet. {hint}; inference services send events through the SDK or `POST /v1/events`.", icon="⏳")
        return
    _banners(result)
    _decisions(result)
    _table(result, key)
    _guardrails(result)
    _cuped(result)
    _power(result)
    _segments(result)
    _live(ctx, key)
    _distributions(ctx, key, result)
    _attribution(ctx, key)


def _banners(result: dict[str, Any]) -> None:
    srm = result.get("srm") or {}
    if srm.get("flagged"):
        obs = ", ".join(f"{k}: {fmt_count(v)}" for k, v in (srm.get("observed") or {}).items())
        exp = ", ".join(f"{k}: {fmt_count(v)}" for k, v in (srm.get("expected") or {}).items())
        st.error(f"**Sample ratio mismatch** (p = {fmt_p(srm.get('p_value'))}): units per variant are not what the weights "
                 f"promise (observed {obs}; expected {exp}). Results are not trustworthy until the split is fixed.", icon="🚨")
    else:
        st.success(f"Traffic split is healthy (SRM check p = {fmt_p(srm.get('p_value'))}).", icon="✅")
    cov = result.get("coverage") or {}
    if cov.get("flagged"):
        st.warning(f"Label coverage differs between variants (p = {fmt_p(cov.get('p_value'))}): accuracy may be biased.", icon="🏷️")
    inf = result.get("inference") or {}
    method = "always-valid (mSPRT) p-values: safe to look any time" if inf.get("sequential") else "fixed-horizon test"
    st.caption(f"α = {result.get('alpha')}, {method}; multiple-comparison correction: {inf.get('correction', 'holm')}.")


def _decisions(result: dict[str, Any]) -> None:
    decisions = result.get("decisions") or []
    if not decisions:
        return
    cols = st.columns(len(decisions))
    for col, d in zip(cols, decisions):
        with col.container(border=True):
            st.markdown(f"**{md_escape(d['variant'])}** vs control")
            st.markdown(f"### {DECISION_BADGES.get(d['decision'], d['decision'])}")
            for reason in d.get("reasons", [])[:4]:
                st.caption(md_escape(reason))


def _table(result: dict[str, Any], key: str) -> None:
    st.subheader("Per-variant results")
    table = results_table(result)
    metric_names = list(dict.fromkeys(table["Metric"]))
    shown = st.multiselect("Metrics", metric_names, default=metric_names[:7], key="res_metrics")
    st.dataframe(table[table["Metric"].isin(shown)], hide_index=True, width="stretch")
    st.download_button("⬇️ Download CSV", results_csv(result), file_name=f"{key}-results.csv", mime="text/csv", key="res_csv")
    cov = (result.get("coverage") or {}).get("by_variant") or {}
    if cov:
        st.caption("Label coverage: " + " · ".join(f"{v}: {fmt_pct(c.get('coverage'))} of {fmt_count(c.get('requests'))} requests labeled"
                                                   for v, c in cov.items()))
    st.altair_chart(charts.estimates_chart(result, ("e2e_ms", "e2e_ms_p95", "ttft_ms", "ttft_ms_p95")), width="content")


def _cuped(result: dict[str, Any]) -> None:
    table = cuped_table(result)
    if table.empty:
        return
    st.subheader("Variance reduction (CUPED)")
    st.caption("Each adjusted comparison beside the unadjusted one; θ is the covariate's regression weight, "
               "the variance reduction how much narrower the adjustment made the interval's variance.")
    st.dataframe(table, hide_index=True, width="stretch")
    st.altair_chart(charts.cuped_chart(result), width="stretch")


def _power(result: dict[str, Any]) -> None:
    table = power_table(result)
    if table.empty:
        return
    st.subheader("Power: how long until a decision")
    st.caption("Randomization units needed per variant to detect the metric's minimum detectable effect "
               "(set per metric under analysis.mde; 5 % by default), and the time the current traffic takes to get there.")
    st.dataframe(table, hide_index=True, width="stretch")


def _segments(result: dict[str, Any]) -> None:
    segments = result.get("segments") or []
    if not segments:
        return
    st.subheader("Segments")
    st.caption("Effects per segment, p-values corrected across segments; 🚩 marks a treatment whose effect "
               "differs between segments (heterogeneity test).")
    tables = segment_tables(result)
    tabs = st.tabs([md_escape(dimension) for dimension, _, _ in tables])
    for tab, seg, (dimension, rows, het) in zip(tabs, segments, tables):
        with tab:
            flagged = [h for h in seg.get("heterogeneity") or [] if h.get("flagged")]
            if flagged:
                names = ", ".join(f"{md_escape(metric_label(str(h.get('metric'))))} ({md_escape(h.get('variant'))})" for h in flagged)
                st.warning(f"The effect differs by {md_escape(dimension)}: {names}.", icon="🚩")
            metrics = list(dict.fromkeys(str(r.get("metric")) for r in seg.get("rows") or []))
            if metrics:
                metric = st.selectbox("Metric", metrics, key=f"res_seg_{dimension}", format_func=metric_label)
                st.altair_chart(charts.segment_chart(seg, metric), width="stretch")
            st.dataframe(rows, hide_index=True, width="stretch")
            if not het.empty:
                st.dataframe(het, hide_index=True, width="stretch")


def _guardrails(result: dict[str, Any]) -> None:
    st.subheader("Guardrails")
    table = guardrail_table(result)
    if table.empty:
        st.info("No guardrails configured. Add SLA bounds (e.g. TTFT p95 ≤ 800 ms) on the settings page.")
        return
    breaches = (table["Status"] == "🔴 breach").sum()
    if breaches:
        st.error(f"{breaches} guardrail breach{'es' if breaches > 1 else ''}.", icon="🚧")
    st.dataframe(table, hide_index=True, width="stretch")


def _live(ctx: Context, key: str) -> None:
    st.subheader("Live: 10-second windows")
    c1, c2, c3 = st.columns([2, 1, 1])
    metric = c1.selectbox("Metric", SERIES_METRICS, key="res_series_metric", format_func=metric_label)
    cumulative = c2.toggle("Running total", value=True, key="res_cumulative", help="Off: each window on its own.")
    auto = c3.toggle(f"Auto-refresh ({REFRESH_S} s)", value=True, key="res_auto")

    def draw() -> None:
        series, err = _fetch(ctx.client.timeseries, key, metric=metric)
        if err:
            st.warning(f"No window series: {md_escape(err.detail)}")
            return
        if not any(s.get("points") for s in series.get("series", [])):
            st.info("No 10 s windows yet: the stream job writes one per variant every 10 seconds once events flow.")
            return
        if metric.endswith(("_p95", "_p99", "_p50")) and cumulative:
            st.caption("Window percentiles do not merge, so this shows each window's own value.")
        st.altair_chart(charts.timeseries_chart(series, cumulative=cumulative), width="stretch")
        last = max((p["ts"] for s in series["series"] for p in s["points"]), default=None)
        st.caption(f"Latest window: {last} UTC")

    if auto:
        st.fragment(draw, run_every=REFRESH_S)()
    else:
        draw()


def _distributions(ctx: Context, key: str, result: dict[str, Any]) -> None:
    st.subheader("Latency distributions")
    frames = {}
    for metric in DISTRIBUTION_METRICS:
        series, err = _fetch(ctx.client.timeseries, key, metric=metric)
        if series and any(s.get("points") for s in series.get("series", [])):
            frames[metric] = series
    if frames:
        st.altair_chart(charts.latency_distribution_chart(frames), width="content")
    rows = {r["variant"]: r for r in result.get("metrics", []) if r["metric"] == "e2e_ms_p95"}
    if rows:
        st.caption("Whole-experiment p95: " + " · ".join(f"{v}: {fmt_value('e2e_ms_p95', r.get('estimate'))}" for v, r in rows.items()))
    elif not frames:
        st.info("No latency windows yet.")


def _attribution(ctx: Context, key: str) -> None:
    st.subheader("Trade-offs and attribution")
    att, err = _fetch(ctx.client.attribution, key)
    if err:
        st.warning(f"No attribution: {md_escape(err.detail)}")
        return
    st.altair_chart(charts.pareto_chart(att), width="stretch")
    frame = charts.pareto_frame(att)
    on = frame[frame["frontier"] == "on the frontier"]["variant"].tolist()
    st.caption(f"On the frontier (no variant is at once faster, cheaper and more accurate): {', '.join(on) or '—'}.")
    factorial = att.get("factorial") or {}
    usable = {m: f for m, f in factorial.items() if f.get("effects")}
    if not usable:
        st.info("Factor attribution needs a factorial design: variants that differ in more than one strategy factor "
                "(e.g. compression × precision), each combination as its own variant.")
        return
    metric = st.selectbox("Attribute which metric", list(usable), key="res_attr_metric", format_func=metric_label)
    f = usable[metric]
    shapley = f.get("shapley")
    if shapley and shapley.get("shares"):
        st.altair_chart(charts.waterfall_chart(shapley, metric), width="stretch")
        total = shapley.get("total") or {}
        st.caption(f"Best variant `{shapley['best_variant']}`: total change {fmt_value(metric, total.get('estimate'), signed=True)}; "
                   "the factor shares add up to it exactly.")
    effects = pd.DataFrame([{
        "Term": e["term"], "Kind": "main effect" if e["order"] == 1 else f"{e['order']}-way interaction",
        "Effect": fmt_value(metric, e.get("estimate"), signed=True),
        "95% CI": f"[{fmt_value(metric, (e.get('ci') or [None, None])[0], signed=True)}, {fmt_value(metric, (e.get('ci') or [None, None])[1], signed=True)}]",
        "p-value": fmt_p(e.get("p_value")),
    } for e in f["effects"]])
    st.markdown("**Factor effects and interactions** (vs the control's levels; an interaction is the departure from adding the main effects)")
    st.dataframe(effects, hide_index=True, width="stretch")
