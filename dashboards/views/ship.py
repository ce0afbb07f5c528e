"""The results page's ship panel: the decision, and for editors a Ship button with a
confirmation (``POST /v1/experiments/{key}/ship``).

A variant whose decision is ``ship`` (a win on the primary metrics, every guardrail passing)
gets a button; a click asks for confirmation first, saying what changes (a new phase in which
it has all of the experiment's traffic) and what does not (targeting, layer range, holdout).
Editors may also ship another variant anyway, with a reason: the API audits it as forced.
Once shipped, the panel says which variant, since which phase, by whom, and whether forced,
and that the results beside it are the comparison before the ship (their ``window``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from ablab.dashboards.client import ApiError
from ablab.dashboards.format import DECISION_BADGES, md_escape
from ablab.dashboards.views.common import Context, call, show_api_error

PENDING = "ship_pending"  # session key: (experiment, variant, force, reason) awaiting confirmation
DONE = "ship_done"
AUDIT_NOTE = "The decision it shipped on, with its evidence, is in the audit log (action ship)."


def decisions(result: Any) -> dict[str, Mapping[str, Any]]:
    return {str(d.get("variant")): d for d in result.get("decisions") or []}


def shippable(result: Any) -> list[str]:
    """The variants whose decision is ``ship``, in the results' order."""
    return [v for v, d in decisions(result).items() if d.get("decision") == "ship"]


def shipped_text(shipped: Mapping[str, Any]) -> str:
    """One line (Markdown, user text escaped) for the ship in force."""
    when = str(shipped.get("at", ""))[:16].replace("T", " ")
    text = (f"**Shipped {md_escape(shipped['variant'])}**: it has all of this experiment's traffic since phase "
            f"{shipped['phase']} (shipped by {md_escape(shipped.get('actor', '?'))}, {when} UTC)")
    if shipped.get("forced"):
        text += f"; **forced** although its decision was {md_escape(shipped.get('decision') or 'none')}: " \
                f"{md_escape(shipped.get('reason') or '')}"
    return text + "."


def _utc(text: Any) -> str:
    return str(text)[:19].replace("T", " ")


def window_text(shipped: Mapping[str, Any], result: Any) -> str:
    """What the results beside the panel are after a ship (Markdown, user text escaped): the
    comparison before it, from the results' ``window``; traffic since the ship is all the
    shipped variant's and compares nothing, so it is left out of them."""
    variant = md_escape(shipped.get("variant", "?"))
    window = (result.get("window") or {}) if isinstance(result, Mapping) else {}
    bound = window.get("shipped") or {}
    if bound:
        since = f"from {_utc(window['start'])} UTC " if window.get("start") else ""
        text = (f"The results below are the comparison before the ship: events {since}until {_utc(window.get('end'))} "
                f"UTC, the phases before phase {bound['phase']}, under the split the variants had then. Traffic since "
                f"the ship, every unit on {variant}, is not in them, so the split check and the decisions are the ones "
                "the experiment reached.")
    else:  # results read before the ship took effect
        text = (f"Results compare the phases before the ship; traffic since it, every unit on {variant}, is left out "
                "of them.")
    return f"{text} {AUDIT_NOTE}"


def confirm_text(exp: Mapping[str, Any], variant: str, decision: Mapping[str, Any] | None, *, force: bool, reason: str) -> str:
    """What the confirmation says: the change, what stays, and the decision behind it."""
    verdict = DECISION_BADGES.get(str(decision.get("decision")), "—") if decision else "no decision (the control)"
    lines = [
        f"Ship **{md_escape(variant)}** to all of **{md_escape(exp['key'])}**'s traffic? This starts phase "
        f"{int(exp['phase']) + 1}: {md_escape(variant)} gets every unit the experiment assigns, the other variants none, "
        "traffic goes to 100 %" + (", forced test units are cleared" if exp.get("forced") else "") + ".",
        "Targeting, the layer range and the holdout stay: the experiment's population does not change.",
        f"Decision: {verdict}" + ("".join(f"\n- {md_escape(r)}" for r in (decision or {}).get("reasons") or [])),
    ]
    if force:
        lines.append(f"**Forced**, audited with your reason: {md_escape(reason)}")
    return "\n\n".join(lines)


def render(ctx: Context, exp: Mapping[str, Any], result: Any) -> None:
    key = str(exp["key"])
    try:
        shipped = ctx.client.ship_status(key)
    except ApiError as exc:
        if exc.status == 404:  # an API without ship: nothing to offer
            return
        show_api_error(exc, what="read whether it shipped")
        return
    done = st.session_state.pop(DONE, None)
    if shipped:
        st.success(shipped_text(shipped), icon="🚀")
        if done and not done.get("replayed"):
            st.caption("The SDK config and /v1/assign follow within their refresh; the audit log has the ship.")
        st.caption(window_text(shipped, result))
        return
    ready = shippable(result)
    if not ready and not ctx.can_edit:
        return
    with st.container(border=True):
        if ready:
            st.markdown("**Ready to ship:** " + ", ".join(f"**{md_escape(v)}**" for v in ready)
                        + " — a win on the primary metric with every guardrail passing.")
        else:
            st.caption("No variant is ready to ship: none has the decision 🟢 ship yet.")
        if not ctx.can_edit:
            st.caption("An editor can ship it from here.")
            return
        pending = st.session_state.get(PENDING)
        if pending and pending[0] == key:
            _confirm(ctx, exp, result, pending[1], force=pending[2], reason=pending[3])
            return
        for variant in ready:
            if st.button(f"🚀 Ship {variant}", key=f"ship_{variant}", type="primary"):
                st.session_state[PENDING] = (key, variant, False, "")
                st.rerun()
        others = [v["key"] for v in exp.get("variants") or [] if v["key"] not in ready]
        if others:
            with st.expander("Ship a variant anyway (forced, audited)"):
                variant = st.selectbox("Variant", others, key="ship_force_variant")
                reason = st.text_input("Reason (kept in the audit log)", key="ship_force_reason", max_chars=500)
                if st.button("Ship anyway…", key="ship_force", disabled=not reason.strip()):
                    st.session_state[PENDING] = (key, variant, True, reason.strip())
                    st.rerun()


def _confirm(ctx: Context, exp: Mapping[str, Any], result: Any, variant: str, *, force: bool, reason: str) -> None:
    st.warning(confirm_text(exp, variant, decisions(result).get(variant), force=force, reason=reason), icon="🚀")
    yes, no = st.columns([1, 4])
    if yes.button(f"Confirm: ship {variant}", key="ship_confirm", type="primary"):
        st.session_state.pop(PENDING, None)
        answer = call(ctx.client.ship, exp["key"], variant, force=force, reason=reason, what=f"ship {md_escape(variant)}")
        if answer is not None:
            st.session_state[DONE] = {"variant": variant, "replayed": answer.get("replayed")}
            st.rerun()
    elif no.button("Cancel", key="ship_cancel"):
        st.session_state.pop(PENDING, None)
        st.rerun()
