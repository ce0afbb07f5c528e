"""Token login: the user pastes an API token; its scope decides what the UI offers."""

from __future__ import annotations

import streamlit as st

from ablab.dashboards.client import ApiClient, ApiError


def render(default_url: str) -> None:
    st.title("ablab")
    st.caption("Online A/B experiments for LLM inference strategies")
    st.subheader("Sign in")
    st.write("Paste an API token. Create one with `ablab keys create --name you --scope editor` "
             "(viewers can read everything; editors and admins can also create and change experiments).")
    url = st.text_input("API URL", value=st.session_state.get("api_url", default_url), key="login_url")
    token = st.text_input("API token", type="password", key="login_token")
    if st.button("Sign in", type="primary", key="login_submit"):
        if not token.strip():
            st.error("API token: paste a token first", icon="✋")
            return
        client = ApiClient(url, token)
        try:
            who = client.whoami()
        except ApiError as exc:
            st.error(f"Sign-in failed: {exc.detail}", icon="⚠️")
            return
        if who.get("scope") == "sdk":
            st.error("This is an SDK token: it can assign and send events, not read the dashboard. Use a viewer, editor or admin token.", icon="✋")
            return
        st.session_state.update(api_url=url, token=token.strip(), user=who.get("name", "token"), scope=who.get("scope", "viewer"))
        st.rerun()
