"""Guardrails (SLA and non-inferiority), the per-variant decision, and breach detection.

All pure: they read the engine's metric rows (:class:`.result_models.MetricRow`) and
return result models with the reasons spelled out, so the API and the audit log can show
*why* a variant shipped, stopped or got paused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from . import result_models as rm
from .spec import ExperimentSpec, Guardrail

Row = rm.MetricRow


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.4g}"


def _finite(*xs: float | None) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _bounds(interval: list[float | int | None]) -> tuple[float, float] | None:
    lo, hi = interval
    return (float(lo), float(hi)) if lo is not None and hi is not None and _finite(lo, hi) else None


def _sla(g: Guardrail, row: Row) -> tuple[str, str]:
    bounds = _bounds(row.ci)
    est = row.estimate
    if bounds is None:
        return "inconclusive", f"{g.metric}: no data yet"
    lo, hi = bounds
    shown = f"{g.metric} = {_fmt(est)} (CI {_fmt(lo)}–{_fmt(hi)})"
    if g.max is not None and lo > g.max:
        return "fail", f"{shown} is above the SLA max {_fmt(g.max)}"
    if g.min is not None and hi < g.min:
        return "fail", f"{shown} is below the SLA min {_fmt(g.min)}"
    if (g.max is None or hi <= g.max) and (g.min is None or lo >= g.min):
        return "pass", f"{shown} is within the SLA"
    return "inconclusive", f"{shown} straddles the SLA bound"


def _non_inferiority(spec: ExperimentSpec, g: Guardrail, row: Row) -> tuple[str, str]:
    lower_is_better = spec.metric_def(g.metric).lower_is_better
    bounds = _bounds(row.rel_ci if g.relative else row.abs_ci)
    diff = row.rel_diff if g.relative else row.abs_diff
    unit = "relative" if g.relative else "absolute"
    if bounds is None or g.margin is None:
        return "inconclusive", f"{g.metric}: no comparison yet ({row.error or 'no data'})"
    lo, hi = bounds
    shown = f"{g.metric} {unit} change {_fmt(diff)} (CI {_fmt(lo)}–{_fmt(hi)})"
    m = g.margin
    if lower_is_better:
        if hi < m:
            return "pass", f"{shown}: non-inferior within margin {_fmt(m)}"
        if lo > m:
            return "fail", f"{shown}: worse than control by more than the margin {_fmt(m)}"
    else:
        if lo > -m:
            return "pass", f"{shown}: non-inferior within margin {_fmt(m)}"
        if hi < -m:
            return "fail", f"{shown}: worse than control by more than the margin {_fmt(m)}"
    return "inconclusive", f"{shown}: not yet shown non-inferior (margin {_fmt(m)})"


def evaluate_guardrails(spec: ExperimentSpec, rows: Mapping[tuple[str, str], Row]) -> list[rm.Guardrail]:
    out = []
    for g in spec.guardrails:
        variants = [v.key for v in spec.variants] if g.kind == "sla" else spec.treatments
        for variant in variants:
            row = rows.get((g.metric, variant))
            if row is None:
                continue
            status, reason = _sla(g, row) if g.kind == "sla" else _non_inferiority(spec, g, row)
            threshold = g.margin if g.kind == "non_inferiority" else (g.max if g.max is not None else g.min)
            out.append(rm.Guardrail(
                variant=variant, metric=g.metric, kind=g.kind, threshold=threshold, relative=g.relative,
                status=status, pause=g.pause and variant != spec.control, reason=reason,
            ))
    return out


def _primary_verdict(spec: ExperimentSpec, row: Row) -> tuple[str, str]:
    name = row.metric
    p = row.p_value_adjusted
    p = row.p_value if p is None or not math.isfinite(p) else p
    diff, rel = row.abs_diff, row.rel_diff
    if p is None or diff is None or not _finite(p, diff):
        return "unknown", f"{name}: no comparison yet ({row.error or 'no data'})"
    better = (diff < 0) == spec.metric_def(name).lower_is_better
    change = f"{_fmt(100 * rel)}%" if rel is not None and _finite(rel) else _fmt(diff)
    if p < spec.alpha:
        word = "better" if better else "worse"
        return word, f"{name} {word} than control: {change} (p_adj = {_fmt(p)})"
    return "flat", f"{name}: no significant difference yet ({change}, p_adj = {_fmt(p)})"


def decide(
    spec: ExperimentSpec,
    rows: Mapping[tuple[str, str], Row],
    guardrails: Iterable[rm.Guardrail],
    *,
    srm_flagged: bool,
    srm_p: float | None,
    coverage_flagged: bool,
) -> list[rm.Decision]:
    """ship / no_ship / keep_running per treatment, each with its reasons."""
    guardrails = list(guardrails)
    decisions = []
    for variant in spec.treatments:
        blockers: list[str] = []
        waits: list[str] = []
        wins: list[str] = []
        if srm_flagged:
            blockers.append(f"sample ratio mismatch (p = {_fmt(srm_p)}): the split is broken, results are not trustworthy")
        for g in guardrails:
            if g.variant != variant:
                continue
            if g.status == "fail":
                blockers.append(f"guardrail breached: {g.reason}")
            elif g.status == "inconclusive":
                waits.append(f"guardrail pending: {g.reason}")
        uses_accuracy = any(m in ("accuracy", "cost_per_correct") for m in spec.primary) or any(
            g.metric in ("accuracy", "cost_per_correct") for g in spec.guardrails
        )
        if coverage_flagged and uses_accuracy:
            waits.append("label coverage differs between variants: accuracy may be biased")
        for name in spec.primary:
            row = rows.get((name, variant))
            if row is None:
                continue
            verdict, reason = _primary_verdict(spec, row)
            {"worse": blockers, "better": wins, "flat": waits, "unknown": waits}[verdict].append(reason)
        if blockers:
            decision, reasons = "no_ship", blockers
        elif wins and not waits:
            decision, reasons = "ship", [*wins, "all guardrails pass" if spec.guardrails else "no guardrails configured"]
        else:
            decision, reasons = "keep_running", [*waits, *wins]
        decisions.append(rm.Decision(variant=variant, decision=decision, reasons=reasons))
    return decisions


def guardrail_breaches(result: rm.Results) -> list[dict[str, str]]:
    """Variants to pause now, and why, from an analysis result (the API wires the pausing)."""
    out: dict[str, dict[str, str]] = {}
    for g in result.guardrails:
        if g.status == "fail" and g.pause and g.variant != result.control:
            entry = out.setdefault(g.variant, {"variant": g.variant, "metric": g.metric, "reason": g.reason})
            if entry["reason"] != g.reason:
                entry["reason"] += f"; {g.reason}"
    return list(out.values())
