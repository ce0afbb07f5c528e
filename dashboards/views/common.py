"""What every page shares: the session context, navigation, and error display."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import streamlit as st

from ablab.dashboards.client import ApiClient, ApiError
from ablab.dashboards.format import md_escape
from ablab.platform.registry.schemas import KEY_PATTERN

PAGES = ("experiments", "new", "edit", "results", "ope")
_KEY = re.compile(KEY_PATTERN)


@dataclass
class Context:
    client: ApiClient
    user: str
    scope: str

    @property
    def can_edit(self) -> bool:
        return self.scope in ("admin", "editor")


_AUTH_KEYS = ("token", "_client", "user", "scope", "api_url", "_sid", "_handoff")


def end_session(notice: str | None, *, token_refused: bool = False) -> None:
    """Sign this tab out and end its server-side session (every tab and reload of the
    browser); ``notice`` is what the sign-in page says about why; ``token_refused``: the API
    answered 401, so every session holding the token ends too. The page's address stays, so
    signing in again lands where the user was going."""
    from ablab.dashboards import session

    sid = st.session_state.get("_sid")
    token = st.session_state.get("token")
    if sid:
        session.store().end(sid)
    if token and token_refused:
        session.store().end_token(token)
    client = st.session_state.get("_client")
    if client is not None:
        client.close()
    for key in _AUTH_KEYS:
        st.session_state.pop(key, None)
    st.session_state["_cookie_read"] = True  # the page's cookie named the session just ended
    if notice:
        st.session_state["_signin_notice"] = notice


def goto(page: str, experiment: str | None = None) -> None:
    st.query_params.clear()
    st.query_params["page"] = page
    if experiment:
        st.query_params["exp"] = experiment
    st.rerun()


def current_page() -> tuple[str, str | None]:
    """The page and experiment key from the URL; an ``exp`` that cannot be an experiment
    key is reported (as plain text) and dropped, so it never reaches an API path."""
    page = st.query_params.get("page", "experiments")
    exp = st.query_params.get("exp")
    if exp is not None and not _KEY.fullmatch(exp):
        st.error(f"No experiment has the key “{md_escape(exp[:100])}”: keys are lower-case letters, digits, "
                 "'-' and '_'. Pick one on the Experiments page.", icon="🔎")
        exp = None
    return (page if page in PAGES else "experiments"), exp


def show_api_error(exc: ApiError, *, what: str) -> None:
    """``what`` is the page's own wording (callers escape any user text in it); the API's
    message quotes user input, so it is escaped here. A 401 means the token was revoked or
    expired since this run began: the session ends and the sign-in page says why."""
    if exc.status == 401:
        end_session(f"Your session has ended: the API no longer accepts its key ({md_escape(exc.detail)}). "
                    "Sign in again.", token_refused=True)
        st.rerun()
    where = f" — field {md_escape(exc.field)}" if exc.field else ""
    st.error(f"Could not {what}: {md_escape(exc.detail)}{where}", icon="⚠️")


def field_error(errors: dict[str, str], *names: str) -> None:
    """The message for this field (or any sub-field of it), right under its widget."""
    for name in names:
        for key, message in errors.items():
            if key == name or key.startswith(name + "."):
                suffix = key[len(name) + 1:] if key != name else ""
                st.error(md_escape(f"{suffix + ': ' if suffix else ''}{message}"), icon="✋")
                return


def call(fn: Any, *args: Any, what: str, ok: bool = False, **kw: Any) -> Any:
    """Run an API call; on failure show why and return None (``ok``: True on success for
    calls that return nothing)."""
    try:
        result = fn(*args, **kw)
    except ApiError as exc:
        show_api_error(exc, what=what)
        return None
    return True if ok and result is None else result
