"""Altair charts: data in, chart out. Every chart has a title and labelled axes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

from ablab.dashboards.format import metric_label, metric_unit
from ablab.platform.fields import COST_FIELD, HEADLINE_LATENCY

_AXIS_UNITS = {"ms": "ms", "usd": "USD", "pct": "%"}


def axis_title(metric: str) -> str:
    unit = _AXIS_UNITS.get(metric_unit(metric))
    return f"{metric_label(metric)} ({unit})" if unit else metric_label(metric)


def _scale(metric: str, x: Any) -> Any:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x * 100 if metric_unit(metric) == "pct" else x


def timeseries_frame(series: Mapping[str, Any], *, cumulative: bool) -> pd.DataFrame:
    metric = series.get("metric", "")
    rows = []
    for s in series.get("series", []):
        for p in s.get("points", []):
            point = p.get("cumulative") if cumulative and p.get("cumulative") else p
            ci = point.get("ci") or [None, None]
            rows.append({"variant": s["variant"], "ts": pd.Timestamp(p["ts"]), "n": point.get("n"),
                         "value": _scale(metric, point.get("value")), "lo": _scale(metric, ci[0]), "hi": _scale(metric, ci[1])})
    return pd.DataFrame(rows, columns=["variant", "ts", "n", "value", "lo", "hi"])


def timeseries_chart(series: Mapping[str, Any], *, cumulative: bool = True) -> alt.LayerChart:
    metric = series.get("metric", "")
    df = timeseries_frame(series, cumulative=cumulative)
    kind = "running (cumulative)" if cumulative else "per 10 s window"
    base = alt.Chart(df).encode(
        x=alt.X("ts:T", title="Window start (UTC)"),
        color=alt.Color("variant:N", title="Variant"),
    )
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("lo:Q", title=axis_title(metric)), y2="hi:Q")
    line = base.mark_line(point=len(df) < 200).encode(
        y=alt.Y("value:Q", title=axis_title(metric)),
        tooltip=["variant", alt.Tooltip("ts:T", title="window"), alt.Tooltip("value:Q", format=",.4g"), alt.Tooltip("n:Q", format=",.0f")],
    )
    return (band + line).properties(title=f"{metric_label(metric)}, {kind}, with 95% CI", height=300)


def latency_distribution_chart(frames: Mapping[str, Mapping[str, Any]]) -> alt.Chart:
    """Per variant, the spread of the 10 s windows' p50/p95/p99 latency (box per quantile)."""
    rows = []
    for metric, series in frames.items():
        quantile = metric.rsplit("_", 1)[1]
        for s in series.get("series", []):
            for p in s.get("points", []):
                if p.get("value") is not None:
                    rows.append({"variant": s["variant"], "quantile": quantile, "latency_ms": p["value"]})
    df = pd.DataFrame(rows, columns=["variant", "quantile", "latency_ms"])
    return alt.Chart(df).mark_boxplot(extent="min-max").encode(
        x=alt.X("variant:N", title="Variant"),
        y=alt.Y("latency_ms:Q", title="End-to-end latency (ms)", scale=alt.Scale(zero=False)),
        color=alt.Color("variant:N", legend=None),
        column=alt.Column("quantile:N", title="Window quantile", sort=["p50", "p95", "p99"]),
    ).properties(title="Latency distribution across 10 s windows", width=160, height=260)


def estimates_chart(result: Mapping[str, Any], metrics: Sequence[str]) -> alt.Chart:
    """Each variant's estimate with its CI, one small panel per metric (latency side by side)."""
    rows = [{"metric": axis_title(r["metric"]), "variant": r["variant"], "estimate": r["estimate"],
             "lo": (r.get("ci") or [None, None])[0], "hi": (r.get("ci") or [None, None])[1]}
            for r in result.get("metrics", []) if r["metric"] in metrics and r.get("estimate") is not None]
    df = pd.DataFrame(rows, columns=["metric", "variant", "estimate", "lo", "hi"])
    base = alt.Chart(df).encode(y=alt.Y("variant:N", title="Variant"), color=alt.Color("variant:N", legend=None))
    layered = base.mark_rule(strokeWidth=2).encode(x=alt.X("lo:Q", title="Estimate with 95% CI", scale=alt.Scale(zero=False)), x2="hi:Q") + \
        base.mark_point(filled=True, size=80).encode(x="estimate:Q", tooltip=["variant", alt.Tooltip("estimate:Q", format=",.4g")])
    return layered.properties(width=260, height=30 * max(2, df["variant"].nunique())).facet(
        facet=alt.Facet("metric:N", title=None), columns=2
    ).resolve_scale(x="independent").properties(title="Latency per variant (mean and p95)")


