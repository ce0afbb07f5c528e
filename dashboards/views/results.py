"""An experiment's results: four views of one page (``?page=results&exp=K&view=…``).

- **Overview**: the live parts (when the numbers were computed, the 10 s window count, units
  and decisions per variant, the per-variant table, the window chart) refresh on their own
  at the chosen interval (:mod:`ablab.dashboards.views.live`); below them guardrails, CUPED,
  power, a pointer to flagged segments, latency distributions, the Pareto trade-off and the
  factor attribution. A click on a table row opens that variant's details.
- **Variants** (:mod:`.variants`), **Segments** (:mod:`.segments`) and **Custom metrics**
  (:mod:`.custom_metrics`).

An experiment without events says why it waits (not started; its backend still building,
with the build's progress) instead of showing empty tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards import charts
from ablab.dashboards.client import ApiError
from ablab.dashboards.format import (
    DECISION_BADGES,
    HEADLINE_P95,
    LATENCY_HEADLINES,
    STATUS_BADGES,
    VERDICT_HELP,
    cuped_table,
    fmt_count,
    fmt_p,
    fmt_pct,
    fmt_value,
    guardrail_reasons,
    guardrail_table,
    md_escape,
    metric_label,
    power_table,
    results_csv,
    results_table,
)
from ablab.dashboards.views import custom_metrics, live, policies, segments, shadows, ship, tables, variants
from ablab.dashboards.views.common import Context, goto, show_api_error
from ablab.dashboards.views.nav import VIEWS, address, open_view, view_params
from ablab.platform import fields

SERIES_METRICS = (*fields.LATENCY_FIELDS, "accuracy", fields.COST_FIELD, "error_rate",
                  *(fields.quantile_metric(name, 0.95) for name in fields.HISTOGRAM_FIELDS))
# the headline latency's window percentiles
DISTRIBUTION_METRICS = tuple(f"{fields.HEADLINE_LATENCY}_{q}" for q in fields.FIELDS[fields.HEADLINE_LATENCY].window
                             if q in fields.WINDOW_QUANTILES)


def _fetch(fn: Any, *args: Any, **kw: Any) -> tuple[Any, ApiError | None]:
    try:
        return fn(*args, **kw), None
    except ApiError as exc:
        return None, exc


def _has_data(result: Any) -> bool:
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
    left, right = st.columns([3, 2], vertical_alignment="bottom")
    if left.button("⚙️ Experiment settings", key="res_settings"):
        goto("edit", key)
    every = live.refresh_control(right)
    result, err = _fetch(ctx.client.results, key)
    if err:
        if err.status == 503:
            st.warning(f"Results are not available from this API: {md_escape(err.detail)}", icon="🛠️")
        else:
            show_api_error(err, what="load results")
        return
    if not _has_data(result):
        live.waiting(ctx.client, exp, every=every,
                     has_data=lambda: _has_data(_fetch(ctx.client.results, key)[0] or {"metrics": []}))
        return
    ship.render(ctx, exp, result)  # the decision and, for editors, a Ship button with a confirmation
    view, params = _nav(key, left)
    if view == "variants":
        variants.render(ctx, exp, result, params.get("variant"))
    elif view == "segments":
        segments.render(exp, result, params.get("dim"), params.get("value"))
    elif view == "metrics":
        custom_metrics.render(exp, result)
    else:
        _overview(ctx, exp, result, every)


def _nav(key: str, where: Any) -> tuple[str, dict[str, str]]:
    """The view switch, kept in step with the URL (a row click changes the URL, then reruns)."""
    view, params = view_params()
    if st.session_state.get("res_view") != view:
        st.session_state["res_view"] = view

    def switched() -> None:
        chosen = st.session_state.get("res_view") or view  # a click on the current view deselects it
        st.session_state["res_view"] = chosen
        address(key, chosen)

    where.segmented_control("View", list(VIEWS), format_func=VIEWS.get, key="res_view", on_change=switched)
    return view, params


# -- overview --------------------------------------------------------------------------------
def _overview(ctx: Context, exp: dict[str, Any], result: Any, every: float | None) -> None:
    key = exp["key"]
    first = {"result": result}  # the full run's fetch; a fragment rerun fetches its own

    def draw() -> None:
        current = first.pop("result", None)
        if current is None:
            current, err = _fetch(ctx.client.results, key)
            if err and err.status == 401:
                st.rerun()  # the whole page: it checks the session and signs out a refused token
            if err:
                st.warning(f"Could not refresh the results: {md_escape(err.detail)}", icon="⚠️")
                return
        _live(ctx, key, current, every)

    live.run_live(draw, every)
    _downloads_and_estimates(result, key)
    _guardrails(result)
    attribution = _fetch(ctx.client.attribution, key)  # once: the policy credit and the trade-offs read it
    if policies.entries(result):
        policies.render(result, attribution[0])
    _cuped(result)
    _power(result)
    _segments_pointer(key, result)
    shadows.render_shadows(ctx, result)
    _distributions(ctx, key, result)
    _attribution(*attribution)


def _live(ctx: Context, key: str, result: Any, every: float | None) -> None:
    computed = live.now_utc()
    st.subheader("Live: units, decisions and 10-second windows")
    c1, c2 = st.columns([2, 1])
    metric = c1.selectbox("Window metric", SERIES_METRICS, key="res_series_metric", format_func=metric_label)
    cumulative = c2.toggle("Running total", value=True, key="res_cumulative", help="Off: each window on its own.")
    series, series_err = _fetch(ctx.client.timeseries, key, metric=metric)
    count, latest = live.window_count(series) if series else (0, None)
    refresh = f"refreshes every {every:.0f} s" if every else "auto-refresh off"
    st.markdown(f"Computed at **{computed} UTC** · **{count} windows** of 10 s, the latest from "
                f"**{live.fmt_window(latest)}** · {refresh}")
    _banners(result)
    _decisions(result)
    _table(result, key)
    if series_err:
        st.warning(f"No window series: {md_escape(series_err.detail)}")
    elif not count:
        st.info("No 10 s windows yet: the stream job writes one per variant every 10 seconds once events flow.")
    else:
        if metric.endswith(("_p95", "_p99", "_p50")) and cumulative:
            st.caption("Window percentiles do not merge, so this shows each window's own value.")
        st.altair_chart(charts.timeseries_chart(series, cumulative=cumulative), width="stretch")


def _banners(result: Any) -> None:
    srm = result.get("srm") or {}
    if srm.get("flagged"):
        obs = ", ".join(f"{md_escape(k)}: {fmt_count(v)}" for k, v in (srm.get("observed") or {}).items())
        exp = ", ".join(f"{md_escape(k)}: {fmt_count(v)}" for k, v in (srm.get("expected") or {}).items())
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


def _units(result: Any) -> dict[str, Any]:
    observed = (result.get("srm") or {}).get("observed") or {}
    requests = {r["variant"]: r.get("n") for r in result.get("metrics", []) if r["metric"] == fields.HEADLINE_LATENCY}
    return {v: (observed.get(v), requests.get(v)) for v in dict.fromkeys([*observed, *requests])}


def _decisions(result: Any) -> None:
    decisions = {d["variant"]: d for d in result.get("decisions") or []}
    units = _units(result)
    arms = [result.get("control"), *decisions] if result.get("control") in units else list(decisions)
    if not arms:
        return
    for col, variant in zip(st.columns(len(arms)), arms):
        with col.container(border=True):
            unit_n, requests = units.get(variant, (None, None))
            d = decisions.get(variant)
            st.markdown(f"**{md_escape(variant)}**" + (" vs control" if d else " (control)"))
            st.markdown(f"#### {DECISION_BADGES.get(d['decision'], md_escape(d['decision'])) if d else '—'}")
            st.caption(f"{fmt_count(unit_n)} units · {fmt_count(requests)} requests")
            for reason in (d.get("reasons", []) if d else [])[:3]:
                st.caption(md_escape(reason))


def _table(result: Any, key: str) -> None:
    st.subheader("Per-variant results")
    st.caption("Click a row for that variant's details: every metric with its interval, the absolute difference, "
               "its strategy and guardrails.")
    table = results_table(result)
    metric_names = list(dict.fromkeys(table["Metric"]))
    shown = st.multiselect("Metrics", metric_names, default=metric_names[:7], key="res_metrics")
    visible = table[table["Metric"].isin(shown)].reset_index(drop=True)
    picked = tables.show(visible, key="res_table", open_rows=True, flex=("Metric",), help={"Verdict": VERDICT_HELP})
    if picked is not None and picked < len(visible):
        open_view(key, "variants", variant=str(visible.loc[picked, "Variant"]))


def _downloads_and_estimates(result: Any, key: str) -> None:
    st.download_button("⬇️ Download CSV", results_csv(result), file_name=f"{key}-results.csv", mime="text/csv", key="res_csv")
    cov = (result.get("coverage") or {}).get("by_variant") or {}
    if cov:
        st.caption("Label coverage: " + " · ".join(f"{md_escape(v)}: {fmt_pct(c.get('coverage'))} of {fmt_count(c.get('requests'))} requests labeled"
                                                   for v, c in cov.items()))
    st.altair_chart(charts.estimates_chart(result, LATENCY_HEADLINES), width="content")


def _cuped(result: Any) -> None:
    table = cuped_table(result)
    if table.empty:
        return
    st.subheader("Variance reduction (CUPED)")
    st.caption("Each adjusted comparison beside the unadjusted one; θ is the covariate's regression weight, "
               "the variance reduction how much narrower the adjustment made the interval's variance.")
    tables.show(table, key="res_cuped")
    st.altair_chart(charts.cuped_chart(result), width="stretch")


def _power(result: Any) -> None:
    table = power_table(result)
    if table.empty:
        return
    st.subheader("Power: how long until a decision")
    st.caption("Needed: randomization units per variant to detect the metric's minimum detectable effect (MDE, "
               "relative; set per metric under analysis.mde, 5 % by default); Units: the smaller arm's so far; "
               "Time to decision: how long the current traffic takes to get there.")
    tables.show(table, key="res_power", flex=("Time to decision",))


def _segments_pointer(key: str, result: Any) -> None:
    segs = result.get("segments") or []
    if not segs:
        return
    flagged = [(s.get("dimension"), h) for s in segs for h in s.get("heterogeneity") or [] if h.get("flagged")]
    st.subheader("Segments")
    if flagged:
        names = ", ".join(f"{md_escape(metric_label(str(h.get('metric'))))} of {md_escape(h.get('variant'))} by "
                          f"{md_escape(d)}" for d, h in flagged[:6])
        st.warning(f"The effect differs between segments: {names}.", icon="🚩")
    else:
        st.caption("No effect differs significantly between segments.")
    if st.button("Open the segments view", key="res_open_segments"):
        open_view(key, "segments")


def _guardrails(result: Any) -> None:
    st.subheader("Guardrails")
    table = guardrail_table(result)
    if table.empty:
        st.info("No guardrails configured. Add SLA bounds (e.g. TTFT p95 ≤ 800 ms) on the settings page.")
        return
    breaches = (table["Status"] == "🔴 breach").sum()
    if breaches:
        st.error(f"{breaches} guardrail breach{'es' if breaches > 1 else ''}.", icon="🚧")
    tables.show(table, key="res_guardrails")
    with st.expander("Why each guardrail stands where it does"):
        for line in guardrail_reasons(result):
            st.caption(md_escape(line))


def _distributions(ctx: Context, key: str, result: Any) -> None:
    st.subheader("Latency distributions")
    frames = {}
    for metric in DISTRIBUTION_METRICS:
        series, _ = _fetch(ctx.client.timeseries, key, metric=metric)
        if series and any(s.get("points") for s in series.get("series", [])):
            frames[metric] = series
    if frames:
        st.altair_chart(charts.latency_distribution_chart(frames), width="content")
    rows = {r["variant"]: r for r in result.get("metrics", []) if r["metric"] == HEADLINE_P95}
    if rows:
        st.caption("Whole-experiment p95: " + " · ".join(f"{md_escape(v)}: {fmt_value(HEADLINE_P95, r.get('estimate'))}"
                                                         for v, r in rows.items()))
    elif not frames:
        st.info("No latency windows yet.")


def _attribution(att: Any, err: ApiError | None) -> None:
    st.subheader("Trade-offs and attribution")
    if err:
        st.warning(f"No attribution: {md_escape(err.detail)}")
        return
    st.altair_chart(charts.pareto_chart(att), width="stretch")
    frame = charts.pareto_frame(att)
    on = frame[frame["frontier"] == "on the frontier"]["variant"].tolist()
    st.caption(f"On the frontier (no variant is at once faster, cheaper and more accurate): {md_escape(', '.join(on)) or '—'}.")
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
    tables.show(effects, key="res_effects", flex=("Term",))
