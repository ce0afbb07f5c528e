"""Create / edit an experiment without writing JSON.

Strategy factors come from the factor catalog: built-in, gateway and declared factors
with their allowed values or ranges (the panel on the New page declares more); weights always
sum to 100 %, errors appear under the field at fault, and saving an edit sends the
version it was based on (``If-Match``), so a concurrent change is reported, not lost.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards import forms
from ablab.dashboards.client import ApiError
from ablab.dashboards.format import (
    HEADLINE_P95,
    METRIC_HELP,
    STATUS_BADGES,
    fmt_pct,
    md_escape,
    metric_label,
    strategy_summary,
)
from ablab.dashboards.views.common import Context, call, field_error, goto
from ablab.dashboards.views.policy_editor import variant_strategy
from ablab.dashboards.views.strategy import factors_panel, load_catalog
from ablab.platform.assignment.targeting import Op
from ablab.platform.fields import COST_FIELD, FIELDS, HEADLINE_LATENCY, SLA_METRIC, SLO_FIELDS
from ablab.platform.registry.factors.catalog import FactorCatalog
from ablab.platform.stats.metrics import METRICS

MAX_VARIANTS = 8
UNITS = ("user", "session", "request")
GUARDRAIL_DEFAULTS = (SLA_METRIC, "accuracy", "error_rate", HEADLINE_P95, COST_FIELD)


def _init(key: str, value: Any) -> None:
    if key not in st.session_state:
        st.session_state[key] = value


# -- pieces --------------------------------------------------------------------------------
def _variants(prefix: str, current: list[dict[str, Any]] | None, errors: dict[str, str], factors: list[forms.Factor],
              *, custom: list[dict[str, Any]], disabled: bool) -> tuple[list[dict[str, Any]], str]:
    defaults = current or [{"key": "control", "weight": 50, "strategy": {}}, {"key": "treatment", "weight": 50, "strategy": {}}]
    _init(f"{prefix}_nvar", len(defaults))
    n = int(st.number_input("Number of variants", min_value=2, max_value=MAX_VARIANTS, key=f"{prefix}_nvar", disabled=disabled))
    total = sum(float(v["weight"]) for v in defaults) or 1.0
    start = [round(100 * float(v["weight"]) / total) for v in defaults] if len(defaults) == n else forms.even_weights(n)
    out: list[dict[str, Any]] = []
    weights: list[int] = []
    for i in range(n):
        base = defaults[i] if i < len(defaults) else {"key": f"variant_{i + 1}", "strategy": {}}
        with st.container(border=True):
            c1, c2 = st.columns([2, 3])
            kkey = f"{prefix}_v{i}_key"
            _init(kkey, base["key"])
            vkey = c1.text_input(f"Variant {i + 1} key", key=kkey, disabled=disabled)
            wkey = f"{prefix}_v{i}_weight"
            if i < n - 1:
                cap = forms.slider_max(weights, n - i - 1)
                _init(wkey, max(1, min(start[i] if i < len(start) else 1, cap)))  # after a ship the others hold 0, below the minimum
                if st.session_state[wkey] > cap:  # an earlier slider grew: keep the total at 100 %
                    st.session_state[wkey] = cap
                w = c2.slider(f"Weight of variant {i + 1} (%)", min_value=1, max_value=cap, key=wkey, disabled=disabled or cap == 1)
            else:
                w = 100 - sum(weights)
                c2.metric(f"Weight of variant {i + 1} (the rest)", f"{w}%")
            weights.append(int(w))
            field_error(errors, f"variants.{i}.key", f"variants.{i}.weight")
            with st.expander(f"Strategy of `{vkey or '?'}`", expanded=False):
                strategy = variant_strategy(f"{prefix}_v{i}", base.get("strategy"), factors, errors, f"variants.{i}.strategy",
                                            custom=custom, disabled=disabled)
            out.append({"key": vkey.strip(), "weight": w, "strategy": strategy})
    field_error(errors, "variants")
    keys = [v["key"] for v in out if v["key"]]
    return out, ", ".join(keys)


def _custom_metrics(prefix: str, current: dict[str, Any], errors: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """``metrics.custom`` as an editable table (add, edit, remove rows) and ``metrics.segments``."""
    st.caption(f"Custom metrics: a mean, proportion, ratio or quantile over a field (e.g. `{HEADLINE_LATENCY}`), "
               "a custom measure (`measures.tool_calls`), a label (`score`, `correct`) or `error`; "
               "CUPED covariate `pre_period` or a source name.")
    key = f"{prefix}_custom"
    _init(key + "_rows", forms.custom_rows(current.get("custom")))
    table = st.data_editor(
        pd.DataFrame(st.session_state[key + "_rows"], columns=list(forms.CUSTOM_COLUMNS)),
        key=key, num_rows="dynamic", use_container_width=True, hide_index=True,
        column_config={
            "name": st.column_config.TextColumn("Name", help="Lower snake case; usable as a primary metric or guardrail."),
            "type": st.column_config.SelectboxColumn("Type", options=list(forms.CUSTOM_TYPES), default="mean"),
            "column": st.column_config.TextColumn("Source", help="mean / proportion / quantile: e.g. score, measures.tool_calls"),
            "numerator": st.column_config.TextColumn("Numerator", help="ratio only"),
            "denominator": st.column_config.TextColumn("Denominator", help="ratio only"),
            "aggregation": st.column_config.SelectboxColumn("Aggregation", options=list(forms.AGGREGATIONS), default="request"),
            "scale": st.column_config.NumberColumn("Scale", help="ratio: multiply by this (1000 = per 1k)"),
            "quantile": st.column_config.NumberColumn("Quantile", min_value=0.0, max_value=1.0, help="quantile only, e.g. 0.9"),
            "lower_is_better": st.column_config.CheckboxColumn("Lower is better", default=False),
            "cuped": st.column_config.TextColumn("CUPED covariate", help="empty, pre_period or a source name"),
        },
    )
    custom = forms.custom_from_rows(table.to_dict("records"))
    for message in forms.errors_under(errors, "metrics.custom"):
        st.error(md_escape(message), icon="✋")
    seg_key = f"{prefix}_segments"
    _init(seg_key, ", ".join(current.get("segments") or []))
    segments = forms.parse_segments(st.text_input(
        "Segments (break results down by)", key=seg_key, placeholder="dims.domain, dims.prompt_length",
        help="A custom dimension of the events (dims.<name>) or an assignment attribute; comma-separated.",
    ))
    for message in forms.errors_under(errors, "metrics.segments"):
        st.error(md_escape(message), icon="✋")
    return custom, segments


def _metrics(prefix: str, current: dict[str, Any] | None, errors: dict[str, str]) -> dict[str, Any]:
    current = current or {}
    custom, segments = _custom_metrics(prefix, current, errors)
    custom_names = [m["name"] for m in custom if m.get("name")]
    names = [*METRICS, *(n for n in custom_names if n not in METRICS)]
    label = lambda m: f"{metric_label(m)} ({m})" if m in METRICS else f"{m} (custom)"
    primary = st.multiselect("Primary metrics (decide ship / don't ship)", names, key=f"{prefix}_primary", format_func=label,
                             default=[m for m in current.get("primary", [HEADLINE_LATENCY]) if m in names],
                             help="Good direction comes from the catalogue: latency and cost lower, accuracy higher; "
                                  "a custom metric's from its Lower-is-better box.")
    field_error(errors, "metrics.primary")
    report = st.multiselect("Also report", names, key=f"{prefix}_report", format_func=label,
                            default=[m for m in (current.get("report") or names) if m in names])
    field_error(errors, "metrics.report")
    st.caption("SLOs for goodput (share of requests meeting every SLO); leave empty for none.")
    slos: dict[str, float] = {}
    cols = st.columns(len(SLO_FIELDS))
    for col, name in zip(cols, SLO_FIELDS):
        key = f"{prefix}_slo_{name}"
        _init(key, (current.get("slos") or {}).get(name))
        with col:
            value = st.number_input(f"{metric_label(name)} SLO ({FIELDS[name].unit})", min_value=0.0, key=key,
                                    placeholder="none", format="%.0f", help=METRIC_HELP.get(name))
        if value:
            slos[name] = float(value)
    field_error(errors, "metrics.slos")
    field_error(errors, "metrics")
    out: dict[str, Any] = {"primary": primary, "report": None if set(report) == set(names) else report, "slos": slos}
    # Sent only when used (or when clearing what the experiment had), so an API that predates
    # them still takes every other edit.
    if custom or current.get("custom"):
        out["custom"] = custom
    if segments or current.get("segments"):
        out["segments"] = segments
    return out


def _guardrails(prefix: str, current: list[dict[str, Any]] | None, errors: dict[str, str]) -> list[dict[str, Any]]:
    current = current or []
    _init(f"{prefix}_ng", len(current))
    n = int(st.number_input("Guardrails", min_value=0, max_value=10, key=f"{prefix}_ng",
                            help="SLA bounds (max/min on the variant's own value) or a non-inferiority margin against control."))
    names = list(METRICS)
    out = []
    for i in range(n):
        base = current[i] if i < len(current) else {"metric": GUARDRAIL_DEFAULTS[i % len(GUARDRAIL_DEFAULTS)], "pause": True}
        c = st.columns([2, 1, 1, 1, 1, 1])
        mkey = f"{prefix}_g{i}_metric"
        _init(mkey, base.get("metric") if base.get("metric") in names else names[0])
        metric = c[0].selectbox(f"Guardrail {i + 1} metric", names, key=mkey, format_func=metric_label)
        bounds = {}
        for col, field, label, tip in (
            (c[1], "max", "SLA max", "Breach when confidently above (same unit as the metric, e.g. ms)."),
            (c[2], "min", "SLA min", "Breach when confidently below (accuracy as a fraction, e.g. 0.75)."),
            (c[3], "margin", "Margin vs control", "Largest tolerated loss against control (absolute unless Relative)."),
        ):
            key = f"{prefix}_g{i}_{field}"
            _init(key, base.get(field))
            with col:
                bounds[field] = st.number_input(label, key=key, help=tip, placeholder="none", format="%.4g")
        rkey, pkey = f"{prefix}_g{i}_relative", f"{prefix}_g{i}_pause"
        _init(rkey, bool(base.get("relative", False)))
        _init(pkey, bool(base.get("pause", True)))
        relative = c[4].checkbox("Relative", key=rkey, help="Margin as a fraction of control's value (0.05 = 5 %).")
        pause = c[5].checkbox("Auto-pause", key=pkey, help="Pause the variant automatically on a breach.")
        field_error(errors, f"guardrails.{i}")
        out.append({"metric": metric, **bounds, "relative": relative, "pause": pause})
    field_error(errors, "guardrails")
    return out


def _targeting(prefix: str, current: list[dict[str, Any]] | None, errors: dict[str, str]) -> list[dict[str, Any]]:
    current = current or []
    _init(f"{prefix}_nt", len(current))
    n = int(st.number_input("Targeting rules (all must match)", min_value=0, max_value=10, key=f"{prefix}_nt"))
    ops = [o.value for o in Op]
    out = []
    for i in range(n):
        base = current[i] if i < len(current) else {"attribute": "", "op": "eq", "value": ""}
        c = st.columns([2, 1, 2])
        akey, okey, vkey = (f"{prefix}_t{i}_{x}" for x in ("attr", "op", "value"))
        _init(akey, base.get("attribute", ""))
        _init(okey, base.get("op", "eq"))
        raw = base.get("value", "")
        _init(vkey, ", ".join(map(str, raw)) if isinstance(raw, list) else ("" if raw == "" else str(raw)))
        attribute = c[0].text_input(f"Rule {i + 1} attribute", key=akey, placeholder="e.g. country")
        op = c[1].selectbox("Operator", ops, key=okey)
        text = c[2].text_input("Value", key=vkey, help="For in / not_in: a comma-separated list.", placeholder="e.g. us, ca")
        field_error(errors, f"targeting.{i}")
        out.append({"attribute": attribute.strip(), "op": op, "value": forms.parse_rule_value(text, op)})
    field_error(errors, "targeting")
    return out


def _split(weights: dict[str, float], traffic: float, holdout: float) -> None:
    rows = forms.split_preview(weights, traffic=traffic, holdout=holdout)
    st.markdown("**Split preview**: where all units go")
    st.dataframe(pd.DataFrame([{"Segment": r["segment"], "Share of all units": 100 * r["share"]} for r in rows]), hide_index=True,
                 column_config={"Share of all units": st.column_config.ProgressColumn(format="%.1f%%", min_value=0, max_value=100)})


# -- the form ------------------------------------------------------------------------------
def _form(ctx: Context, prefix: str, current: dict[str, Any] | None, errors: dict[str, str], catalog: FactorCatalog, *,
          creating: bool) -> dict[str, Any]:
    body: dict[str, Any] = {}
    st.subheader("Basics")
    c1, c2 = st.columns(2)
    with c1:
        if creating:
            _init(f"{prefix}_key", "")
            body["key"] = st.text_input("Key", key=f"{prefix}_key", placeholder="e.g. prompt-compression-v1",
                                        help="Lowercase letters, digits, - and _; used in SDK calls and URLs.").strip()
            field_error(errors, "key")
        _init(f"{prefix}_name", (current or {}).get("name", ""))
        body["name"] = st.text_input("Name", key=f"{prefix}_name", placeholder="What is being tried").strip()
        field_error(errors, "name")
        _init(f"{prefix}_owner", (current or {}).get("owner", "") or (ctx.user if creating else ""))
        body["owner"] = st.text_input("Owner", key=f"{prefix}_owner").strip()
        field_error(errors, "owner")
    with c2:
        _init(f"{prefix}_hyp", (current or {}).get("hypothesis", ""))
        body["hypothesis"] = st.text_area("Hypothesis", key=f"{prefix}_hyp", height=120,
                                          placeholder="e.g. Entropy pruning cuts p95 latency by 10% at no accuracy loss.")
        field_error(errors, "hypothesis")

    st.subheader("Who is in it")
    c1, c2, c3 = st.columns(3)
    _init(f"{prefix}_traffic", int(round(100 * float((current or {}).get("traffic", 1.0)))))
    traffic_pct = c1.slider("Traffic (% of eligible units)", 0, 100, key=f"{prefix}_traffic", disabled=not creating,
                            help=None if creating else "Use Ramp above to change the traffic of an existing experiment.")
    body["traffic"] = traffic_pct / 100
    with c1:
        field_error(errors, "traffic")
    holdout_fraction = 0.0
    if creating:
        _init(f"{prefix}_unit", "user")
        body["unit"] = c2.selectbox("Unit of randomization", UNITS, key=f"{prefix}_unit",
                                    help="user: same variant for a person across sessions; request: each request drawn anew.")
        layers = call(ctx.client.layers, what="load layers") or []
        holdouts = call(ctx.client.holdouts, what="load holdouts") or []
        layer = c2.selectbox("Layer (mutually exclusive experiments)", ["none", *[lay["key"] for lay in layers]], key=f"{prefix}_layer")
        if layer != "none":
            body["layer"] = layer
            free = next((lay["free_share"] for lay in layers if lay["key"] == layer), 1.0)
            _init(f"{prefix}_lshare", max(1, min(100, int(100 * free))))
            body["layer_share"] = c2.slider(f"Share of the layer (free: {fmt_pct(free, digits=0)})", 1, 100, key=f"{prefix}_lshare") / 100
        with c2:
            field_error(errors, "unit", "layer", "layer_share")
        hold = c3.selectbox("Holdout (kept on the baseline)", ["none", *[h["key"] for h in holdouts]], key=f"{prefix}_holdout")
        if hold != "none":
            body["holdout"] = hold
            holdout_fraction = next((h["fraction"] for h in holdouts if h["key"] == hold), 0.0)
        with c3:
            field_error(errors, "holdout")
    else:
        c2.markdown(f"**Unit:** {current['unit']}  \n**Layer:** {current.get('layer') or '—'}  \n**Holdout:** {current.get('holdout') or '—'}")

    st.subheader("Variants")
    lock = False
    if not creating:
        st.checkbox("Change variants or weights (starts a new phase: units are reshuffled, earlier data kept apart)",
                    key=f"{prefix}_newphase")
        lock = not st.session_state[f"{prefix}_newphase"]
    variants, _ = _variants(prefix, (current or {}).get("variants"), errors, forms.strategy_factors(catalog),
                            custom=list(((current or {}).get("metrics") or {}).get("custom") or []), disabled=lock)
    body["variants"] = [{**v, "weight": float(v["weight"])} for v in variants]
    keys = [v["key"] for v in variants if v["key"]] or ["control"]
    _init(f"{prefix}_control", (current or {}).get("control", keys[0]))
    if st.session_state[f"{prefix}_control"] not in keys:
        st.session_state[f"{prefix}_control"] = keys[0]
    body["control"] = st.selectbox("Control (the baseline others are compared with)", keys, key=f"{prefix}_control")
    field_error(errors, "control")
    _split({v["key"] or f"variant {i + 1}": v["weight"] for i, v in enumerate(variants)}, body["traffic"], holdout_fraction)

    st.subheader("Metrics and guardrails")
    body["metrics"] = _metrics(prefix, (current or {}).get("metrics"), errors)
    body["guardrails"] = _guardrails(prefix, (current or {}).get("guardrails"), errors)
    st.subheader("Targeting")
    body["targeting"] = _targeting(prefix, (current or {}).get("targeting"), errors)
    if not creating and lock:
        body.pop("variants")
    if not creating and not lock:
        body["new_phase"] = True
    return body


def render_new(ctx: Context) -> None:
    st.title("New experiment")
    if not ctx.can_edit:
        st.warning("Your token is read-only (viewer): ask an editor to create experiments.", icon="🔒")
        return
    prefix = "new"
    if st.session_state.get("flash"):
        st.success(st.session_state.pop("flash"))
    catalog, listed = load_catalog(ctx)
    factors_panel(ctx, listed)
    errors = st.session_state.get(f"{prefix}_errors", {})
    if errors.get("form"):
        st.error(md_escape(errors["form"]), icon="⚠️")
    body = _form(ctx, prefix, None, errors, catalog, creating=True)
    if st.button("Create experiment", type="primary", key="new_submit"):
        found = forms.validate_create(body, catalog)
        if not found:
            try:
                created = ctx.client.create_experiment(body)
            except ApiError as exc:
                found = {exc.field or "form": exc.detail}
                for e in exc.errors or []:
                    found.setdefault(e.get("field", "form"), e.get("message", ""))
            else:
                for k in [k for k in st.session_state if str(k).startswith(prefix + "_")]:
                    del st.session_state[k]
                st.session_state["flash"] = f"Created experiment `{created['key']}` (draft). Start it when you are ready."
                goto("edit", created["key"])
        st.session_state[f"{prefix}_errors"] = found
        st.rerun()


def _lifecycle(ctx: Context, exp: dict[str, Any], version: int) -> None:
    status = exp["status"]
    allowed = {"start": status in ("draft", "paused"), "pause": status == "running", "stop": status != "stopped"}
    pending = st.session_state.get("pending_action")
    cols = st.columns(5)
    for col, action, label in ((cols[0], "start", "▶️ Start" if status == "draft" else "▶️ Resume"),
                               (cols[1], "pause", "⏸️ Pause"), (cols[2], "stop", "⏹️ Stop")):
        if col.button(label, key=f"lc_{action}", disabled=not allowed[action]):
            st.session_state["pending_action"] = {"action": action, "key": exp["key"]}
            st.rerun()
    if cols[3].button("📈 Ramp", key="lc_ramp", disabled=status == "stopped"):
        st.session_state["pending_action"] = {"action": "ramp", "key": exp["key"]}
        st.rerun()
    if cols[4].button("📊 Results", key="lc_results"):
        goto("results", exp["key"])
    if not pending or pending.get("key") != exp["key"]:
        return
    action = pending["action"]
    with st.container(border=True):
        if action == "ramp":
            st.slider("New traffic (%)", 0, 100, value=int(round(exp["traffic"] * 100)), key="ramp_to")
            question = f"Ramp `{exp['key']}` from {fmt_pct(exp['traffic'], digits=0)} to {st.session_state['ramp_to']}% of traffic?"
        else:
            extra = " Stopping is final: a stopped experiment cannot be restarted." if action == "stop" else ""
            question = f"{action.capitalize()} `{exp['key']}`?{extra}"
        st.warning(question, icon="❓")
        c1, c2 = st.columns(2)
        if c1.button(f"Yes, {action}", type="primary", key="lc_confirm"):
            try:
                if action == "ramp":
                    ctx.client.update_experiment(exp["key"], {"traffic": st.session_state["ramp_to"] / 100}, version=version)
                else:
                    ctx.client.lifecycle(exp["key"], action, version=version)
            except ApiError as exc:
                st.session_state["flash_error"] = _conflict_message(exc)
            else:
                st.session_state["flash"] = f"Done: {action} `{exp['key']}`."
                st.session_state.pop(f"loaded_{exp['key']}", None)
            st.session_state.pop("pending_action", None)
            st.rerun()
        if c2.button("Cancel", key="lc_cancel"):
            st.session_state.pop("pending_action", None)
            st.rerun()


def _conflict_message(exc: ApiError) -> str:
    if exc.status == 412:
        return ("Someone else changed this experiment after you opened it, so nothing was saved. "
                "Click **Reload latest** to see their change, then make yours again.")
    return md_escape(exc.detail) + (f" (field `{md_escape(exc.field)}`)" if exc.field else "")


def _audit(ctx: Context, key: str) -> None:
    with st.expander("Audit history", expanded=False):
        entries = call(ctx.client.audit, key, what="load the audit history") or []
        if not entries:
            st.info("No changes recorded yet.")
            return
        rows = [{"When (UTC)": pd.Timestamp(e["at"]).strftime("%Y-%m-%d %H:%M:%S"), "Who": e["actor"], "What": e["action"],
                 "Changed": ", ".join(sorted(k for k in (e.get("after") or {}) if (e.get("before") or {}).get(k) != (e.get("after") or {}).get(k)))[:200] or "—"}
                for e in entries]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def render_edit(ctx: Context, key: str | None) -> None:
    if not key:
        st.info("Pick an experiment on the Experiments page first.")
        return
    latest = call(ctx.client.get_experiment, key, what=f"load experiment `{key}`")
    if latest is None:
        return
    snapshot = st.session_state.setdefault(f"loaded_{key}", latest)
    version = snapshot["version"]
    st.title(md_escape(latest["name"]))
    st.caption(f"`{latest['key']}` · {STATUS_BADGES.get(latest['status'], latest['status'])} · version {latest['version']} · "
               f"phase {latest['phase']} · owner {md_escape(latest.get('owner') or '—')} · "
               f"traffic {fmt_pct(latest['traffic'], digits=0)}")
    for flash, show in (("flash", st.success), ("flash_error", st.error)):
        if st.session_state.get(flash):
            show(st.session_state.pop(flash))
    if latest["version"] != version:
        st.warning(f"This experiment changed since you opened it (you have version {version}, the latest is "
                   f"{latest['version']}). Saving now would be refused.", icon="🔄")
    if st.button("🔄 Reload latest", key="edit_reload"):
        st.session_state.pop(f"loaded_{key}", None)
        for k in [k for k in st.session_state if str(k).startswith(f"edit_{key}_")]:
            del st.session_state[k]
        st.rerun()
    if ctx.can_edit:
        _lifecycle(ctx, latest, version)
    else:
        st.info("Read-only: your token is a viewer token.", icon="🔒")
        if st.button("📊 Results", key="ro_results"):
            goto("results", key)
    prefix = f"edit_{key}_{version}"
    errors = st.session_state.get(f"{prefix}_errors", {})
    if not ctx.can_edit:
        _summary(latest)
    else:
        catalog, _ = load_catalog(ctx)
        body = _form(ctx, prefix, snapshot, errors, catalog, creating=False)
        wanted = forms.diff_update(snapshot, body)
        if "new_phase" in body:
            wanted["new_phase"] = True
        if st.button("Save changes", type="primary", key="edit_save", disabled=not wanted):
            found = forms.validate_update(wanted, catalog)
            if not found:
                try:
                    ctx.client.update_experiment(key, wanted, version=version)
                except ApiError as exc:
                    if exc.status == 412:
                        st.session_state["flash_error"] = _conflict_message(exc)
                    else:
                        found = {exc.field or "form": exc.detail}
                else:
                    st.session_state["flash"] = "Saved."
                    st.session_state.pop(f"loaded_{key}", None)
            st.session_state[f"{prefix}_errors"] = found
            st.rerun()
        if errors.get("form"):
            st.error(md_escape(errors["form"]), icon="⚠️")
    _audit(ctx, key)


def _summary(exp: dict[str, Any]) -> None:
    st.subheader("Variants")
    st.dataframe(pd.DataFrame([{"Variant": v["key"] + (" (control)" if v["key"] == exp["control"] else ""),
                                "Weight": fmt_pct(v["weight"] / (sum(x["weight"] for x in exp["variants"]) or 1), digits=0),
                                "Strategy": strategy_summary(v["strategy"])}
                               for v in exp["variants"]]), hide_index=True, width="stretch")
    if exp.get("guardrails"):
        st.subheader("Guardrails")
        st.dataframe(pd.DataFrame(exp["guardrails"]), hide_index=True, width="stretch")
