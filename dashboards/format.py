"""Readable numbers and units, in one place, so every page says "412 ms" the same way.

Pure functions: values in, strings or tables out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ablab.platform import fields

# metric → (label, unit kind); the unit kind picks the formatter. Measured fields, their
# percentiles and their client-side (RUM) means are labelled in the field catalogue;
# derived metrics here.
METRIC_LABELS: dict[str, tuple[str, str]] = {
    **fields.labels(),
    **fields.rum_labels(),
    "accuracy": ("Accuracy", "pct"),
    "cost_per_correct": ("Cost per correct answer", "usd"),
    "goodput": ("Goodput (meets SLOs)", "pct"),
    "error_rate": ("Error rate", "pct"),
}
# Tooltip text of a measured field (the catalogue's description).
METRIC_HELP: dict[str, str] = fields.descriptions()
HEADLINE_P95 = fields.quantile_metric(fields.HEADLINE_LATENCY, 0.95)
# Each latency with quantiles: its mean, then its p95 (side by side in the estimates chart).
LATENCY_HEADLINES: tuple[str, ...] = tuple(
    m for name in fields.HISTOGRAM_FIELDS for m in (name, fields.quantile_metric(name, 0.95))
)
# Shown first and in this order on the results page; the rest follow.
RESULT_METRIC_ORDER = (*LATENCY_HEADLINES, "accuracy", fields.COST_FIELD, "cost_per_correct")
DECISION_BADGES = {"ship": "🟢 ship", "no_ship": "🔴 don't ship", "keep_running": "🟡 keep running"}
GUARDRAIL_BADGES = {"pass": "🟢 pass", "fail": "🔴 breach", "inconclusive": "🟡 pending"}
STATUS_BADGES = {"draft": "⚪ draft", "running": "🟢 running", "paused": "🟡 paused", "stopped": "⚫ stopped"}


# Every ASCII punctuation character may be backslash-escaped in CommonMark; escaping all
# of them is simpler than knowing which ones Streamlit's Markdown (links, images, HTML,
# `$` math, `:color[...]` directives, emphasis) would act on.
_MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~:$&\"'=^@%;,?/")


# GitHub-style autolinking (remark-gfm, which Streamlit's Markdown runs) finds bare URLs and
# e-mail addresses in the text after backslash escapes are resolved, so escaping alone
# still shows `https://x.example` or `bob@x.example` as a link. A word joiner (U+2060:
# invisible, no line break) inside each trigger stops it: between `http(s)` and `:`, between
# `www` and `.`, after `@`. Nothing else is touched: the text reads as typed (a copy of it
# carries the joiner, which is why it goes only where a link would start).
WORD_JOINER = "\u2060"
_AUTOLINK_TRIGGER = re.compile(r"https?(?=:)|www(?=\.)|@", re.IGNORECASE)


def md_escape(text: Any) -> str:
    """User text (names, owners, API messages quoting input) shown literally in Markdown,
    with no link, image, HTML or bare URL becoming live."""
    out = []
    for ch in _AUTOLINK_TRIGGER.sub(lambda m: m.group(0) + WORD_JOINER, str(text)):
        if ch in _MARKDOWN_SPECIAL:
            out.append("\\" + ch)
        elif ch in "\r\n":
            out.append(" ")  # a newline could start a heading or a list
        else:
            out.append(ch)
    return "".join(out)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, (metric, ""))[0]


def metric_unit(metric: str) -> str:
    return METRIC_LABELS.get(metric, (metric, "num"))[1]


def fmt_ms(x: Any) -> str:
    if not _finite(x):
        return "—"
    if abs(x) >= 10_000:
        return f"{x / 1000:,.1f} s"
    return f"{x:,.0f} ms" if abs(x) >= 100 else f"{x:,.1f} ms"


def fmt_usd(x: Any) -> str:
    if not _finite(x):
        return "—"
    if x == 0:
        return "$0"
    if abs(x) < 0.01:  # per-request costs are fractions of a cent: show per 1k requests
        return f"${x * 1000:,.3f} / 1k"
    return f"${x:,.4f}"


def fmt_pct(x: Any, *, digits: int = 1, signed: bool = False) -> str:
    if not _finite(x):
        return "—"
    return f"{x * 100:+.{digits}f}%" if signed else f"{x * 100:.{digits}f}%"


def fmt_p(p: Any) -> str:
    if not _finite(p):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def fmt_count(x: Any) -> str:
    return f"{x:,.0f}" if _finite(x) else "—"


def fmt_value(metric: str, x: Any, *, signed: bool = False) -> str:
    kind = metric_unit(metric)
    if kind == "pct":
        return fmt_pct(x, signed=signed, digits=2 if signed else 1)
    sign = "+" if signed and _finite(x) and x > 0 else ""
    if kind == "ms":
        return sign + fmt_ms(x)
    if kind == "usd":
        return sign + fmt_usd(x) if not (signed and _finite(x) and x < 0) else "−" + fmt_usd(-x)
    return f"{x:+.4g}" if signed and _finite(x) else (f"{x:.4g}" if _finite(x) else "—")


def fmt_interval(metric: str, ci: Sequence[Any] | None, *, signed: bool = False) -> str:
    if not ci or len(ci) != 2 or not (_finite(ci[0]) and _finite(ci[1])):
        return "—"
    return f"[{fmt_value(metric, ci[0], signed=signed)}, {fmt_value(metric, ci[1], signed=signed)}]"


def verdict(row: Mapping[str, Any], alpha: float) -> str:
    """better / worse / flat for one treatment row (adjusted p-value when present)."""
    if row.get("method") == "control":
        return "control"
    p = row.get("p_value_adjusted")
    p = row.get("p_value") if not _finite(p) else p
    diff = row.get("abs_diff")
    if not (_finite(p) and _finite(diff)):
        return "no data"
    if p >= alpha:
        return "flat"
    better = (diff < 0) == bool(row.get("lower_is_better", True))
    return "better" if better else "worse"


VERDICT_BADGES = {"better": "🟢 better", "worse": "🔴 worse", "flat": "⚪ no difference", "control": "control", "no data": "… no data"}
VERDICT_HELP = ("Verdict: better or worse than the control on this metric at α, from the adjusted p-value and the "
                "metric's direction; no difference: not significant (yet).")


def ordered_metrics(names: Sequence[str]) -> list[str]:
    present = list(dict.fromkeys(names))
    first = [m for m in RESULT_METRIC_ORDER if m in present]
    return first + [m for m in present if m not in first]


def results_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """The overview's table, one row per (metric, variant): formatted strings, narrow enough to
    show whole beside the sidebar at 1,280 px (a click on a row opens the variant's details,
    :func:`variant_table`, where the absolute difference and the estimate's interval are)."""
    alpha = float(result.get("alpha") or 0.05)
    rows = result.get("metrics", [])
    order = {m: i for i, m in enumerate(ordered_metrics([r["metric"] for r in rows]))}
    out = []
    for r in sorted(rows, key=lambda r: order[r["metric"]]):
        m = r["metric"]
        is_control = r.get("method") == "control"
        out.append({
            "Metric": metric_label(m) + (" (custom)" if r.get("custom") else ""),
            "Variant": r["variant"],
            "n": fmt_count(r.get("n")),
            "Estimate": fmt_value(m, r.get("estimate")),
            "Relative (95% CI)": "—" if is_control else fmt_rel_with_ci(r.get("rel_diff"), r.get("rel_ci")),
            "p (adj.)": "—" if is_control else fmt_p(_adjusted_p(r)),
            "Verdict": VERDICT_BADGES[verdict(r, alpha)],
        })
    return pd.DataFrame(out, columns=["Metric", "Variant", "n", "Estimate", "Relative (95% CI)", "p (adj.)", "Verdict"])


def _adjusted_p(row: Mapping[str, Any]) -> Any:
    p = row.get("p_value_adjusted")
    return p if _finite(p) else row.get("p_value")


def fmt_rel_with_ci(rel: Any, ci: Sequence[Any] | None) -> str:
    """``-18.2% [-21.3, -15.0]``: the relative difference and its interval, in percent."""
    if not _finite(rel):
        return "—"
    if not ci or len(ci) != 2 or not (_finite(ci[0]) and _finite(ci[1])):
        return fmt_pct(rel, signed=True)
    return f"{fmt_pct(rel, signed=True)} [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]"


def variant_table(result: Mapping[str, Any], variant: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every metric of one variant, as two tables that each fit: its own numbers (n, estimate
    with its interval, the control's estimate) and the comparison (absolute and relative
    difference, adjusted p-value, verdict; empty for the control)."""
    alpha = float(result.get("alpha") or 0.05)
    rows = result.get("metrics", [])
    control = {r["metric"]: r for r in rows if r.get("method") == "control"}
    mine = [r for r in rows if r["variant"] == variant]
    order = {m: i for i, m in enumerate(ordered_metrics([r["metric"] for r in mine]))}
    numbers, comparison = [], []
    for r in sorted(mine, key=lambda r: order[r["metric"]]):
        m = r["metric"]
        label = metric_label(m) + (" (custom)" if r.get("custom") else "")
        is_control = r.get("method") == "control"
        numbers.append({
            "Metric": label, "n": fmt_count(r.get("n")), "Estimate": fmt_value(m, r.get("estimate")),
            "95% CI": fmt_interval(m, r.get("ci")),
            "Control": fmt_value(m, (control.get(m) or {}).get("estimate")),
        })
        if not is_control:
            comparison.append({
                "Metric": label, "Difference": fmt_value(m, r.get("abs_diff"), signed=True),
                "Relative (95% CI)": fmt_rel_with_ci(r.get("rel_diff"), r.get("rel_ci")),
                "p (adj.)": fmt_p(_adjusted_p(r)), "Verdict": VERDICT_BADGES[verdict(r, alpha)],
            })
    return (pd.DataFrame(numbers, columns=["Metric", "n", "Estimate", "95% CI", "Control"]),
            pd.DataFrame(comparison, columns=["Metric", "Difference", "Relative (95% CI)", "p (adj.)", "Verdict"]))


def _rel_ci(ci: Sequence[Any] | None) -> str:
    if not ci or len(ci) != 2 or not (_finite(ci[0]) and _finite(ci[1])):
        return "—"
    return f"[{fmt_pct(ci[0], signed=True)}, {fmt_pct(ci[1], signed=True)}]"


def results_csv(result: Mapping[str, Any]) -> str:
    """The raw numbers (not the formatted strings) as CSV, one row per metric × variant."""
    cols = ["metric", "variant", "units", "n", "estimate", "ci_lo", "ci_hi", "abs_diff", "abs_ci_lo", "abs_ci_hi",
            "rel_diff", "rel_ci_lo", "rel_ci_hi", "p_value", "p_value_adjusted", "method", "coverage"]
    records = []
    for r in result.get("metrics", []):
        ci, abs_ci, rel_ci = (r.get(k) or [None, None] for k in ("ci", "abs_ci", "rel_ci"))
        records.append({
            **{k: r.get(k) for k in ("metric", "variant", "units", "n", "estimate", "abs_diff", "rel_diff",
                                     "p_value", "p_value_adjusted", "method", "coverage")},
            "ci_lo": ci[0], "ci_hi": ci[1], "abs_ci_lo": abs_ci[0], "abs_ci_hi": abs_ci[1],
            "rel_ci_lo": rel_ci[0], "rel_ci_hi": rel_ci[1],
        })
    return pd.DataFrame(records, columns=cols).to_csv(index=False)


def guardrail_table(result: Mapping[str, Any]) -> pd.DataFrame:
    rows = [{
        "Variant": g["variant"],
        "Metric": metric_label(g["metric"]),
        "Kind": "SLA" if g.get("kind") == "sla" else "non-inferiority",
        "Threshold": (fmt_pct(g["threshold"]) if g.get("relative") else fmt_value(g["metric"], g.get("threshold"))),
        "Status": GUARDRAIL_BADGES.get(g.get("status", ""), g.get("status", "")),
        "Auto-pause": "yes" if g.get("pause") else "no",
    } for g in result.get("guardrails", [])]
    return pd.DataFrame(rows)


def guardrail_reasons(result: Mapping[str, Any], *, variant: str | None = None) -> list[str]:
    """Why each guardrail stands where it does (one line each, user text left unescaped)."""
    return [f"{g['variant']} · {metric_label(g['metric'])}: {g.get('reason', '')}"
            for g in result.get("guardrails", []) if variant is None or g["variant"] == variant]


def experiments_table(items: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [{
        "Key": e["key"],
        "Name": e.get("name", ""),
        "Status": STATUS_BADGES.get(e.get("status", ""), e.get("status", "")) + (" · 🗄️ archived" if e.get("archived_at") else ""),
        "Owner": e.get("owner") or "—",
        "Traffic": fmt_pct(e.get("traffic"), digits=0),
        "Variants": len(e.get("variants", [])),
        "Layer": e.get("layer") or "—",
        "Started": _date(e.get("started_at")),
    } for e in items]
    return pd.DataFrame(rows, columns=["Key", "Name", "Status", "Owner", "Traffic", "Variants", "Layer", "Started"])


def _date(value: Any) -> str:
    if not value:
        return "—"
    try:
        return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M")
    except (ValueError, TypeError):
        return str(value)


# -- CUPED, power and segments (fields absent from older results are tolerated) ----------
def fmt_duration(seconds: Any) -> str:
    if not _finite(seconds):
        return "—"
    if seconds <= 0:
        return "now"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.0f} s"


def cuped_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """Each CUPED-adjusted treatment row: theta, the variance removed, and the adjusted
    comparison beside the unadjusted one."""
    out = []
    for r in result.get("metrics", []):
        cuped = r.get("cuped")
        if not isinstance(cuped, Mapping):
            continue
        raw = cuped.get("unadjusted") or {}
        m = r["metric"]
        out.append({
            "Metric": metric_label(m), "Variant": r["variant"], "Covariate": str(cuped.get("covariate", "—")),
            "θ (theta)": f"{cuped['theta']:.4g}" if _finite(cuped.get("theta")) else "—",
            "Variance reduction": fmt_pct(cuped.get("variance_reduction")),
            "Adjusted": f"{fmt_pct(r.get('rel_diff'), signed=True)} {_rel_ci(r.get('rel_ci'))}",
            "Adjusted p": fmt_p(r.get("p_value")),
            "Unadjusted": f"{fmt_pct(raw.get('rel_diff'), signed=True)} {_rel_ci(raw.get('rel_ci'))}",
            "Unadjusted p": fmt_p(raw.get("p_value")),
        })
    return pd.DataFrame(out)


def power_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """Per treatment row with a power estimate: units needed per variant for the metric's
    minimum detectable effect, units so far, and the projected time to a decision."""
    out = []
    for r in result.get("metrics", []):
        power = r.get("power")
        if not isinstance(power, Mapping):
            continue
        n, needed = power.get("n"), power.get("n_needed")
        progress = min(1.0, n / needed) if _finite(n) and _finite(needed) and needed > 0 else None
        out.append({
            "Metric": metric_label(r["metric"]), "Variant": r["variant"],
            "MDE": fmt_pct(power.get("mde_rel")),
            "Units": fmt_count(n), "Needed": fmt_count(needed),
            "Progress": fmt_pct(progress, digits=0),
            "Time to decision": fmt_duration(power.get("seconds_to_decision")) if _finite(power.get("seconds_to_decision"))
            else ("reached" if progress == 1.0 else "unknown (no traffic rate yet)"),
        })
    return pd.DataFrame(out)


def segment_tables(result: Mapping[str, Any]) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """Per segment dimension: (dimension, rows, heterogeneity) ready for ``st.dataframe``."""
    out = []
    for seg in result.get("segments") or []:
        dimension = str(seg.get("dimension", "?"))
        rows = pd.DataFrame([{
            "Segment": str(r.get("value")), "Metric": metric_label(str(r.get("metric"))), "Variant": str(r.get("variant")),
            "n": fmt_count(r.get("n")), "Estimate": fmt_value(str(r.get("metric")), r.get("estimate")),
            "Relative": fmt_pct(r.get("rel_diff"), signed=True), "Relative CI": _rel_ci(r.get("rel_ci")),
            "p-value (adj.)": fmt_p(r.get("p_value_adjusted", r.get("p_value"))),
        } for r in seg.get("rows") or []])
        het = pd.DataFrame([{
            "Metric": metric_label(str(h.get("metric"))), "Variant": str(h.get("variant")),
            "Q": f"{h['q']:.3g}" if _finite(h.get("q")) else "—", "df": fmt_count(h.get("df")),
            "p-value": fmt_p(h.get("p_value")),
            "Effect differs by segment": "🚩 yes" if h.get("flagged") else "no",
        } for h in seg.get("heterogeneity") or []])
        out.append((dimension, rows, het))
    return out


# -- variants, segments and custom metrics views ----------------------------------------------
def served(strategy: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A strategy as it is served: a policy strategy is its policy alone (the API spells the
    runtime's defaults beside it on read, which a policy strategy may not hold)."""
    if isinstance(strategy, Mapping) and isinstance(strategy.get("policy"), Mapping):
        return {"policy": strategy["policy"]}
    return strategy


def strategy_changes(strategy: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The factors a strategy sets away from ``baseline`` (default: the runtime's defaults),
    flat (``compression.method``), in the strategy's order; a policy is one factor."""
    from ablab.platform.strategy import Strategy, open_strategy

    mine = open_strategy(served(strategy)).factors()
    base = open_strategy(served(baseline)).factors() if baseline is not None else Strategy().factors()
    return {k: v for k, v in mine.items() if base.get(k) != v}


def _level(value: Any) -> str:
    if isinstance(value, Mapping) and "kind" in value:  # a policy: its kind and arms, not its whole mapping
        arms = value.get("arms")
        return f"{value['kind']} over {', '.join(map(str, arms))}" if isinstance(arms, Mapping) and arms else str(value["kind"])
    return "—" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def strategy_summary(strategy: Mapping[str, Any] | None) -> str:
    """``precision=int8, kv_shards=4``, ``policy=rule over a, b``, or ``baseline``."""
    return ", ".join(f"{k}={_level(val)}" for k, val in strategy_changes(strategy).items()) or "baseline"


def variants_table(exp: Mapping[str, Any], result: Mapping[str, Any]) -> pd.DataFrame:
    """One row per variant: share of traffic, units and requests so far, what its strategy
    changes, the decision."""
    total = sum(float(v.get("weight") or 0) for v in exp.get("variants") or []) or 1.0
    observed = (result.get("srm") or {}).get("observed") or {}
    requests = {r["variant"]: r.get("n") for r in result.get("metrics", []) if r["metric"] == fields.HEADLINE_LATENCY}
    decisions = {d["variant"]: d["decision"] for d in result.get("decisions", [])}
    rows = []
    for v in exp.get("variants") or []:
        key = v["key"]
        status = "control" if key == exp.get("control") else DECISION_BADGES.get(decisions.get(key, ""), "—")
        rows.append({
            "Variant": key + (" ⏸ paused" if v.get("paused") else ""),
            "Weight": fmt_pct(float(v.get("weight") or 0) / total, digits=0),
            "Units": fmt_count(observed.get(key)),
            "Requests": fmt_count(requests.get(key)),
            "Decision": status,
            "Strategy": strategy_summary(v.get("strategy")),
        })
    return pd.DataFrame(rows, columns=["Variant", "Weight", "Units", "Requests", "Decision", "Strategy"])


def strategy_table(exp: Mapping[str, Any], variant: str) -> pd.DataFrame:
    """The factors a variant sets away from the defaults, beside the control's level."""
    by_key = {v["key"]: v for v in exp.get("variants") or []}
    mine = by_key[variant].get("strategy")
    control = by_key.get(str(exp.get("control")), {}).get("strategy")
    from ablab.platform.strategy import open_strategy

    control_levels = open_strategy(served(control)).factors()
    changed = {**strategy_changes(mine), **strategy_changes(mine, control)}
    rows = [{"Factor": k, "This variant": _level(v), "Control": _level(control_levels.get(k))} for k, v in changed.items()]
    return pd.DataFrame(rows, columns=["Factor", "This variant", "Control"])


def segment_values_table(segment: Mapping[str, Any], metric: str) -> pd.DataFrame:
    """One row per (segment value, variant) for one metric; control rows carry the estimate only."""
    rows = []
    for r in segment.get("rows") or []:
        if str(r.get("metric")) != metric:
            continue
        treated = r.get("rel_diff") is not None or r.get("p_value") is not None
        rows.append({
            "Segment": str(r.get("value")), "Variant": str(r.get("variant")), "n": fmt_count(r.get("n")),
            "Estimate": fmt_value(metric, r.get("estimate")),
            "Relative (95% CI)": fmt_rel_with_ci(r.get("rel_diff"), r.get("rel_ci")) if treated else "—",
            "p (adj.)": fmt_p(_adjusted_p(r)) if treated else "—",
        })
    return pd.DataFrame(rows, columns=["Segment", "Variant", "n", "Estimate", "Relative (95% CI)", "p (adj.)"])


def segment_detail_table(segment: Mapping[str, Any], value: str) -> pd.DataFrame:
    """Every metric and variant within one segment value."""
    rows = [r for r in segment.get("rows") or [] if str(r.get("value")) == value]
    order = {m: i for i, m in enumerate(ordered_metrics([str(r.get("metric")) for r in rows]))}
    out = []
    for r in sorted(rows, key=lambda r: order[str(r.get("metric"))]):
        metric = str(r.get("metric"))
        treated = r.get("rel_diff") is not None or r.get("p_value") is not None
        out.append({
            "Metric": metric_label(metric), "Variant": str(r.get("variant")), "n": fmt_count(r.get("n")),
            "Estimate": fmt_value(metric, r.get("estimate")),
            "Difference": fmt_value(metric, r.get("abs_diff"), signed=True) if treated else "—",
            "Relative (95% CI)": fmt_rel_with_ci(r.get("rel_diff"), r.get("rel_ci")) if treated else "—",
            "p (adj.)": fmt_p(_adjusted_p(r)) if treated else "—",
        })
    return pd.DataFrame(out, columns=["Metric", "Variant", "n", "Estimate", "Difference", "Relative (95% CI)", "p (adj.)"])


def heterogeneity_table(segment: Mapping[str, Any]) -> pd.DataFrame:
    """Per (metric, treatment): Cochran's Q across the segment values and whether it is flagged."""
    return pd.DataFrame([{
        "Metric": metric_label(str(h.get("metric"))), "Variant": str(h.get("variant")),
        "Q": f"{h['q']:.3g}" if _finite(h.get("q")) else "—", "df": fmt_count(h.get("df")),
        "p-value": fmt_p(h.get("p_value")),
        "Effect differs": "🚩 yes" if h.get("flagged") else "no",
    } for h in segment.get("heterogeneity") or []], columns=["Metric", "Variant", "Q", "df", "p-value", "Effect differs"])


_AGGREGATIONS = {"request": "per request (Σ value ÷ Σ requests, delta method)",
                 "unit_mean": "per unit: each unit's mean (Welch over units with a value)",
                 "unit_sum": "per unit: each unit's total (Welch over all units)"}


def custom_definition(metric: Mapping[str, Any], *, mde: Any = None, lower_is_better: bool | None = None) -> list[tuple[str, str]]:
    """A custom metric's definition (``metrics.custom[i]``) as (field, value) lines, in words;
    ``lower_is_better``: the direction the results resolved when the definition leaves it out."""
    kind = str(metric.get("type", "mean"))
    if kind == "ratio":
        scale = metric.get("scale")
        formula = f"Σ {metric.get('numerator')} ÷ Σ {metric.get('denominator')}" + (f" × {scale:g}" if _finite(scale) and scale != 1 else "")
    elif kind == "quantile":
        q = metric.get("quantile")
        formula = f"p{q * 100:g} of {metric.get('column')}" if _finite(q) else f"a quantile of {metric.get('column')}"
    elif kind == "proportion":
        formula = f"share of requests where {metric.get('column')} = 1"
    else:
        formula = f"mean of {metric.get('column')}"
    lower = metric.get("lower_is_better")
    if lower is None and metric.get("direction") in ("lower", "higher"):
        lower = metric.get("direction") == "lower"
    given = lower is not None
    lower = lower if given else lower_is_better
    direction = "—" if lower is None else ("lower is better" if lower else "higher is better") + ("" if given else " (its source's default)")
    lines = [("Type", kind), ("Computes", formula),
             ("Aggregation", _AGGREGATIONS.get(str(metric.get("aggregation") or "request"), str(metric.get("aggregation")))),
             ("Direction", direction)]
    cuped = metric.get("cuped")
    if isinstance(cuped, Mapping) and cuped.get("covariate"):
        lines.append(("CUPED", f"adjusted by {cuped['covariate']}"))
    if _finite(mde):
        lines.append(("MDE", fmt_pct(mde)))
    return lines


def custom_metric_table(result: Mapping[str, Any], name: str) -> pd.DataFrame:
    """One custom metric's numbers per variant (narrow: it stands beside the definition)."""
    alpha = float(result.get("alpha") or 0.05)
    out = []
    for r in result.get("metrics", []):
        if r["metric"] != name:
            continue
        is_control = r.get("method") == "control"
        out.append({
            "Variant": r["variant"], "Estimate": fmt_value(name, r.get("estimate")),
            "Relative (95% CI)": "—" if is_control else fmt_rel_with_ci(r.get("rel_diff"), r.get("rel_ci")),
            "Verdict": VERDICT_BADGES[verdict(r, alpha)],
        })
    return pd.DataFrame(out, columns=["Variant", "Estimate", "Relative (95% CI)", "Verdict"])
