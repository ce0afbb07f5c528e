"""The policy editor: a variant's strategy as a policy that picks one of its named arms per
request (docs/policies.md), inside the experiment editor's variant box.

Each arm is built with the same factor pickers as an ordinary strategy; the policy's fields
(kind, features, SLO, objective, explore, a rule's conditions and default) each have a widget,
and a refusal the API names (``variants.1.strategy.policy.explore``) shows under that widget.
The mapping is made by :func:`ablab.dashboards.policy_form.policy_strategy`; this module only
lays out widgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from ablab.dashboards import forms
from ablab.dashboards import policy_form as pf
from ablab.dashboards.format import md_escape, metric_label
from ablab.dashboards.views.strategy import strategy_picker
from ablab.platform.policy.spec import LATENCIES, MAX_ARMS, NUMERIC_FEATURES, PER_REQUEST_METRICS

FIXED, POLICY = "fixed", "policy"
MODES = {FIXED: "One strategy", POLICY: "Policy: picks an arm per request"}
KIND_LABELS = {"slo_router": "SLO router (learned: best objective within the SLO)", "rule": "Rule (ordered conditions)"}
STAT_LABELS = {**{q: q for q in pf.SLO_QUANTILES}, pf.MEAN: "mean"}
MAX_CONDITIONS = 8
MAX_RULES = 16


def _init(key: str, value: Any) -> None:
    if key not in st.session_state:
        st.session_state[key] = value


def _show(errors: Mapping[str, str], *names: str) -> None:
    """Every refusal about these policy fields, under the widget."""
    for name in names:
        for message in pf.errors_for(errors, name):
            st.error(md_escape(message), icon="✋")


def variant_strategy(prefix: str, strategy: dict[str, Any] | None, factors: list[forms.Factor], errors: dict[str, str],
                     where: str, *, custom: Sequence[Mapping[str, Any]] = (), disabled: bool) -> dict[str, Any]:
    """A variant's strategy: one strategy (the factor pickers) or a policy over arms."""
    mode_key = f"{prefix}_mode"
    _init(mode_key, POLICY if isinstance((strategy or {}).get("policy"), Mapping) else FIXED)
    mode = st.radio("Strategy type", list(MODES), format_func=MODES.get, key=mode_key, horizontal=True, disabled=disabled)
    if mode == POLICY:
        return policy_picker(f"{prefix}_pol", strategy, factors, errors, where, custom=custom, disabled=disabled)
    return strategy_picker(prefix, None if (strategy or {}).get("policy") else strategy, factors, errors, where,
                           disabled=disabled)


def policy_picker(prefix: str, strategy: dict[str, Any] | None, factors: list[forms.Factor], errors: dict[str, str],
                  where: str, *, custom: Sequence[Mapping[str, Any]] = (), disabled: bool) -> dict[str, Any]:
    """The policy's widgets; returns ``{policy: {...}}``."""
    start = pf.policy_form(strategy)
    problems = pf.policy_errors(errors, where)
    _show(problems, "")
    kind_key = f"{prefix}_kind"
    _init(kind_key, start.kind if start.kind in pf.KINDS else pf.KINDS[0])
    kind = st.selectbox("Policy kind", pf.KINDS, key=kind_key, format_func=KIND_LABELS.get, disabled=disabled)
    _show(problems, "kind")
    arms = _arms(prefix, start, factors, problems, kind, disabled=disabled)
    names = [name for name, _ in arms if name] or ["?"]
    if kind == "slo_router":
        features = _features(prefix, start, problems, disabled=disabled)
        slos = _slos(prefix, start, problems, disabled=disabled)
        objective = _objective(prefix, start, problems, custom, disabled=disabled)
        ekey = f"{prefix}_explore"
        _init(ekey, float(start.explore) if start.explore else pf.DEFAULT_EXPLORE)
        explore = st.number_input("Explore: the probability every arm keeps", min_value=0.001, max_value=0.999, step=0.01,
                                  format="%.3f", key=ekey, disabled=disabled,
                                  help=f"In (0, 1), and at most 1 / arms ({1 / max(2, len(arms)):.3f} with {len(arms)} arms): "
                                       "each arm keeps this probability whatever the model predicts, so the logs "
                                       "keep teaching it. Until a model is fitted the policy explores uniformly.")
        _show(problems, "explore")
        form = pf.PolicyForm(kind=kind, arms=tuple(arms), features=tuple(features), slos=tuple(slos), objective=objective,
                             explore=explore, extra=start.extra)
    else:
        rules = _rules(prefix, start, problems, names, disabled=disabled)
        dkey = f"{prefix}_default"
        _init(dkey, start.default)
        if st.session_state[dkey] not in names:
            st.session_state[dkey] = names[-1]
        default = st.selectbox("Default arm (when no rule matches)", names, key=dkey, disabled=disabled)
        _show(problems, "default")
        ekey = f"{prefix}_explore"
        _init(ekey, float(start.explore or 0.0))
        explore = st.number_input("Explore floor (optional)", min_value=0.0, max_value=0.999, step=0.01, format="%.3f",
                                  key=ekey, disabled=disabled,
                                  help="Each arm keeps this probability, so the rule's logs let off-policy evaluation "
                                       "weigh the other arms; 0: none.")
        _show(problems, "explore")
        form = pf.PolicyForm(kind=kind, arms=tuple(arms), rules=tuple(rules), default=default, explore=explore,
                             extra=start.extra)
    return pf.policy_strategy(form)


