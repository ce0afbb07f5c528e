"""The per-arm view of a policy variant (a strategy that picks one of its arms per request,
docs/policies.md), on the results page: from the results' ``policies`` and the attribution's
``policies``.

Per policy variant: its requests, units and model version, "exploring uniformly" until a
model is fitted, SLO compliance (the observed quantile against its bound, met or not), each
arm's share of requests with its interval (a chart), a per-arm table (share, mean propensity,
SLO compliance, each metric's estimate and interval), and the credit of the variant's gain
over its baseline: each arm's contribution (a waterfall that ends at the gain) and each
feature's. Both fields are read tolerantly: an API that does not send them shows nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards import charts
from ablab.dashboards.format import fmt_count, fmt_interval, fmt_pct, fmt_value, md_escape, metric_label
from ablab.dashboards.views import tables

EXPLORING = "exploring uniformly: no model yet"
SHARE = "accuracy"  # a share reads as a percentage, as accuracy does
MET_BADGES = {True: "🟢 met", False: "🔴 unmet", None: "🟡 not enough data"}


def entries(doc: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """``doc['policies']`` as a list of mappings; anything else (absent, null, not a list): none."""
    found = (doc or {}).get("policies") if isinstance(doc, Mapping) else None
    return [p for p in found if isinstance(p, Mapping)] if isinstance(found, list) else []


def credits_of(attribution: Mapping[str, Any] | None, variant: str) -> list[Mapping[str, Any]]:
    """The attribution's credit entries of one policy variant (one per metric)."""
    return [c for c in entries(attribution) if c.get("variant") == variant]


def _pair(ci: Any) -> list[Any]:
    return (list(ci) if isinstance(ci, Sequence) and not isinstance(ci, str) else []) + [None, None]


def slo_table(policy: Mapping[str, Any]) -> pd.DataFrame:
    """One row per SLO: the statistic bounded, the bound, what was observed (with its interval),
    the share of requests within the bound, met or not."""
    rows = []
    for s in policy.get("slo") or []:
        field = str(s.get("field") or s.get("metric") or "")
        q = s.get("quantile")
        statistic = "mean" if q is None else f"p{round(float(q) * 100):g}"
        rows.append({
            "SLO": str(s.get("metric") or field),
            "Latency": f"{metric_label(field)} {statistic}",
            "Bound": f"≤ {fmt_value(field, s.get('bound'))}",
            "Observed": fmt_value(field, s.get("observed")),
            "95% CI": fmt_interval(field, _pair(s.get("ci"))[:2]),
            "Within bound": fmt_pct(s.get("compliance")),
            "Status": MET_BADGES.get(s.get("met"), MET_BADGES[None]),
        })
    return pd.DataFrame(rows, columns=["SLO", "Latency", "Bound", "Observed", "95% CI", "Within bound", "Status"])


def arm_table(policy: Mapping[str, Any]) -> pd.DataFrame:
    """One row per arm: requests, share with its interval, mean propensity, SLO compliance."""
    rows = [{
        "Arm": str(a.get("arm")),
        "Requests": fmt_count(a.get("requests")),
        "Share": fmt_pct(a.get("share")),
        "Share 95% CI": fmt_interval(SHARE, _pair(a.get("share_ci"))[:2]),
        "Mean propensity": "—" if a.get("mean_propensity") is None else f"{float(a['mean_propensity']):.3f}",
        "SLO compliance": fmt_pct(a.get("slo_compliance")),
    } for a in policy.get("arms") or []]
    return pd.DataFrame(rows, columns=["Arm", "Requests", "Share", "Share 95% CI", "Mean propensity", "SLO compliance"])


