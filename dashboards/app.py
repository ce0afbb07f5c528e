"""The ablab Streamlit app: ``python -m streamlit run dashboards/app.py`` (or ``ablab dashboard``).

Talks only to the ablab HTTP API it was started with (``ABLAB_API_URL``, or one of
``ABLAB_DASHBOARD_API_URLS``); the user signs in with a token and
its scope decides what is offered (a viewer sees no edit buttons). Pages are addressed by
query parameters (``?page=results&exp=<key>``) so links can be shared.
"""

from __future__ import annotations

import streamlit as st

from ablab.dashboards.client import ApiClient, allowed_api_urls
from ablab.dashboards.format import md_escape
from ablab.dashboards.views import editor, experiments, login, results
from ablab.dashboards.views.common import Context, current_page, goto
from ablab.platform.config import get_settings


def _allowed() -> list[str]:
    settings = get_settings()
    return allowed_api_urls(settings.api_url, settings.dashboard_api_urls)


def _context() -> Context | None:
    token = st.session_state.get("token")
    if not token:
        return None
    if st.session_state.get("api_url", "").rstrip("/") not in _allowed():
        for k in ("token", "_client", "user", "scope", "api_url"):
            st.session_state.pop(k, None)  # signed in to an API this dashboard may no longer use
        return None
    client = st.session_state.get("_client")
    if client is None or client.base_url != st.session_state["api_url"].rstrip("/"):
        client = ApiClient(st.session_state["api_url"], token)
        st.session_state["_client"] = client
    return Context(client=client, user=st.session_state.get("user", "token"), scope=st.session_state.get("scope", "viewer"))


def _sidebar(ctx: Context, page: str) -> None:
    with st.sidebar:
        st.markdown("## 🧪 ablab")
        st.caption(f"Signed in as **{md_escape(ctx.user)}** ({md_escape(ctx.scope)})")
        if st.button("Experiments", key="nav_list", width="stretch", type="primary" if page == "experiments" else "secondary"):
            goto("experiments")
        if ctx.can_edit and st.button("New experiment", key="nav_new", width="stretch",
                                      type="primary" if page == "new" else "secondary"):
            goto("new")
        st.divider()
        st.caption(f"API: {md_escape(ctx.client.base_url)}")
        if st.button("Sign out", key="nav_signout"):
            for k in list(st.session_state):
                del st.session_state[k]
            st.query_params.clear()
            st.rerun()


def main() -> None:
    st.set_page_config(page_title="ablab", page_icon="🧪", layout="wide")
    ctx = _context()
    if ctx is None:
        login.render(_allowed())
        return
    page, exp = current_page()  # an ?exp= that is no experiment key is refused there
    _sidebar(ctx, page)
    if page == "new":
        editor.render_new(ctx)
    elif page == "edit":
        editor.render_edit(ctx, exp)
    elif page == "results":
        results.render(ctx, exp)
    else:
        experiments.render(ctx)


main()