def _arms(prefix: str, start: pf.PolicyForm, factors: list[forms.Factor], problems: Mapping[str, str], kind: str, *,
          disabled: bool) -> list[tuple[str, dict[str, Any]]]:
    st.markdown("**Arms**: each an ordinary strategy, named")
    nkey = f"{prefix}_narms"
    least = 2 if kind == "slo_router" else 1
    _init(nkey, max(least, len(start.arms) or 2))
    n = int(st.number_input("Number of arms", min_value=1, max_value=MAX_ARMS, key=nkey, disabled=disabled))
    names = [str(st.session_state.get(f"{prefix}_arm{j}_name") or (start.arms[j][0] if j < len(start.arms) else f"arm_{j + 1}"))
             for j in range(n)]
    out: list[tuple[str, dict[str, Any]]] = []
    for j, tab in enumerate(st.tabs([f"{j + 1}. {name}" for j, name in enumerate(names)])):
        with tab:
            base_name, base = start.arms[j] if j < len(start.arms) else (f"arm_{j + 1}", {})
            key = f"{prefix}_arm{j}_name"
            _init(key, base_name)
            name = st.text_input(f"Arm {j + 1} name", key=key, disabled=disabled,
                                 help="Lowercase letters, digits and _; logged as the request's arm.").strip()
            mine = {f"arms.{name}": m for k, m in problems.items() if k == f"arms.{name}" or k.startswith(f"arms.{name}.")}
            strategy = strategy_picker(f"{prefix}_arm{j}", base, factors, mine, f"arms.{name}", disabled=disabled)
            out.append((name, strategy))
    # the count, or an arm no tab has (renamed since): an arm's own refusal is shown in its tab
    _show({k: m for k, m in problems.items() if k.removeprefix("arms.").split(".")[0] not in names or k == "arms"}, "arms")
    return out


def _features(prefix: str, start: pf.PolicyForm, problems: Mapping[str, str], *, disabled: bool) -> list[str]:
    counts, attrs = pf.split_features(start.features)
    ckey, akey = f"{prefix}_features", f"{prefix}_attrs"
    _init(ckey, counts)
    _init(akey, attrs)
    c1, c2 = st.columns(2)
    picked = c1.multiselect("Features: token counts", list(NUMERIC_FEATURES), key=ckey, disabled=disabled,
                            help="prompt_tokens: the prompt's length; max_tokens: the caller's cap on the answer.")
    typed = c2.text_input("Features: targeting attributes", key=akey, disabled=disabled, placeholder="e.g. plan, region",
                          help="Attribute names the request carries (attr.<name>), comma-separated.")
    _show(problems, "features")
    return [*picked, *pf.attribute_names(typed)]


def _slos(prefix: str, start: pf.PolicyForm, problems: Mapping[str, str], *, disabled: bool) -> list[pf.SloRow]:
    st.markdown("**SLO**: the latency each request's arm must be predicted to meet")
    nkey = f"{prefix}_nslo"
    _init(nkey, max(1, len(start.slos)))
    n = int(st.number_input("Number of SLOs", min_value=1, max_value=pf.MAX_SLOS, key=nkey, disabled=disabled))
    rows = []
    for k in range(n):
        base = start.slos[k] if k < len(start.slos) else pf.SloRow(LATENCIES[0], "p95", None)
        lkey, qkey, bkey = (f"{prefix}_slo{k}_{x}" for x in ("latency", "q", "max"))
        _init(lkey, base.latency)
        _init(qkey, base.statistic)
        _init(bkey, base.bound)
        c = st.columns(3)
        choices = list(dict.fromkeys([*LATENCIES, base.latency]))
        latency = c[0].selectbox(f"SLO {k + 1} latency", choices, key=lkey, format_func=metric_label, disabled=disabled)
        stat = c[1].selectbox("Quantile", list(pf.SLO_STATISTICS), key=qkey, format_func=STAT_LABELS.get, disabled=disabled)
        bound = c[2].number_input("At most (ms)", min_value=0.0, key=bkey, placeholder="bound", format="%.0f", disabled=disabled)
        rows.append(pf.SloRow(latency, stat, bound))
    _show(problems, "slo")
    return rows


