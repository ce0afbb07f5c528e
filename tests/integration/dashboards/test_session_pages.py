"""AppTest of the real app against a real API: sign-in starts a server-side session (and
hands the page a one-time code for its cookie, never the session id); a revoked key ends
it at the next run with the page's address kept; sign-out ends it for every tab. The
browser side (the cookie, reloads, links) is tests/browser/test_session_e2e.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
APP = str(Path(__file__).resolve().parents[3] / "dashboards" / "app.py")


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def _key(api, scope: str = "viewer") -> tuple[str, int]:
    with api.client("admin") as admin:
        made = admin.post("/v1/keys", json={"name": f"session-{uuid.uuid4().hex[:8]}", "scope": scope})
        made.raise_for_status()
    return made.json()["token"], made.json()["id"]


def _signed_in(api, token: str, *, page: str = "results", exp: str = "factorial"):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = page
    at.query_params["exp"] = exp
    at.run()
    at.text_input(key="login_token").input(token)
    return at.button(key="login_submit").click().run()


def test_sign_in_starts_a_session_and_hands_the_page_a_code_not_the_id(dashboard_api) -> None:
    from ablab.dashboards import session

    token, _ = _key(dashboard_api)
    at = _signed_in(dashboard_api, token)
    assert at.title[0].value.startswith("Results:")  # the link's page, once signed in
    sid, code = at.session_state["_sid"], at.session_state["_handoff"]
    found = session.store().get(sid)
    assert found is not None and found.token == token and found.api_url == dashboard_api.base_url
    assert session.store().pending(code)
    frames = [str(e.proto.srcdoc) for e in at.get("iframe")]
    assert len(frames) == 1 and code in frames[0]  # the frame that trades the code for the cookie
    page = " ".join([*frames, *(str(e.value) for e in at.markdown), *(str(e.value) for e in at.caption)])
    assert sid not in page and token not in page
    assert session.store().claim(code) is not None  # what the page's frame does
    at.run()
    assert "_handoff" not in at.session_state and not at.get("iframe")  # traded: the frame is gone from later runs


def test_a_revoked_key_ends_the_session_at_the_next_run_and_keeps_the_address(dashboard_api) -> None:
    from ablab.dashboards import session

    token, key_id = _key(dashboard_api)
    at = _signed_in(dashboard_api, token)
    sid = at.session_state["_sid"]
    with dashboard_api.client("admin") as admin:
        admin.delete(f"/v1/keys/{key_id}").raise_for_status()
    at.run()
    assert at.title[0].value == "ablab" and "token" not in at.session_state
    assert "Your session has ended" in _texts(at.warning) and "revoked" in _texts(at.warning)
    assert session.store().get(sid) is None
    assert (at.query_params["page"], at.query_params["exp"]) == ("results", "factorial")  # sign-in lands there


def test_sign_out_ends_the_session_for_every_tab(dashboard_api) -> None:
    from ablab.dashboards import session

    token, _ = _key(dashboard_api)
    at = _signed_in(dashboard_api, token, page="experiments", exp="factorial")
    sid = at.session_state["_sid"]
    other = _signed_in(dashboard_api, token)  # another tab, given the same session as a reload would
    other.session_state["_sid"] = sid
    other.run()
    at.button(key="nav_signout").click().run()
    assert "Signed out." in _texts(at.info) and session.store().get(sid) is None
    farewell = at.session_state["_signed_out"]
    assert session.store().pending(farewell) and session.store().claim_end(farewell) == sid
    other.run()
    assert other.title[0].value == "ablab" and "Your session has ended" in _texts(other.warning)
