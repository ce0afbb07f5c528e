"""Policy evaluation (``?page=ope&exp=K``): type a candidate policy, see what it would have
achieved on the experiment's logged requests (``POST /v1/experiments/{key}/ope``) beside what
each logged variant measured.

The candidate is YAML (``{kind: fixed, arm: X}``, ``{kind: rule, …}``, ``{kind: slo_router, …}``,
docs/policies.md). The answer shows IPS, SNIPS and doubly robust estimates with their 95 %
intervals, the effective sample size and the support warning, then the logged variants' own
means, in a table and a chart. A refusal (422) is shown under the widget it is about, with the
field of the policy it names. The last answer is kept per experiment, so a rerun does not ask
the API again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st
import yaml

from ablab.dashboards.client import ApiError
from ablab.dashboards.format import fmt_count, fmt_interval, fmt_value, md_escape, metric_label
from ablab.dashboards.views.common import Context, goto, show_api_error

PAGE = "ope"
ANSWER = "ope_answer"  # session key: (experiment, answer) of the last evaluation
ESTIMATORS = (("ips", "IPS"), ("snips", "SNIPS"), ("dr", "Doubly robust"))
MAX_POLICY_CHARS = 20_000


def starter(exp: Mapping[str, Any]) -> str:
    """The text area's first content: the candidate "always the control"."""
    return f"kind: fixed\narm: {exp.get('control') or 'control'}\n"


