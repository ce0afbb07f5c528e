"""Token login: the user pastes an API token; its scope decides what the UI offers.

The API is the one the dashboard was started with (``ABLAB_API_URL``), or one of the
operator's allow-list (``ABLAB_DASHBOARD_API_URLS``): never a URL a visitor types, which
would turn this server into a proxy to anywhere.

A good token starts a server-side session (``ablab.dashboards.session``); the browser gets
only the session's cookie. The page's address (``?page=…&exp=…``) is left as it is, so a
link that asked for sign-in opens once signed in.
"""

from __future__ import annotations

import streamlit as st

from ablab.dashboards import session
from ablab.dashboards.client import ApiClient, ApiError
from ablab.dashboards.format import md_escape


def render(allowed: list[str]) -> None:
    st.title("ablab")
    st.caption("Online A/B experiments for LLM inference strategies")
    st.subheader("Sign in")
    notice = st.session_state.get("_signin_notice")
    if notice:
        st.warning(notice, icon="🔒")
    farewell = st.session_state.get("_signed_out")
    if farewell:
        st.info("Signed out.", icon="👋")
        if isinstance(farewell, str) and session.store().pending(farewell):
            # the session ended on the server already; this clears the browser's cookie (once)
            st.iframe(session.script("DELETE", farewell, base_url_path=st.get_option("server.baseUrlPath")), height=1,
                      alt="sign-out")
    st.write("Paste an API token. Create one with `ablab keys create --name you --scope editor` "
             "(viewers can read everything; editors and admins can also create and change experiments).")
    if len(allowed) > 1:
        current = st.session_state.get("api_url")
        url = st.selectbox("API", allowed, index=allowed.index(current) if current in allowed else 0, key="login_url",
                           help="The APIs this dashboard's operator allows (ABLAB_API_URL, ABLAB_DASHBOARD_API_URLS).")
    else:
        url = allowed[0]
        st.caption(f"API: {md_escape(url)}")
    token = st.text_input("API token", type="password", key="login_token")
    if st.button("Sign in", type="primary", key="login_submit"):
        if not token.strip():
            st.error("API token: paste a token first", icon="✋")
            return
        if url not in allowed:  # the widget offers nothing else; state could still be stale
            st.error("That API is not one this dashboard may use.", icon="✋")
            return
        client = ApiClient(url, token)
        try:
            who = client.whoami()
        except ApiError as exc:
            st.error(f"Sign-in failed: {md_escape(exc.detail)}", icon="⚠️")
            return
        finally:
            client.close()
        if who.get("scope") == "sdk":
            st.error("This is an SDK token: it can assign and send events, not read the dashboard. Use a viewer, editor or admin token.", icon="✋")
            return
        token, user, scope = token.strip(), str(who.get("name", "token")), str(who.get("scope", "viewer"))
        store = session.store()
        sid = store.create(api_url=url, token=token, user=user, scope=scope)
        for key in ("_signin_notice", "_signed_out"):
            st.session_state.pop(key, None)
        stale = st.session_state.pop("_client", None)
        if stale is not None:
            stale.close()
        st.session_state.update(api_url=url, token=token, user=user, scope=scope, _sid=sid, _handoff=store.handoff(sid))
        st.rerun()
