"""The results page's live parts and its waiting state.

The refresh control (off, 5, 10 or 30 s) drives an ``st.fragment(run_every=...)``: the
fragment fetches the results and the 10 s windows again and redraws only itself (the
numbers' timestamp, the window count, units and decisions, the per-variant table and the
window chart), never the whole page.

An experiment with no events yet waits in a fragment too. It says why it is waiting: not
started, or the LLM backend its variants name (``strategy.backend``) is not serving yet
(``GET /v1/backends``: a llama.cpp backend whose wheel is building shows the build's
percentage); the first events re-run the whole page.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

from ablab.dashboards.client import ApiClient, ApiError
from ablab.dashboards.format import md_escape

REFRESH_CHOICES: dict[str, float | None] = {"Off": None, "5 s": 5.0, "10 s": 10.0, "30 s": 30.0}
DEFAULT_REFRESH = "10 s"
BACKEND_KINDS = {"llamacpp": "llama.cpp", "vllm": "vLLM", "openai": "OpenAI-compatible"}


def refresh_control(container: Any = st) -> float | None:
    """The auto-refresh interval the user picked (seconds), or None for off."""
    if st.session_state.get("res_refresh") is None:  # a click on the chosen option deselects it
        st.session_state["res_refresh"] = DEFAULT_REFRESH
    choice = container.segmented_control("Auto-refresh", list(REFRESH_CHOICES), key="res_refresh",
                                         help="How often the live parts (windows, units, decisions, the table) "
                                              "fetch new numbers; the rest of the page stays as it is.")
    return REFRESH_CHOICES.get(choice or DEFAULT_REFRESH)


def run_live(draw: Callable[[], None], every: float | None) -> None:
    """``draw`` as a fragment rerun every ``every`` seconds (or once, when off)."""
    if every:
        st.fragment(draw, run_every=every)()
    else:
        st.fragment(draw)()


def now_utc() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def window_count(series: Any) -> tuple[int, str | None]:
    """Distinct 10 s windows in a time series response, and the latest one's start."""
    starts = {p["ts"] for s in (series.get("series") or []) for p in (s.get("points") or [])}
    return len(starts), (max(starts) if starts else None)


def fmt_window(ts: str | None) -> str:
    if not ts:
        return "—"
    try:
        stamp = pd.Timestamp(ts)
    except (TypeError, ValueError):
        return md_escape(ts)
    return stamp.strftime("%H:%M:%S") if stamp.date() == datetime.now(UTC).date() else stamp.strftime("%Y-%m-%d %H:%M:%S")


# -- waiting ---------------------------------------------------------------------------------
def fetch_backends(client: ApiClient) -> list[dict[str, Any]] | None:
    """``GET /v1/backends``; None when this API has no such route or cannot answer."""
    try:
        return client.backends()
    except ApiError:
        return None


def named_backends(exp: dict[str, Any]) -> list[str]:
    """The backends the variants' strategies name (the gateway factor ``backend``), in order."""
    names = [str((v.get("strategy") or {}).get("backend")) for v in exp.get("variants") or []
             if (v.get("strategy") or {}).get("backend")]
    return list(dict.fromkeys(names))


def backend_line(name: str, row: dict[str, Any] | None) -> str:
    """One backend's state in words (Markdown, user text escaped)."""
    if row is None:
        return (f"Backend **{md_escape(name)}** is not one this API knows (the gateway's `ABLAB_GATEWAY_BACKENDS`, or "
                "the demo's gateway config): its state cannot be shown.")
    kind = BACKEND_KINDS.get(str(row.get("kind")), md_escape(row.get("kind") or "?"))
    state = str(row.get("state"))
    detail = md_escape(row.get("detail") or "")
    if state == "serving":
        return f"Backend **{md_escape(name)}** ({kind}) is serving; the first events arrive with its first answers."
    if state == "building":
        progress = row.get("progress")
        built = f"{int(progress * 100)}% built" if isinstance(progress, (int, float)) else "building"
        return f"Backend **{md_escape(name)}** ({kind}) is not serving yet: {detail or built}. It joins when the build is done."
    if state == "starting":
        return f"Backend **{md_escape(name)}** ({kind}) is starting: {detail}."
    return f"Backend **{md_escape(name)}** ({kind}) is not serving: {detail or md_escape(state)}."


def waiting(client: ApiClient, exp: dict[str, Any], *, every: float | None, has_data: Callable[[], bool]) -> None:
    """The page of an experiment without events: why, and (live) the backend's progress."""
    if exp["status"] == "draft":
        st.info("No events for this experiment yet: it has not started. Start it on the settings page; inference "
                "services then send events through the SDK, the gateway or `POST /v1/events`.", icon="⏳")
        return
    names = named_backends(exp)
    first = {"run": True}  # the full run has just looked; a fragment rerun looks again

    def draw() -> None:
        if not first.pop("run", False) and has_data():
            st.rerun()  # the first events: the whole page, with its tables
        st.caption(f"Checked at {now_utc()} UTC" + (f" · checks again every {every:.0f} s" if every else
                                                     " · auto-refresh is off"))
        if not names:
            st.info("No events for this experiment yet. Events appear within a few seconds of arriving: inference "
                    "services send them through the SDK, the gateway or `POST /v1/events`.", icon="⏳")
            return
        rows = fetch_backends(client)
        known = {str(r.get("name")): r for r in rows or []}
        waiting_on = [n for n in names if (known.get(n) or {}).get("state") != "serving"]
        if rows is None:
            st.info(f"No events for this experiment yet. Its variants are served by {', '.join(f'**{md_escape(n)}**' for n in names)}; "
                    "this API does not report backends' state (`GET /v1/backends`).", icon="⏳")
            return
        head = ("Waiting for the backend to serve" if waiting_on else "Waiting for the first events")
        st.info(f"{head}: no events for this experiment yet.", icon="⏳")
        for name in names:
            row = known.get(name)
            st.markdown(backend_line(name, row))
            progress = (row or {}).get("progress")
            if (row or {}).get("state") == "building" and isinstance(progress, (int, float)):
                st.progress(min(1.0, max(0.0, float(progress))), text=f"{md_escape(name)}: {int(progress * 100)}% built")

    run_live(draw, every)
