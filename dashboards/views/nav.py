"""Addresses inside the results page: ``?page=results&exp=K&view=V`` plus the view's own
parameters (``variant``, ``dim``, ``value``), so every view and every opened row is a link
that can be shared and that the browser's back button returns to."""

from __future__ import annotations

import streamlit as st

VIEWS = {"overview": "Overview", "variants": "Variants", "segments": "Segments", "metrics": "Custom metrics"}
PARAMS = ("variant", "dim", "value")


def view_params() -> tuple[str, dict[str, str]]:
    """The results view in the URL (``overview`` when absent or unknown) and its parameters."""
    view = st.query_params.get("view", "overview")
    params = {k: st.query_params[k] for k in PARAMS if st.query_params.get(k) is not None}
    return (view if view in VIEWS else "overview"), params


def address(experiment: str, view: str = "overview", **params: str | None) -> None:
    """Point the URL at a view of the results page (no rerun)."""
    st.query_params.clear()
    st.query_params["page"] = "results"
    st.query_params["exp"] = experiment
    if view != "overview":
        st.query_params["view"] = view
    for name, value in params.items():
        if value is not None:
            st.query_params[name] = str(value)


def open_view(experiment: str, view: str = "overview", **params: str | None) -> None:
    """Go to a view of the results page (reruns the whole app)."""
    address(experiment, view, **params)
    st.rerun()
