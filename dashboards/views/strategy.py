"""Strategy pickers (built-in, gateway and declared factors) and the declared-factor panel.

Every picker comes from the factor catalog the API lists (``GET /v1/factors``), so a
factor a deployment declares is offered at once, with its allowed values or range.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards import forms
from ablab.dashboards.client import ApiError
from ablab.dashboards.format import md_escape
from ablab.dashboards.views.common import Context, call, field_error
from ablab.platform.registry.factors.catalog import FactorCatalog
from ablab.platform.strategy import open_strategy

UNSET = "— (not set)"
SECTIONS = (("builtin", "Built-in runtime"), ("gateway", "Gateway"), ("declared", "Declared"))


def load_catalog(ctx: Context) -> tuple[FactorCatalog, list[dict[str, Any]]]:
    """The declared catalog and every listed factor (built-in ones too)."""
    listed = call(ctx.client.factors, what="load the strategy factors") or {"items": []}
    return forms.declared_catalog(listed["items"]), listed["items"]


def _init(key: str, value: Any) -> None:
    if key not in st.session_state:
        st.session_state[key] = value


def factor_widget(prefix: str, factor: forms.Factor, level: Any, *, disabled: bool) -> Any:
    """One picker; returns the chosen level (None = not set)."""
    key = f"{prefix}_{factor.name}"
    label = factor.label
    ranged = factor.minimum is not None and factor.maximum is not None
    # A declared factor's description is an editor's free text, and a help tooltip renders
    # Markdown: shown as text, like names (the built-in descriptions are ours).
    about = md_escape(factor.help) if factor.origin == "declared" else factor.help
    hint = (about + (f" Range {factor.minimum:g}–{factor.maximum:g}." if ranged else "")).strip()
    if factor.kind == "enum" or (factor.kind == "bool" and factor.nullable):
        choices = list(factor.choices) if factor.kind == "enum" else [True, False]
        if factor.nullable:
            choices = [UNSET, *choices]
        _init(key, level if level in choices else (factor.default if factor.default in choices else choices[0]))
        chosen = st.selectbox(label, choices, key=key, help=hint or None, disabled=disabled,
                              format_func=lambda c: c if c == UNSET else json.dumps(c) if isinstance(c, bool) else str(c))
        return None if chosen == UNSET else chosen
    if factor.kind == "bool":
        _init(key, bool(level))
        return st.checkbox(label, key=key, help=hint or None, disabled=disabled)
    if factor.kind in ("int", "float"):
        is_int = factor.kind == "int"
        cast = int if is_int else float
        _init(key, None if level is None else cast(level))
        lo = cast(factor.minimum) if factor.minimum is not None else None
        hi = cast(factor.maximum) if factor.maximum is not None else None
        if factor.nullable:
            hint = (hint + " Leave empty for none.").strip()
        value = st.number_input(label, min_value=lo, max_value=hi, step=1 if is_int else 0.01, key=key,
                                help=hint or None, disabled=disabled, placeholder="none" if factor.nullable else None,
                                format=None if is_int else "%.3f")
        return factor.default if value is None and not factor.nullable else value
    if factor.kind == "json":
        _init(key, json.dumps(level) if level else "")
        text = st.text_area(label, key=key, height=80, disabled=disabled, placeholder='{"temperature": 0.2, "max_tokens": 256}',
                            help=(hint + " A JSON object of request-body overrides; empty for none.").strip())
        try:
            return forms.parse_params(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            st.error(f"params: {exc}", icon="✋")
            return text  # kept as text, so validation refuses the variant
    if factor.kind == "text":
        _init(key, level or "")
        return st.text_area(label, key=key, height=80, help=hint or None, disabled=disabled, placeholder="none").strip() or None
    _init(key, level or "")
    if factor.pattern == r"^[a-z0-9_\-]+$":
        hint = (hint + " Lowercase letters, digits, - and _.").strip()
    text = st.text_input(label, key=key, help=hint or None, disabled=disabled, placeholder="none" if factor.nullable else None)
    return (text.strip() or None) if factor.nullable else text.strip()


def strategy_picker(prefix: str, strategy: dict[str, Any] | None, factors: list[forms.Factor], errors: dict[str, str],
                    error_field: str, *, disabled: bool) -> dict[str, Any]:
    """Pickers for every factor, grouped by origin; returns the nested strategy."""
    try:
        levels = open_strategy(strategy).factors()
    except ValueError:
        levels = {}
    declared_params = {f.name.split(".", 1)[1] for f in factors if f.name.startswith("params.")}
    levels["params"] = {k: v for k, v in (strategy or {}).get("params", {}).items() if k not in declared_params}
    values: dict[str, Any] = {}
    raw_params = None
    for origin, title in SECTIONS:
        group = [f for f in factors if f.origin == origin]
        if not group:
            continue
        st.markdown(f"**{title} factors**")
        cols = st.columns(3)
        for j, factor in enumerate(group):
            with cols[j % 3]:
                values[factor.name] = factor_widget(prefix, factor, levels.get(factor.name), disabled=disabled)
        if isinstance(values.get("params"), str):
            raw_params = values.pop("params")
    field_error(errors, error_field)
    nested = forms.strategy_from_factors(values)
    if raw_params is not None:
        nested["params"] = raw_params
    return nested


def factors_panel(ctx: Context, items: list[dict[str, Any]]) -> None:
    """Every factor a strategy may set, and (for editors) a form to declare a new one."""
    with st.expander(f"Strategy factors ({sum(i['origin'] == 'declared' for i in items)} declared)", expanded=False):
        if items:
            st.dataframe(pd.DataFrame([{"Factor": i["name"], "Origin": i["origin"], "Allowed": i["allowed"],
                                        "Default": "" if i.get("default") is None else json.dumps(i["default"]),
                                        "Description": i.get("description") or ""} for i in items]),
                         hide_index=True, width="stretch")
        if not ctx.can_edit:
            return
        st.markdown("**Declare a factor** (your own serving choice, or `params.<field>` to bound a body override)")
        errors = st.session_state.get("factor_errors", {})
        c1, c2, c3 = st.columns(3)
        name = c1.text_input("Name", key="factor_name", placeholder="e.g. engine or params.temperature").strip()
        kind = c2.selectbox("Type", ["enum", "number", "integer", "string", "boolean"], key="factor_type")
        default = c3.text_input("Default (optional)", key="factor_default", help="The level of a variant that leaves the factor out.")
        body: dict[str, Any] = {"name": name, "type": kind}
        if kind == "enum":
            body["values"] = forms.parse_rule_value(st.text_input("Allowed values", key="factor_values", placeholder="e.g. vllm, sglang, tgi"), "in")
        if kind in ("number", "integer"):
            lo_col, hi_col = st.columns(2)
            lo = lo_col.text_input("Minimum (optional)", key="factor_min")
            hi = hi_col.text_input("Maximum (optional)", key="factor_max")
            body.update({k: forms.parse_rule_value(v, "eq") for k, v in (("min", lo), ("max", hi)) if v.strip()})
        if default.strip():
            body["default"] = forms.parse_rule_value(default, "eq") if kind != "string" else default.strip()
        body["description"] = st.text_input("Description", key="factor_description").strip()
        for field in ("name", "type", "values", "min", "max", "default", "description", "body", "form"):
            field_error(errors, field)
        if st.button("Declare factor", key="factor_submit"):
            try:
                made = ctx.client.declare_factor(body)
            except ApiError as exc:
                found = {exc.field or "form": exc.detail}
                for e in exc.errors or []:
                    found.setdefault(e.get("field", "form"), e.get("message", ""))
                st.session_state["factor_errors"] = found
            else:
                st.session_state["factor_errors"] = {}
                st.session_state["flash"] = f"Declared factor `{made['name']}` ({made['allowed']})."
                for k in ("factor_name", "factor_values", "factor_default", "factor_min", "factor_max", "factor_description"):
                    st.session_state.pop(k, None)
            st.rerun()
