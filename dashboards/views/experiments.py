"""The experiments list: status, owner, traffic, start date; filters and search. A click on a
row opens that experiment's results."""

from __future__ import annotations

import streamlit as st

from ablab.dashboards.format import experiments_table, md_escape
from ablab.dashboards.views import tables
from ablab.dashboards.views.common import Context, call, goto

STATUSES = ("any", "draft", "running", "paused", "stopped")


def render(ctx: Context) -> None:
    head, action = st.columns([4, 1])
    head.title("Experiments")
    if ctx.can_edit and action.button("➕ New experiment", type="primary", key="list_new"):
        goto("new")
    f1, f2, f3, f4 = st.columns([1, 1, 2, 1])
    status = f1.selectbox("Status", STATUSES, key="list_status")
    owner = f2.text_input("Owner", key="list_owner", placeholder="anyone")
    query = f3.text_input("Search key or name", key="list_q", placeholder="e.g. compression")
    archived = f4.toggle("Show archived", key="list_archived", help="Archived experiments are read-only and out of traffic.")
    page = call(ctx.client.list_experiments, what="list experiments",
                status=None if status == "any" else status, owner=owner or None, q=query or None,
                archived="include" if archived else None, limit=500)
    if page is None:
        return
    items = page["items"]
    if not items:
        if status != "any" or owner or query or archived:
            st.info("No experiment matches these filters. Clear the search or pick another status.", icon="🔎")
        elif ctx.can_edit:
            st.info("No experiments yet. Click **New experiment** to split traffic between strategies.", icon="🧪")
        else:
            st.info("No experiments yet. Ask an editor to create one; they will show up here.", icon="🧪")
        return
    st.caption(f"{page['total']} experiment{'s' if page['total'] != 1 else ''} · click a row to open its results")
    picked = tables.show(experiments_table(items), key="list_table", open_rows=True, flex=("Name",))
    if picked is not None and picked < len(items):
        goto("results", items[picked]["key"])
    keys = [e["key"] for e in items]
    pick, open_results, open_edit = st.columns([3, 1, 1])
    chosen = pick.selectbox("Or pick one", keys, key="list_pick")
    if open_results.button("📊 Results", key="list_results"):
        goto("results", chosen)
    if open_edit.button("⚙️ Details" if not ctx.can_edit else "✏️ Edit", key="list_edit"):
        goto("edit", chosen)
    if ctx.can_edit:
        _retire(ctx, next(e for e in items if e["key"] == chosen))


def _retire(ctx: Context, exp: dict) -> None:
    """Archive a finished experiment, bring one back, or delete one that never ran."""
    key = exp["key"]
    live = exp["status"] in ("running", "paused")
    c1, c2, _ = st.columns([1, 1, 3])
    if exp.get("archived_at"):
        if c1.button("↩️ Unarchive", key="list_unarchive"):
            if call(ctx.client.archive, key, unarchive=True, what=f"unarchive {md_escape(key)}") is not None:
                st.rerun()
    elif c1.button("🗄️ Archive", key="list_archive", disabled=live,
                   help="Stop it first." if live else "Read-only, out of traffic and of this list; results stay."):
        if call(ctx.client.archive, key, what=f"archive {md_escape(key)}") is not None:
            st.rerun()
    if not exp.get("started_at") and c2.button("🗑️ Delete", key="list_delete", help="Only experiments that never ran."):
        if call(ctx.client.delete_experiment, key, what=f"delete {md_escape(key)}", ok=True) is not None:
            st.rerun()
