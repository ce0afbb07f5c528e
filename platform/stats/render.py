"""Render an analysis result: a rich table for people, flat rows for CSV export (pure)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from typing import Any

CSV_FIELDS = (
    "experiment", "metric", "variant", "n", "units", "estimate", "ci_lo", "ci_hi", "abs_diff", "abs_ci_lo",
    "abs_ci_hi", "rel_diff", "rel_ci_lo", "rel_ci_hi", "p_value", "p_value_adjusted", "method", "coverage", "error",
    "custom", "type", "aggregation", "cuped_theta", "cuped_variance_reduction", "unadjusted_p_value",
    "power_mde_rel", "power_n_needed", "seconds_to_decision",
)


def _num(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:+.2f}%"


def flat_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in result["metrics"]:
        rows.append({
            "experiment": result["experiment"], "metric": r["metric"], "variant": r["variant"], "n": r["n"],
            "units": r.get("units"), "estimate": r["estimate"], "ci_lo": r["ci"][0], "ci_hi": r["ci"][1],
            "abs_diff": r["abs_diff"], "abs_ci_lo": r["abs_ci"][0], "abs_ci_hi": r["abs_ci"][1],
            "rel_diff": r["rel_diff"], "rel_ci_lo": r["rel_ci"][0], "rel_ci_hi": r["rel_ci"][1],
            "p_value": r["p_value"], "p_value_adjusted": r.get("p_value_adjusted"), "method": r["method"],
            "coverage": r.get("coverage"), "error": r.get("error"),
            "custom": r.get("custom"), "type": r.get("type"), "aggregation": r.get("aggregation"),
            "cuped_theta": (r.get("cuped") or {}).get("theta"),
            "cuped_variance_reduction": (r.get("cuped") or {}).get("variance_reduction"),
            "unadjusted_p_value": ((r.get("cuped") or {}).get("unadjusted") or {}).get("p_value"),
            "power_mde_rel": (r.get("power") or {}).get("mde_rel"),
            "power_n_needed": (r.get("power") or {}).get("n_needed"),
            "seconds_to_decision": (r.get("power") or {}).get("seconds_to_decision"),
        })
    return rows


def _duration(seconds: Any) -> str:
    if seconds is None:
        return "–"
    if seconds == 0:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _power(r: Mapping[str, Any]) -> str:
    pw = r.get("power")
    if not pw or pw.get("n_needed") is None:
        return "–"
    return f"{_num(pw['n'], 6)}/{_num(pw['n_needed'], 6)} · {_duration(pw.get('seconds_to_decision'))}"


def _method(r: Mapping[str, Any]) -> str:
    text = str(r["method"]) + (f" ({r['error']})" if r.get("error") else "")
    cu = r.get("cuped")
    if cu:
        text += f" θ={_num(cu['theta'], 3)} −{_num(100 * cu['variance_reduction'], 3) if cu['variance_reduction'] is not None else '–'}% var"
    return text


def to_csv(result: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in flat_rows(result):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def shadow_table(result: Mapping[str, Any]) -> Any:
    """The ``shadows`` rows: each variant's shadows against their own primaries (paired)."""
    from rich.table import Table

    table = Table(title="shadows (each against its own primary: Δ = shadow − primary)")
    for col in ("variant", "metric", "pairs", "primary", "shadow", "Δ", "Δ CI", "p (paired t)", "p adj", "p sign",
                "p Wilcoxon", "coverage"):
        table.add_column(col, justify="left" if col in ("variant", "metric", "coverage") else "right")
    seen: set[str] = set()
    for r in result["shadows"]:
        cov = r.get("coverage") or {}
        text = ""
        if r["variant"] not in seen:  # once per variant
            seen.add(r["variant"])
            text = (f"{cov.get('shadowed', 0)}/{cov.get('chosen', 0)} chosen shadowed · {cov.get('dropped', 0)} dropped · "
                    f"{cov.get('failed', 0)} failed · {cov.get('orphaned', 0)} orphaned")
        p_adj = r.get("p_value_adjusted")
        table.add_row(
            r["variant"], r["metric"], _num(r["n_pairs"], 6), _num(r.get("primary_mean")), _num(r.get("shadow_mean")),
            _num(r.get("mean_diff")), f"[{_num(r['ci'][0])}, {_num(r['ci'][1])}]", _num(r.get("p_value"), 3),
            _num(p_adj, 3), _num(r.get("sign_p_value"), 3), _num(r.get("wilcoxon_p_value"), 3), text,
            style="bold" if p_adj is not None and p_adj < result.get("alpha", 0.05) else None,
        )
    return table


