"""The ablab Streamlit app: ``python -m streamlit run dashboards/asgi.py`` (or ``ablab dashboard``).

Talks only to the ablab HTTP API it was started with (``ABLAB_API_URL``, or one of
``ABLAB_DASHBOARD_API_URLS``); the user signs in with a token and
its scope decides what is offered (a viewer sees no edit buttons). Pages are addressed by
query parameters (``?page=results&exp=<key>``) so links can be shared.

Sign-in starts a server-side session (``ablab.dashboards.session``): the browser keeps only
a random id in an HttpOnly cookie, so a reload or a link opened in another tab lands signed
in on its page. Every run asks the API whether the token still counts, so a revoked or
expired key, an idle or old session, or a sign-out in another tab ends it at the next
interaction, back at sign-in with the page's address kept.
"""

from __future__ import annotations

import streamlit as st

from ablab.dashboards import session
from ablab.dashboards.client import ApiClient, ApiError, allowed_api_urls
from ablab.dashboards.format import md_escape
from ablab.dashboards.views import editor, experiments, login, ope, results
from ablab.dashboards.views.common import Context, current_page, end_session, goto
from ablab.platform.config import get_settings


def _allowed() -> list[str]:
    settings = get_settings()
    return allowed_api_urls(settings.api_url, settings.dashboard_api_urls)


def _restore() -> None:
    """A new page (a load, a reload, a link) takes the cookie's session, once per page."""
    if st.session_state.get("token") or st.session_state.get("_cookie_read"):
        return
    st.session_state["_cookie_read"] = True
    sid = st.context.cookies.get(session.COOKIE)
    if not isinstance(sid, str) or not sid:  # none sent (AppTest's stand-in is no string either)
        return
    found = session.store().get(sid)
    if found is None:
        st.session_state["_signin_notice"] = "Your session has ended (signed out, idle too long, or the dashboard restarted). Sign in again."
        return
    st.session_state.update(api_url=found.api_url, token=found.token, user=found.user, scope=found.scope, _sid=sid)


def _context() -> Context | None:
    _restore()
    token = st.session_state.get("token")
    if not token:
        return None
    if st.session_state.get("api_url", "").rstrip("/") not in _allowed():
        end_session(None)  # signed in to an API this dashboard may no longer use
        return None
    sid = st.session_state.get("_sid")
    if sid is not None and session.store().get(sid) is None:
        end_session("Your session has ended (signed out in another tab, or idle too long). Sign in again.")
        return None
    client = st.session_state.get("_client")
    if client is None or client.base_url != st.session_state["api_url"].rstrip("/"):
        client = ApiClient(st.session_state["api_url"], token)
        st.session_state["_client"] = client
    return Context(client=client, user=st.session_state.get("user", "token"), scope=st.session_state.get("scope", "viewer"))


def _still_valid(ctx: Context) -> ApiError | None:
    """Ask the API whether the token still counts (every run: a revoked key ends the session
    at the next interaction). Ends the session on 401/403 and shows sign-in; returns the
    error when the API could not say (the session is kept)."""
    try:
        ctx.client.check()
    except ApiError as exc:
        if exc.status in (401, 403):
            end_session(f"Your session has ended: the API no longer accepts its key ({md_escape(exc.detail)}). "
                        "Sign in again.", token_refused=True)
            st.rerun()
        return exc
    return None


def _handoff() -> None:
    """Right after sign-in: a same-origin frame trades the one-time code for the cookie."""
    code = st.session_state.get("_handoff")
    if not code:
        return
    if not session.store().pending(code):
        st.session_state.pop("_handoff", None)
        return
    st.iframe(session.script("POST", code, base_url_path=st.get_option("server.baseUrlPath")), height=1,
              alt="sign-in session")


def _sidebar(ctx: Context, page: str, exp: str | None) -> None:
    with st.sidebar:
        st.markdown("## 🧪 ablab")
        st.caption(f"Signed in as **{md_escape(ctx.user)}** ({md_escape(ctx.scope)})")
        if st.button("Experiments", key="nav_list", width="stretch", type="primary" if page == "experiments" else "secondary"):
            goto("experiments")
        if ctx.can_edit and st.button("New experiment", key="nav_new", width="stretch",
                                      type="primary" if page == "new" else "secondary"):
            goto("new")
        if st.button("Policy evaluation", key="nav_ope", width="stretch", type="primary" if page == ope.PAGE else "secondary"):
            goto(ope.PAGE, exp)  # the experiment in view, if any
        st.divider()
        st.caption(f"API: {md_escape(ctx.client.base_url)}")
        if st.button("Sign out", key="nav_signout"):
            sid = st.session_state.get("_sid")
            farewell = session.store().handoff(sid, session.END) if sid else True  # the sign-in page clears the cookie
            session.store().end(sid)  # for every tab and reload of this browser, at once
            for k in list(st.session_state):
                del st.session_state[k]
            st.session_state["_signed_out"] = farewell
            st.session_state["_cookie_read"] = True  # this page's cookie named the session just ended
            st.query_params.clear()
            st.rerun()
        _handoff()


def main() -> None:
    st.set_page_config(page_title="ablab", page_icon="🧪", layout="wide")
    ctx = _context()
    if ctx is None:
        login.render(_allowed())
        return
    problem = _still_valid(ctx)
    page, exp = current_page()  # an ?exp= that is no experiment key is refused there
    _sidebar(ctx, page, exp)
    if problem is not None:
        st.error(f"Could not check the session with the API: {md_escape(problem.detail)}. "
                 "The session is kept; try again in a moment.", icon="⚠️")
        return
    if page == "new":
        editor.render_new(ctx)
    elif page == "edit":
        editor.render_edit(ctx, exp)
    elif page == "results":
        results.render(ctx, exp)
    elif page == ope.PAGE:
        ope.render(ctx, exp)
    else:
        experiments.render(ctx)


main()