def pareto_frame(attribution: Mapping[str, Any]) -> pd.DataFrame:
    pts = attribution.get("pareto", {}).get("points", [])
    df = pd.DataFrame([{
        "variant": p["variant"], "latency_ms": p.get(HEADLINE_LATENCY),
        "accuracy_pct": _scale("accuracy", p.get("accuracy")),
        "cost_per_1k_usd": p[COST_FIELD] * 1000 if p.get(COST_FIELD) is not None else None,
        "frontier": "on the frontier" if p.get("on_frontier") else "dominated",
        "dominated_by": ", ".join(p.get("dominated_by") or []) or "—",
    } for p in pts], columns=["variant", "latency_ms", "accuracy_pct", "cost_per_1k_usd", "frontier", "dominated_by"])
    return df


def pareto_chart(attribution: Mapping[str, Any]) -> alt.LayerChart:
    """Latency (x) vs accuracy (y), cost as point size; frontier variants joined by a line."""
    df = pareto_frame(attribution)
    frontier = df[df["frontier"] == "on the frontier"].sort_values("latency_ms")
    points = alt.Chart(df).mark_circle(opacity=0.85, stroke="black", strokeWidth=0.5).encode(
        x=alt.X("latency_ms:Q", title="Mean end-to-end latency (ms) — lower is better", scale=alt.Scale(zero=False)),
        y=alt.Y("accuracy_pct:Q", title="Accuracy (%) — higher is better", scale=alt.Scale(zero=False)),
        size=alt.Size("cost_per_1k_usd:Q", title="Cost per 1k requests (USD)", scale=alt.Scale(range=[80, 900])),
        color=alt.Color("frontier:N", title="Pareto", scale=alt.Scale(domain=["on the frontier", "dominated"], range=["#1f77b4", "#bbbbbb"])),
        tooltip=["variant", alt.Tooltip("latency_ms:Q", format=",.0f"), alt.Tooltip("accuracy_pct:Q", format=".2f"),
                 alt.Tooltip("cost_per_1k_usd:Q", format=".4f"), "dominated_by"],
    )
    labels = alt.Chart(df).mark_text(dy=-14, fontSize=11).encode(x="latency_ms:Q", y="accuracy_pct:Q", text="variant:N")
    line = alt.Chart(frontier).mark_line(strokeDash=[5, 3], color="#1f77b4").encode(x="latency_ms:Q", y="accuracy_pct:Q", order="latency_ms:Q")
    return (line + points + labels).properties(title="Latency–accuracy–cost trade-off (Pareto frontier dashed)", height=380)


def waterfall_frame(shapley: Mapping[str, Any]) -> pd.DataFrame:
    """Bars from 0 through each factor's share to the total gain (start/end per bar)."""
    rows, running = [], 0.0
    for s in shapley.get("shares", []):
        est = s.get("estimate") or 0.0
        rows.append({"step": f"{s['factor']}: {s.get('from')} → {s.get('to')}", "start": running, "end": running + est,
                     "share": est, "kind": "factor"})
        running += est
    total = (shapley.get("total") or {}).get("estimate")
    rows.append({"step": f"total ({shapley.get('best_variant')} vs control)", "start": 0.0,
                 "end": total if total is not None else running, "share": total, "kind": "total"})
    return pd.DataFrame(rows, columns=["step", "start", "end", "share", "kind"])


def waterfall_chart(shapley: Mapping[str, Any], metric: str) -> alt.Chart:
    df = waterfall_frame(shapley)
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("step:N", title="Factor switched from the control's level", sort=None, axis=alt.Axis(labelAngle=-20, labelLimit=260)),
        y=alt.Y("start:Q", title=f"Change in {axis_title(metric)}"),
        y2="end:Q",
        color=alt.Color("kind:N", title="", scale=alt.Scale(domain=["factor", "total"], range=["#4c78a8", "#f58518"])),
        tooltip=["step", alt.Tooltip("share:Q", format=",.4g")],
    ).properties(title=f"Shapley attribution of the {metric_label(metric).lower()} change", height=300)


