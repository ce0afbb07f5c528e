"""Shadow requests on the results page (issue 34): each variant's shadows against their own
primaries — the paired differences (Δ = shadow − primary, its interval and p-values) and the
coverage (how many requests were chosen, got a shadow, were dropped at the cap, failed).

``render_shadows(ctx, results)`` draws nothing for an experiment without shadows, so the
results page can call it unconditionally. The tables are built by pure functions
(:func:`paired_table`, :func:`coverage_table`, :func:`coverage_notes`), unit-tested without
Streamlit, which is imported only to draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ablab.dashboards.format import fmt_count, fmt_interval, fmt_p, fmt_pct, fmt_value, md_escape, metric_label
from ablab.platform.fields import RANK_TESTED

SHADOW_VERDICTS = {"better": "🟢 shadow better", "worse": "🔴 shadow worse", "flat": "⚪ no difference",
                   "no data": "… too few pairs"}


def _get(row: Any, name: str, default: Any = None) -> Any:
    """A field of a JSON row; null (or no row) reads as ``default``."""
    value = row.get(name) if isinstance(row, Mapping) else None
    return default if value is None else value


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def shadow_rows(result: Any) -> list[Any]:
    return list(_get(result, "shadows", []) or [])


def shadow_verdict(row: Any, alpha: float) -> str:
    """better / worse when the corrected paired p-value is below alpha (by the metric's
    direction), flat when not, "no data" below two pairs or without a p-value."""
    p = _get(row, "p_value_adjusted")
    p = _get(row, "p_value") if p is None else p
    diff = _get(row, "mean_diff")
    if (_get(row, "n_pairs", 0) or 0) < 2 or not _finite(p) or not _finite(diff):
        return "no data"
    if p >= alpha or diff == 0:
        return "flat"
    lower = bool(_get(row, "lower_is_better", True))
    return "better" if (diff < 0) == lower else "worse"


def paired_table(result: Any) -> pd.DataFrame:
    """One row per (variant, metric): pairs, both means, Δ with its interval, the p-values."""
    alpha = float(_get(result, "alpha", 0.05))
    level = f"{100 * (1 - alpha):g}% CI"
    out = []
    for r in shadow_rows(result):
        metric = str(_get(r, "metric", ""))
        ranked = metric in RANK_TESTED and not _get(r, "custom", False)
        out.append({
            "Variant": str(_get(r, "variant", "")),
            "Metric": metric_label(metric),
            "Pairs": fmt_count(_get(r, "n_pairs")),
            "Primary": fmt_value(metric, _get(r, "primary_mean")),
            "Shadow": fmt_value(metric, _get(r, "shadow_mean")),
            "Δ shadow − primary": fmt_value(metric, _get(r, "mean_diff"), signed=True),
            level: fmt_interval(metric, _get(r, "ci"), signed=True),
            "p (paired t)": fmt_p(_get(r, "p_value")),
            "p adj.": fmt_p(_get(r, "p_value_adjusted")),
            "p sign": fmt_p(_get(r, "sign_p_value")) if ranked else "",
            "p Wilcoxon": fmt_p(_get(r, "wilcoxon_p_value")) if ranked else "",
            "Verdict": SHADOW_VERDICTS[shadow_verdict(r, alpha)],
        })
    columns = ["Variant", "Metric", "Pairs", "Primary", "Shadow", "Δ shadow − primary", level, "p (paired t)", "p adj.",
               "p sign", "p Wilcoxon", "Verdict"]
    return pd.DataFrame(out, columns=columns)


def _coverage_by_variant(result: Any) -> dict[str, Mapping[str, Any]]:
    by_variant: dict[str, Mapping[str, Any]] = {}
    for r in shadow_rows(result):
        by_variant.setdefault(str(_get(r, "variant", "")), _get(r, "coverage", {}) or {})
    return by_variant


def coverage_table(result: Any) -> pd.DataFrame:
    """One row per variant: requests, chosen, sent, dropped, got a shadow, failed, orphaned."""
    out = []
    for variant, cov in _coverage_by_variant(result).items():
        chosen = _get(cov, "chosen", 0)
        shadowed = _get(cov, "shadowed", 0)
        out.append({
            "Variant": variant,
            "Requests": fmt_count(_get(cov, "requests", 0)),
            "Chosen": fmt_count(chosen),
            "Sent": fmt_count(_get(cov, "sent", 0)),
            "Dropped (cap full)": fmt_count(_get(cov, "dropped", 0)),
            "Got a shadow": fmt_count(shadowed),
            "Failed": fmt_count(_get(cov, "failed", 0)),
            "Orphaned": fmt_count(_get(cov, "orphaned", 0)),
            "Shadowed share of chosen": fmt_pct(shadowed / chosen) if chosen else "—",
        })
    columns = ["Variant", "Requests", "Chosen", "Sent", "Dropped (cap full)", "Got a shadow", "Failed", "Orphaned",
               "Shadowed share of chosen"]
    return pd.DataFrame(out, columns=columns)


def coverage_notes(result: Any) -> list[str]:
    """Markdown warnings: shadows dropped at the cap, failed, sent without a shadow event,
    shadow events without their primary."""
    notes = []
    for variant, cov in _coverage_by_variant(result).items():
        name = md_escape(variant)
        chosen, dropped = _get(cov, "chosen", 0), _get(cov, "dropped", 0)
        sent, shadowed = _get(cov, "sent", 0), _get(cov, "shadowed", 0)
        failed, orphaned = _get(cov, "failed", 0), _get(cov, "orphaned", 0)
        if dropped:
            notes.append(f"{name}: {fmt_count(dropped)} of {fmt_count(chosen)} chosen requests "
                         f"({fmt_pct(dropped / chosen)}) had their shadow dropped: the shadow cap was full.")
        if failed:
            notes.append(f"{name}: {fmt_count(failed)} of {fmt_count(shadowed)} shadows failed; latency, token and cost "
                         "differences leave them out, the error rate counts them.")
        if sent > shadowed:
            notes.append(f"{name}: {fmt_count(sent - shadowed)} shadows were sent but none of their events has arrived.")
        if orphaned:
            notes.append(f"{name}: {fmt_count(orphaned)} shadow events name a primary request not (yet) loaded.")
    return notes


def render_shadows(ctx: Any, results: Any) -> None:
    """The shadows section of the results page; nothing when the experiment has no shadows."""
    del ctx  # the section reads the results already fetched
    if not shadow_rows(results):
        return
    import streamlit as st

    st.subheader("Shadows")
    st.caption("Each shadow request compared with its own primary: Δ = shadow − primary per request, paired t "
               "interval and p-value (corrected across these rows); for latencies also the sign and Wilcoxon "
               "signed-rank tests, robust to skew. A shadow's answer was never returned to the user.")
    st.dataframe(coverage_table(results), hide_index=True)
    for note in coverage_notes(results):
        st.caption("⚠️ " + note)
    st.dataframe(paired_table(results), hide_index=True)