def _objective(prefix: str, start: pf.PolicyForm, problems: Mapping[str, str], custom: Sequence[Mapping[str, Any]], *,
               disabled: bool) -> str:
    choices = pf.objective_choices(custom)
    okey = f"{prefix}_objective"
    _init(okey, start.objective or ("accuracy" if "accuracy" in choices else choices[0]))
    if st.session_state[okey] not in choices:
        choices.append(st.session_state[okey])
    objective = st.selectbox("Objective (its direction comes from the metric)", choices, key=okey, accept_new_options=True,
                             disabled=disabled, format_func=lambda m: f"{metric_label(m)} ({m})" if m in PER_REQUEST_METRICS else f"{m} (custom)",
                             help="A built-in per-request mean or proportion, or the experiment's custom mean / "
                                  "proportion metric (type its name if it is new in this form).")
    _show(problems, "objective")
    return str(objective or "")


def _rules(prefix: str, start: pf.PolicyForm, problems: Mapping[str, str], arms: list[str], *,
           disabled: bool) -> list[pf.RuleRow]:
    st.markdown("**Rules**, in order: the first whose conditions all hold picks its arm")
    akey = f"{prefix}_rule_attrs"
    _init(akey, ", ".join(dict.fromkeys(c.feature.removeprefix("attr.") for r in start.rules for c in r.conditions
                                        if c.feature not in NUMERIC_FEATURES)))
    typed = st.text_input("Attributes the rules read", key=akey, disabled=disabled, placeholder="e.g. plan",
                          help="Targeting attributes (attr.<name>) a condition may test, comma-separated.")
    features = pf.rule_features(start, pf.attribute_names(typed))
    nkey = f"{prefix}_nrules"
    _init(nkey, max(1, len(start.rules)))
    n = int(st.number_input("Number of rules", min_value=1, max_value=MAX_RULES, key=nkey, disabled=disabled))
    _show(problems, "rules")
    out = []
    for r in range(n):
        base = start.rules[r] if r < len(start.rules) else pf.RuleRow(arms[0], (pf.ConditionRow(NUMERIC_FEATURES[0], "gt", ""),))
        with st.container(border=True):
            head = st.columns([2, 1])
            rkey, ckey = f"{prefix}_rule{r}_arm", f"{prefix}_rule{r}_ncond"
            _init(rkey, base.arm)
            if st.session_state[rkey] not in arms:
                st.session_state[rkey] = arms[0]
            arm = head[0].selectbox(f"Rule {r + 1}: then arm", arms, key=rkey, disabled=disabled)
            _init(ckey, len(base.conditions))
            m = int(head[1].number_input("Conditions", min_value=0, max_value=MAX_CONDITIONS, key=ckey, disabled=disabled,
                                         help="All must hold; none: the rule always matches."))
            conditions = []
            for c in range(m):
                cb = base.conditions[c] if c < len(base.conditions) else pf.ConditionRow(features[0], "gt", "")
                fkey, okey, vkey = (f"{prefix}_rule{r}_c{c}_{x}" for x in ("feature", "op", "value"))
                _init(fkey, cb.feature)
                _init(okey, cb.op)
                _init(vkey, cb.value)
                if st.session_state[fkey] not in features:
                    st.session_state[fkey] = features[0]
                cols = st.columns([2, 1, 2])
                feature = cols[0].selectbox("Feature", features, key=fkey, disabled=disabled)
                op = cols[1].selectbox("Operator", list(pf.OPS), key=okey, format_func=pf.OP_LABELS.get, disabled=disabled)
                value = cols[2].text_input("Value", key=vkey, disabled=disabled, placeholder="e.g. 800, or pro, team",
                                           help="A number for token counts, text for attributes; in / not in: comma-separated.")
                conditions.append(pf.ConditionRow(feature, op, value))
            _show(problems, f"rules.{r}")
            out.append(pf.RuleRow(arm, tuple(conditions)))
    return out