def segment_frame(segment: Mapping[str, Any], metric: str) -> pd.DataFrame:
    """Relative effect and its CI per segment value and treatment, for one metric."""
    rows = []
    for r in segment.get("rows") or []:
        ci = r.get("rel_ci") or [None, None]
        if r.get("metric") != metric or r.get("rel_diff") is None:
            continue
        rows.append({"segment": str(r.get("value")), "variant": str(r.get("variant")), "rel": _scale("error_rate", r["rel_diff"]),
                     "lo": _scale("error_rate", ci[0]), "hi": _scale("error_rate", ci[1]), "n": r.get("n")})
    return pd.DataFrame(rows, columns=["segment", "variant", "rel", "lo", "hi", "n"])


def segment_chart(segment: Mapping[str, Any], metric: str) -> alt.LayerChart:
    """Forest plot: each segment's relative effect with its CI; a zero line to read against."""
    df = segment_frame(segment, metric)
    base = alt.Chart(df).encode(y=alt.Y("segment:N", title=str(segment.get("dimension", "segment"))),
                                color=alt.Color("variant:N", title="Variant"), yOffset="variant:N")
    bars = base.mark_rule(strokeWidth=2).encode(x=alt.X("lo:Q", title="Relative difference vs control (%)"), x2="hi:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x="rel:Q", tooltip=["segment", "variant", alt.Tooltip("rel:Q", format="+.2f", title="relative %"), "n"])
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
    return (bars + points + zero).properties(
        title=f"{metric_label(metric)} by {segment.get('dimension', 'segment')}", height=28 * max(2, len(df)))


def cuped_frame(result: Mapping[str, Any]) -> pd.DataFrame:
    """Adjusted and unadjusted relative CIs side by side, per CUPED row."""
    rows = []
    for r in result.get("metrics", []):
        cuped = r.get("cuped")
        if not isinstance(cuped, Mapping):
            continue
        raw = cuped.get("unadjusted") or {}
        for label, src in (("CUPED-adjusted", r), ("unadjusted", raw)):
            ci = src.get("rel_ci") or [None, None]
            rows.append({"metric": f"{metric_label(r['metric'])} · {r['variant']}", "comparison": label,
                         "rel": _scale("error_rate", src.get("rel_diff")), "lo": _scale("error_rate", ci[0]),
                         "hi": _scale("error_rate", ci[1])})
    return pd.DataFrame(rows, columns=["metric", "comparison", "rel", "lo", "hi"])


def cuped_chart(result: Mapping[str, Any]) -> alt.LayerChart:
    """How much narrower CUPED made each interval: adjusted above unadjusted."""
    df = cuped_frame(result)
    base = alt.Chart(df).encode(y=alt.Y("metric:N", title=None), yOffset="comparison:N",
                                color=alt.Color("comparison:N", title=None))
    return (base.mark_rule(strokeWidth=3).encode(x=alt.X("lo:Q", title="Relative difference vs control (%)"), x2="hi:Q")
            + base.mark_point(filled=True, size=60).encode(x="rel:Q")).properties(
        title="CUPED: adjusted vs unadjusted 95% CI", height=40 * max(2, df["metric"].nunique()))


# -- policy variants: arm shares and the credit of the gain -----------------------------------
def arm_share_frame(policy: Mapping[str, Any]) -> pd.DataFrame:
    """Each arm's share of the policy variant's requests (%) with its 95 % interval."""
    rows = []
    for a in policy.get("arms") or []:
        ci = list(a.get("share_ci") or [None, None]) + [None, None]
        rows.append({"arm": str(a.get("arm")), "share": _scale("accuracy", a.get("share")), "lo": _scale("accuracy", ci[0]),
                     "hi": _scale("accuracy", ci[1]), "requests": a.get("requests")})
    return pd.DataFrame(rows, columns=["arm", "share", "lo", "hi", "requests"])


def arm_share_chart(policy: Mapping[str, Any]) -> alt.LayerChart:
    """Bars of each arm's share of requests, the interval as a rule across each bar's end."""
    df = arm_share_frame(policy)
    base = alt.Chart(df).encode(y=alt.Y("arm:N", title="Arm", sort=None))
    bars = base.mark_bar(opacity=0.8).encode(
        x=alt.X("share:Q", title="Share of the variant's requests (%)", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("arm:N", legend=None),
        tooltip=["arm", alt.Tooltip("share:Q", format=".1f", title="share %"), alt.Tooltip("lo:Q", format=".1f"),
                 alt.Tooltip("hi:Q", format=".1f"), alt.Tooltip("requests:Q", format=",.0f")],
    )
    ci = base.mark_rule(strokeWidth=2, color="black").encode(x="lo:Q", x2="hi:Q")
    return (bars + ci).properties(title=f"Arm shares of {policy.get('variant', 'the policy')}, with 95% CI",
                                  height=30 * max(2, len(df)))


def credit_frame(credit: Mapping[str, Any]) -> pd.DataFrame:
    """The policy's gain over its baseline as steps: each arm's contribution (share × its mean
    less the baseline's, so they add up to the gain), a rest only if they do not, then the gain.
    ``routing`` (the policy against its best single arm) is another difference: not a step."""
    metric = str(credit.get("metric", ""))
    rows, running = [], 0.0
    parts = [(f"arm {a.get('arm')}", a.get("contribution"), a.get("ci")) for a in credit.get("arms") or []]
    gain = (credit.get("gain") or {}).get("estimate")
    for step, value, ci in parts:
        est = float(value or 0.0)
        lo, hi = (list(ci or [None, None]) + [None, None])[:2]
        rows.append({"step": step, "start": _scale(metric, running), "end": _scale(metric, running + est),
                     "contribution": _scale(metric, est), "lo": _scale(metric, lo), "hi": _scale(metric, hi), "kind": "part"})
        running += est
    if gain is not None and abs(float(gain) - running) > 1e-9 * max(1.0, abs(float(gain))):
        rest = float(gain) - running
        rows.append({"step": "rest (not credited)", "start": _scale(metric, running), "end": _scale(metric, float(gain)),
                     "contribution": _scale(metric, rest), "lo": None, "hi": None, "kind": "rest"})
    total = float(gain) if gain is not None else running
    gci = list((credit.get("gain") or {}).get("ci") or [None, None]) + [None, None]
    rows.append({"step": "gain", "start": 0.0, "end": _scale(metric, total), "contribution": _scale(metric, total),
                 "lo": _scale(metric, gci[0]), "hi": _scale(metric, gci[1]), "kind": "gain"})
    return pd.DataFrame(rows, columns=["step", "start", "end", "contribution", "lo", "hi", "kind"])


def credit_chart(credit: Mapping[str, Any]) -> alt.Chart:
    """Waterfall: the arms' contributions stacked up to the policy's gain."""
    metric = str(credit.get("metric", ""))
    df = credit_frame(credit)
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("step:N", title=None, sort=None, axis=alt.Axis(labelAngle=-20, labelLimit=260)),
        y=alt.Y("start:Q", title=f"Gain in {axis_title(metric)}"),
        y2="end:Q",
        color=alt.Color("kind:N", title="", scale=alt.Scale(domain=["part", "rest", "gain"], range=["#4c78a8", "#bbbbbb", "#f58518"])),
        tooltip=["step", alt.Tooltip("contribution:Q", format=",.4g"), alt.Tooltip("lo:Q", format=",.4g"),
                 alt.Tooltip("hi:Q", format=",.4g")],
    ).properties(title=f"Where {credit.get('variant', 'the policy')}'s {metric_label(metric).lower()} gain comes from",
                 height=280)


def feature_credit_frame(credit: Mapping[str, Any]) -> pd.DataFrame:
    metric = str(credit.get("metric", ""))
    rows = []
    for f in credit.get("features") or []:
        ci = list(f.get("ci") or [None, None]) + [None, None]
        rows.append({"feature": str(f.get("feature")), "credit": _scale(metric, f.get("credit")),
                     "lo": _scale(metric, ci[0]), "hi": _scale(metric, ci[1])})
    return pd.DataFrame(rows, columns=["feature", "credit", "lo", "hi"])


def feature_credit_chart(credit: Mapping[str, Any]) -> alt.LayerChart:
    """Each feature's credit for the routing gain, with its interval, against zero."""
    metric = str(credit.get("metric", ""))
    df = feature_credit_frame(credit)
    base = alt.Chart(df).encode(y=alt.Y("feature:N", title="Feature", sort=None))
    bars = base.mark_bar(opacity=0.8).encode(x=alt.X("credit:Q", title=f"Credit in {axis_title(metric)}"),
                                             tooltip=["feature", alt.Tooltip("credit:Q", format=",.4g")])
    ci = base.mark_rule(strokeWidth=2, color="black").encode(x="lo:Q", x2="hi:Q")
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
    return (bars + ci + zero).properties(title="Credit per feature (what routing on it gained)", height=30 * max(2, len(df)))