def parse_policy(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The typed YAML as a mapping, or why it is not one (Markdown in the form's words; the
    parser's message, which quotes the text, is escaped)."""
    if not text.strip():
        return None, "Type a policy, e.g. `kind: fixed` and `arm: <variant>`."
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be read"
        return None, f"The policy is not valid YAML{where}: {md_escape(problem)}."
    if not isinstance(value, dict):
        return None, "The policy must be a mapping with a `kind` (fixed, rule or slo_router), not a single value or a list."
    return {str(k): v for k, v in value.items()}, None


def refusal(exc: ApiError) -> tuple[str, str]:
    """``(widget, Markdown)`` for an API refusal: ``metric`` goes under the metric box,
    anything else under the policy, naming the policy's field it is about. The API's words
    quote what was typed, so they are escaped."""
    field = exc.field or ""
    detail = exc.detail
    if field and detail.startswith(f"{field}: "):  # the route prefixes the field; say it once
        detail = detail[len(field) + 2:]
    if field == "metric":
        return "metric", f"**Metric**: {md_escape(detail)}"
    if field in ("", "policy", "body"):
        return "policy", f"**Candidate policy**: {md_escape(detail)}"
    return "policy", f"**Candidate policy**, at {md_escape(field.removeprefix('policy.'))}: {md_escape(detail)}"


def estimates_frame(answer: Mapping[str, Any]) -> pd.DataFrame:
    """One row per estimator of the candidate, then one per logged variant (its measured mean)."""
    rows = []
    for name, label in ESTIMATORS:
        est = answer.get(name) or {}
        ci = list(est.get("ci") or [None, None]) + [None, None]
        rows.append({"what": f"candidate · {label}", "kind": "candidate", "estimate": est.get("estimate"),
                     "lo": ci[0], "hi": ci[1], "n": answer.get("n")})
    for arm in answer.get("logged") or []:
        ci = list(arm.get("ci") or [None, None]) + [None, None]
        rows.append({"what": f"logged · {arm.get('arm')}", "kind": "logged", "estimate": arm.get("estimate"),
                     "lo": ci[0], "hi": ci[1], "n": arm.get("n")})
    return pd.DataFrame(rows, columns=["what", "kind", "estimate", "lo", "hi", "n"])


def estimates_table(answer: Mapping[str, Any]) -> pd.DataFrame:
    metric = str(answer.get("metric", ""))
    frame = estimates_frame(answer)
    return pd.DataFrame({
        "Estimate of": frame["what"],
        metric_label(metric): [fmt_value(metric, x) for x in frame["estimate"]],
        "95% CI": [fmt_interval(metric, [lo, hi]) for lo, hi in zip(frame["lo"], frame["hi"], strict=True)],
        "Requests": [fmt_count(n) for n in frame["n"]],
    })


def estimates_chart(answer: Mapping[str, Any]) -> alt.LayerChart:
    """Each estimator's estimate ± 95 % CI beside each logged variant's measured mean."""
    metric = str(answer.get("metric", ""))
    df = estimates_frame(answer).dropna(subset=["estimate"])
    base = alt.Chart(df).encode(
        y=alt.Y("what:N", title=None, sort=None),
        color=alt.Color("kind:N", title="", scale=alt.Scale(domain=["candidate", "logged"])),
    )
    bars = base.mark_errorbar(ticks=True).encode(x=alt.X("lo:Q", title=metric_label(metric), scale=alt.Scale(zero=False)),
                                                 x2="hi:Q")
    points = base.mark_point(filled=True, size=70).encode(
        x=alt.X("estimate:Q"),
        tooltip=["what", alt.Tooltip("estimate:Q", format=",.4g"), alt.Tooltip("lo:Q", format=",.4g"),
                 alt.Tooltip("hi:Q", format=",.4g"), alt.Tooltip("n:Q", format=",.0f")],
    )
    return (bars + points).properties(title=f"{metric_label(metric)}: the candidate's estimates and the logged variants, "
                                            "with 95% CI", height=max(120, 32 * len(df)))


def render(ctx: Context, key: str | None) -> None:
    st.title("Policy evaluation")
    if not key:
        st.info("Pick an experiment on the Experiments page, then open its policy evaluation "
                "(the sidebar's **Policy evaluation**, or `?page=ope&exp=KEY`).")
        return
    try:
        exp = ctx.client.get_experiment(key)
    except ApiError as exc:
        show_api_error(exc, what=f"load experiment {md_escape(key)}")
        return
    st.caption(f"{md_escape(exp['key'])} · {md_escape(exp.get('name') or '')} · what a candidate policy would have "
               "achieved on this experiment's logged requests (off-policy evaluation).")
    if st.button("📊 Results", key="ope_results"):
        goto("results", key)
    errors: dict[str, str] = st.session_state.pop("ope_errors", None) or {}
    with st.form("ope_form"):
        text = st.text_area("Candidate policy (YAML)", value=starter(exp), height=180, key=f"ope_policy_{key}",
                            max_chars=MAX_POLICY_CHARS,
                            help="`kind: fixed` with `arm: <variant>`, or a `rule` / `slo_router` policy "
                                 "(docs/policies.md). Arms are logged variants, or `<variant>.<arm>`.")
        if "policy" in errors:
            st.error(errors["policy"], icon="✋")  # Markdown, user text escaped
        metric = st.text_input("Metric (optional)", key=f"ope_metric_{key}", max_chars=64,
                               help="Default: the candidate's objective, else the experiment's primary metric.")
        if "metric" in errors:
            st.error(errors["metric"], icon="✋")
        submitted = st.form_submit_button("Evaluate", type="primary")
    if submitted:
        _evaluate(ctx, key, text, metric.strip() or None)
        return
    kept = st.session_state.get(ANSWER)
    if kept and kept[0] == key:
        show_answer(kept[1])


def _evaluate(ctx: Context, key: str, text: str, metric: str | None) -> None:
    policy, problem = parse_policy(text)
    if policy is None:
        st.session_state["ope_errors"] = {"policy": problem or "invalid"}
        st.session_state.pop(ANSWER, None)
        st.rerun()
    try:
        answer = ctx.client.ope(key, policy, metric)
    except ApiError as exc:
        if exc.status == 422:
            widget, message = refusal(exc)
            st.session_state["ope_errors"] = {widget: message}
            st.session_state.pop(ANSWER, None)
            st.rerun()
        show_api_error(exc, what="evaluate the policy")
        return
    st.session_state[ANSWER] = (key, answer)
    st.rerun()


def show_answer(answer: Mapping[str, Any]) -> None:
    metric = str(answer.get("metric", ""))
    candidate = answer.get("candidate") or {}
    st.subheader(f"{metric_label(metric)} under the candidate")
    st.caption(f"Candidate {md_escape(candidate.get('kind', '?'))} · policy hash "
               f"{md_escape(str(candidate.get('policy_hash') or '—')[:12])} · {fmt_count(answer.get('n'))} requests "
               f"from {fmt_count(answer.get('units'))} units")
    support = answer.get("support") or {}
    if support.get("warning"):
        st.warning(md_escape(support["warning"]), icon="🕳️")
    cols = st.columns(4)
    for col, (name, label) in zip(cols, ESTIMATORS, strict=False):
        est = answer.get(name) or {}
        col.metric(label, fmt_value(metric, est.get("estimate")), help=f"95% CI {fmt_interval(metric, est.get('ci'))}")
    ess = answer.get("ess")
    cols[3].metric("Effective sample size", fmt_count(ess),
                   help="(Σw)²/Σw²: how many logged requests the estimates are worth; far below the requests "
                        "means the candidate differs a lot from how traffic was served.")
    st.dataframe(estimates_table(answer), hide_index=True)
    st.altair_chart(estimates_chart(answer))
    for note in answer.get("notes") or []:
        st.caption(md_escape(note))