def arm_metric_table(policy: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (metric, arm): the requests with a value, the mean and its 95 % interval;
    metrics in the order the arms report them, so one metric's arms sit together."""
    cells = [(str(m.get("metric")), str(a.get("arm")), m) for a in policy.get("arms") or [] for m in a.get("metrics") or []]
    order = {name: i for i, name in enumerate(dict.fromkeys(metric for metric, _, _ in cells))}
    rows = [{"Metric": metric_label(metric), "Arm": arm, "n": fmt_count(m.get("n")), "Estimate": fmt_value(metric, m.get("estimate")),
             "95% CI": fmt_interval(metric, _pair(m.get("ci"))[:2])}
            for metric, arm, m in sorted(cells, key=lambda c: order[c[0]])]
    return pd.DataFrame(rows, columns=["Metric", "Arm", "n", "Estimate", "95% CI"])


def credit_table(credit: Mapping[str, Any]) -> pd.DataFrame:
    """Each arm's share of requests, its mean and its contribution to the gain (share × its mean
    less the baseline's), with intervals."""
    metric = str(credit.get("metric", ""))
    rows = [{"Arm": str(a.get("arm")), "Share": fmt_pct(a.get("share")), "Mean": fmt_value(metric, a.get("mean")),
             "Contribution": fmt_value(metric, a.get("contribution"), signed=True),
             "95% CI": fmt_interval(metric, _pair(a.get("ci"))[:2], signed=True)} for a in credit.get("arms") or []]
    return pd.DataFrame(rows, columns=["Arm", "Share", "Mean", "Contribution", "95% CI"])


def feature_table(credit: Mapping[str, Any]) -> pd.DataFrame:
    metric = str(credit.get("metric", ""))
    return pd.DataFrame([{"Feature": str(f.get("feature")), "Credit": fmt_value(metric, f.get("credit"), signed=True),
                          "95% CI": fmt_interval(metric, _pair(f.get("ci"))[:2], signed=True)}
                         for f in credit.get("features") or []], columns=["Feature", "Credit", "95% CI"])


def headline(policy: Mapping[str, Any]) -> str:
    """One line (Markdown, API text escaped): kind, requests, units, objective, model version."""
    version = str(policy.get("model_version") or "—")
    return (f"{md_escape(policy.get('kind') or 'policy')} · {fmt_count(policy.get('requests'))} requests from "
            f"{fmt_count(policy.get('units'))} units · objective {md_escape(metric_label(str(policy.get('objective') or '—')))}"
            f" · model {md_escape(version)}")


def render(result: Mapping[str, Any], attribution: Mapping[str, Any] | None, *, only: str | None = None) -> None:
    """A section per policy variant in ``result['policies']`` (``only``: that variant's)."""
    found = [p for p in entries(result) if only is None or p.get("variant") == only]
    if not found:
        return
    if only is None:
        st.subheader("Policy variants: per-arm view")
    for policy in found:
        section(policy, credits_of(attribution, str(policy.get("variant"))))


def section(policy: Mapping[str, Any], credits: Sequence[Mapping[str, Any]]) -> None:
    variant = str(policy.get("variant"))
    key = f"pol_{variant}"
    with st.container(border=True):
        st.markdown(f"**Policy variant {md_escape(variant)}**")
        st.caption(headline(policy))
        if policy.get("exploring"):
            st.info(f"{md_escape(variant)} is {EXPLORING}: every arm has the same probability until the policy's model is "
                    "fitted from its own logs.", icon="🧭")
        slos = slo_table(policy)
        if not slos.empty:
            unmet = int((slos["Status"] == MET_BADGES[False]).sum())
            st.markdown("**SLO compliance**" + (f" — {unmet} unmet" if unmet else ""))
            tables.show(slos, key=f"{key}_slo")
        if policy.get("arms"):
            st.altair_chart(charts.arm_share_chart(policy), width="stretch")
            st.markdown("**Per arm**: its share of requests and how likely the policy was to pick it")
            tables.show(arm_table(policy), key=f"{key}_arms", flex=("Arm",))
            metrics = arm_metric_table(policy)
            if not metrics.empty:
                st.markdown("**Each arm's metrics**: the mean over its requests with a value, with its 95% interval")
                tables.show(metrics, key=f"{key}_arm_metrics", flex=("Metric",))
        for note in policy.get("notes") or []:
            st.caption(md_escape(note))
        _credit(key, credits)


def _credit(key: str, credits: Sequence[Mapping[str, Any]]) -> None:
    if not credits:
        return
    by_metric = {str(c.get("metric")): c for c in credits}
    metric = next(iter(by_metric))
    if len(by_metric) > 1:
        metric = st.selectbox("Credit the gain in", list(by_metric), key=f"{key}_credit_metric", format_func=metric_label)
    credit = by_metric[metric]
    gain = credit.get("gain") or {}
    closes = "rest" not in set(charts.credit_frame(credit)["kind"])
    st.markdown(f"**Credit**: the {md_escape(metric_label(metric).lower())} gain over "
                f"{md_escape(credit.get('baseline') or 'the baseline')} is {fmt_value(metric, gain.get('estimate'), signed=True)} "
                f"{fmt_interval(metric, _pair(gain.get('ci'))[:2], signed=True)}; "
                + ("the parts below add up to it." if closes else "the parts below do not add up to it: the rest is shown apart."))
    st.altair_chart(charts.credit_chart(credit), width="stretch")
    tables.show(credit_table(credit), key=f"{key}_credit", flex=("Arm",))
    routing = credit.get("routing") or {}
    if routing.get("estimate") is not None:
        st.markdown(f"**Routing**: against always its best single arm, the policy gains "
                    f"{fmt_value(metric, routing.get('estimate'), signed=True)} "
                    f"{fmt_interval(metric, _pair(routing.get('ci'))[:2], signed=True)} (doubly robust, on its own requests).")
    if credit.get("features"):
        st.caption("Feature credits: what seeing each feature is worth to the policy (Shapley shares of its value less "
                   "the value of the same policy blind to its features).")
        st.altair_chart(charts.feature_credit_chart(credit), width="stretch")
        tables.show(feature_table(credit), key=f"{key}_features", flex=("Feature",))
    for note in credit.get("notes") or []:
        st.caption(md_escape(note))
