"""AppTest of the real app against a real API: the dashboard talks only to the API it was
started with (or the operator's allow-list), and user text shows as text."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
APP = str(Path(__file__).resolve().parents[3] / "dashboards" / "app.py")


@pytest.fixture
def bystander() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server the dashboard must never call; it records every request."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(401)
            self.send_header("Content-Type", "application/problem+json")
            self.end_headers()
            self.wfile.write(b'{"status": 401, "detail": "[unknown](http://127.0.0.1:9/) token"}')

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_a_session_pointing_elsewhere_is_signed_out_without_a_request(dashboard_api, bystander) -> None:
    from streamlit.testing.v1 import AppTest

    elsewhere, hits = bystander
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["api_url"] = elsewhere
    at.session_state["token"] = dashboard_api.tokens["admin"]
    at.run()
    assert at.title[0].value == "ablab" and "token" not in at.session_state  # back at sign-in
    at.text_input(key="login_token").input(dashboard_api.tokens["viewer"])
    at.button(key="login_submit").click().run()
    assert at.session_state["api_url"] == dashboard_api.base_url
    assert hits == []


def test_the_allow_list_is_all_sign_in_offers(dashboard_api, bystander, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from ablab.platform.config import get_settings

    other, hits = bystander
    monkeypatch.setenv("ABLAB_DASHBOARD_API_URLS", f'["{other}/"]')
    get_settings.cache_clear()
    at = AppTest.from_file(APP, default_timeout=180).run()
    assert at.selectbox(key="login_url").options == [dashboard_api.base_url, other]
    assert not [w for w in at.text_input if w.key == "login_url"]
    assert hits == []  # nothing is called before someone signs in
    at.selectbox(key="login_url").select(other)
    at.text_input(key="login_token").input("abl_whatever")
    at.button(key="login_submit").click().run()
    assert hits == ["/v1/whoami"]  # an operator-listed API is used, on purpose
    assert "Sign-in failed: \\[unknown\\]\\(http" in _texts(at.error)  # and its reply shows as text


def test_user_text_shows_as_text(dashboard_api, open_app) -> None:
    key = f"md-{uuid.uuid4().hex[:6]}"
    name = "![pixel](http://127.0.0.1:9/p.png) [click](http://127.0.0.1:9/) **loud**"
    with dashboard_api.client("editor") as c:
        body = {"key": key, "name": name, "owner": "[owner](http://127.0.0.1:9/)", "traffic": 1.0, "control": "a",
                "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
        assert c.post("/v1/experiments", json=body).status_code == 201
    at = open_app("results", exp=key)
    title = at.title[0].value
    assert "![" not in title.replace("\\!\\[", "") and "](" not in title.replace("\\]\\(", "")
    assert title.startswith("Results: \\!\\[pixel\\]")
    at = open_app("experiments")  # the list shows names in a table: plain text, never Markdown
    row = at.dataframe[0].value
    assert row[row["Key"] == key].iloc[0]["Name"] == name


# What remark-gfm autolinks in a text node (the value after backslash escapes are resolved):
# none of it may be left in user text (tests/unit/dashboards/test_client_safety.py has the detail).
_AUTOLINK = re.compile(r"https?:|www\.|@[-\w]", re.IGNORECASE | re.ASCII)


def _text_node(markdown: str) -> str:
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


@pytest.mark.parametrize("exp", ["../keys", "![x](http://127.0.0.1:9/x.png)", "a/b", "UPPER", "x" * 65,
                                 "https://evil.example.com/login", "www.evil.example.com", "bob@evil.example.com"])
def test_an_exp_that_is_no_key_is_refused_as_text(open_app, exp: str) -> None:
    at = open_app("results", exp=exp)
    errors = _texts(at.error)
    assert "No experiment has the key" in errors
    assert "![" not in errors and "](" not in errors.replace("\\]\\(", "")
    assert not _AUTOLINK.search(_text_node(errors)), errors  # not even a bare URL becomes a link
    assert not at.title or not at.title[0].value.startswith("Results:")


def test_bare_urls_in_names_owners_and_factor_descriptions_stay_text(dashboard_api, open_app) -> None:
    from ablab.dashboards.format import WORD_JOINER

    key = f"url-{uuid.uuid4().hex[:6]}"
    name = "Try https://evil.example.com/login or www.evil.example.com"
    owner = "bob@evil.example.com"
    factor = f"engine_{uuid.uuid4().hex[:6]}"
    with dashboard_api.client("editor") as c:
        assert c.post("/v1/experiments", json={
            "key": key, "name": name, "owner": owner, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}).status_code == 201
        declared = c.post("/v1/factors", json={"name": factor, "type": "string", "description":
                                               "![t](http://127.0.0.1:9/t.png) see https://evil.example.com"})
        assert declared.status_code == 201, declared.text
    title = _text_node(open_app("results", exp=key).title[0].value)
    assert not _AUTOLINK.search(title) and title.replace(WORD_JOINER, "") == f"Results: {name}"
    at = open_app("edit", exp=key)
    shown = _text_node(at.title[0].value + " " + _texts(at.caption))
    assert not _AUTOLINK.search(shown) and f"owner {owner}" in shown.replace(WORD_JOINER, "")
    at = open_app("new")  # a declared factor's description is its picker's tooltip, which renders Markdown
    hint = at.text_input(key=f"new_v1_{factor}").help
    assert "![" not in hint and not _AUTOLINK.search(_text_node(hint)), hint


def test_api_errors_quoting_input_are_escaped(dashboard_api, open_app) -> None:
    at = open_app("results", exp="no-such-exp-anywhere")
    errors = _texts(at.error)
    assert "Could not load experiment" in errors and "no\\-such\\-exp\\-anywhere" in errors


def test_signed_in_user_name_is_escaped(open_app) -> None:
    at = open_app("experiments", run=False)
    at.session_state["user"] = "**boss** ![x](http://127.0.0.1:9/x.png)"
    at.run()
    captions = _texts(at.sidebar.caption)
    assert "\\*\\*boss\\*\\*" in captions and "![" not in captions