def rich_tables(result: Mapping[str, Any]) -> list[Any]:
    from rich.table import Table

    srm = result["srm"]
    head = Table(title=f"experiment {result['experiment']} — control {result['control']}", show_header=False)
    head.add_row("SRM", f"p = {_num(srm['p_value'])}" + ("  [bold red]MISMATCH[/]" if srm["flagged"] else "  ok"))
    cov = result.get("coverage") or {}
    if cov:
        shares = ", ".join(f"{k} {_num(v['coverage'], 3)}" for k, v in cov["by_variant"].items())
        head.add_row("label coverage", shares + ("  [bold red]DIFFERS[/]" if cov.get("flagged") else ""))
    inf = result.get("inference") or {}
    head.add_row("inference", f"{inf.get('method')} · correction {inf.get('correction')} · α = {result.get('alpha')}")

    metrics = Table(title="metrics")
    for col in ("metric", "variant", "n", "estimate", "CI", "Δ", "Δ%", "Δ% CI", "p", "p adj", "power n/needed · ETA", "method"):
        metrics.add_column(col, justify="left" if col in ("metric", "variant", "method") else "right")
    for r in result["metrics"]:
        p_adj = r.get("p_value_adjusted")
        style = "bold green" if p_adj is not None and p_adj < result.get("alpha", 0.05) else None
        metrics.add_row(
            r["metric"], r["variant"], _num(r["n"], 6), _num(r["estimate"]),
            f"[{_num(r['ci'][0])}, {_num(r['ci'][1])}]", _num(r["abs_diff"]), _pct(r["rel_diff"]),
            "–" if r["rel_ci"][0] is None and r["rel_ci"][1] is None else f"[{_pct(r['rel_ci'][0])}, {_pct(r['rel_ci'][1])}]",
            _num(r["p_value"], 3), _num(p_adj, 3), _power(r), _method(r),
            style=style,
        )
    tables = [head, metrics]
    if result.get("shadows"):
        tables.append(shadow_table(result))
    for seg in result.get("segments") or []:
        st = Table(title=f"segments by {seg['dimension']}")
        for col in ("value", "metric", "variant", "n", "estimate", "Δ%", "Δ% CI", "p", "p adj"):
            st.add_column(col, justify="left" if col in ("value", "metric", "variant") else "right")
        for r in seg["rows"]:
            if r.get("abs_diff") is None and r.get("p_value") is None:
                continue  # control rows: their estimate shows in the treatment's Δ
            st.add_row(r["value"], r["metric"], r["variant"], _num(r["n"], 6), _num(r["estimate"]), _pct(r["rel_diff"]),
                       f"[{_pct(r['rel_ci'][0])}, {_pct(r['rel_ci'][1])}]", _num(r["p_value"], 3), _num(r["p_value_adjusted"], 3))
        flagged = [h for h in seg["heterogeneity"] if h["flagged"]]
        for h in flagged:
            st.add_row("[bold yellow]differs[/]", h["metric"], h["variant"], "", "", "", f"Q = {_num(h['q'], 3)}, df {h['df']}",
                       _num(h["p_value"], 3), "")
        tables.append(st)
    if result.get("guardrails"):
        g = Table(title="guardrails")
        for col in ("variant", "metric", "kind", "status", "reason"):
            g.add_column(col)
        colour = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}
        for row in result["guardrails"]:
            g.add_row(row["variant"], row["metric"], row["kind"], f"[{colour[row['status']]}]{row['status']}[/]", row["reason"])
        tables.append(g)
    d = Table(title="decisions")
    d.add_column("variant")
    d.add_column("decision")
    d.add_column("reasons")
    colour = {"ship": "bold green", "no_ship": "bold red", "keep_running": "yellow"}
    for row in result.get("decisions", []):
        d.add_row(row["variant"], f"[{colour.get(row['decision'], 'white')}]{row['decision']}[/]", "\n".join(row["reasons"]))
    tables.append(d)
    return tables
