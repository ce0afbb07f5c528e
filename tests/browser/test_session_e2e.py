"""The dashboard's sign-in session in headless Chromium (Debian's ``chromium``, driven by
Playwright), against a real API and the real ``ablab dashboard`` server: one sign-in
survives reloads and links (a deep link opens straight on its page), a revoked key ends the
session at the next interaction in every tab, sign-out ends it everywhere, and neither the
token nor the session id shows in a URL, a page, a script-readable cookie or a log.

Run: ``.venv/bin/python -m pytest tests/browser/test_session_e2e.py -m browser``
(``scripts/browser-deps.sh`` installs chromium when it is missing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ablab_testing import ApiServer, start_api, stop_api, wait_http

pytestmark = [pytest.mark.browser, pytest.mark.integration]
CHROMIUM = Path("/usr/bin/chromium")
DASHBOARD_PORT = 18531  # this area's port range is 18500–18599 (test_dashboard_e2e.py has 18520)
KEY = "session-link"
NAME = "Session link target"
COOKIE = "ablab_session"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str, Path]]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing; .ci/run installs it with scripts/browser-deps.sh")
        pytest.skip("Debian chromium not installed (run scripts/browser-deps.sh)")
    home = tmp_path_factory.mktemp("session-home")
    # No analytics store (the results page says so); both servers log at debug level, so the
    # logs searched for the token and the session id below are as talkative as they get.
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home, {"ABLAB_GUARDRAIL_INTERVAL_S": "0", "ABLAB_LOG_LEVEL": "DEBUG"})
    with api.client("editor") as editor:
        editor.post("/v1/experiments", json={
            "key": KEY, "name": NAME, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}).raise_for_status()
    log = open(home / "dashboard.log", "wb")
    env = {**os.environ, "ABLAB_HOME": str(home), "ABLAB_DATABASE_URL": api.database_url, "STREAMLIT_LOGGER_LEVEL": "debug"}
    dash = subprocess.Popen([str(Path(sys.executable).with_name("ablab")), "dashboard", "--port", str(DASHBOARD_PORT),
                             "--api-url", api.base_url], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{DASHBOARD_PORT}"
    try:
        wait_http(f"{url}/_stcore/health", dash, home / "dashboard.log", timeout=90)
        yield api, url, home
    finally:
        dash.terminate()
        try:
            dash.wait(timeout=15)
        except subprocess.TimeoutExpired:
            dash.kill()
        log.close()
        stop_api(api)


@pytest.fixture
def browser(stack):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


class Seen:
    """Every URL the browser asked for (pages, scripts, the websocket, frames)."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def watch(self, pg) -> None:
        pg.on("request", lambda r: self.urls.append(r.url))
        pg.on("websocket", lambda ws: self.urls.append(ws.url))
        pg.on("framenavigated", lambda f: self.urls.append(f.url))


def _new_page(context, seen: Seen):
    pg = context.new_page()
    pg.set_default_timeout(90_000)
    seen.watch(pg)
    return pg


def _settle(pg) -> None:
    """Wait until Streamlit has finished the current script run (its status widget is gone).
    Polled on a timer, not on animation frames: a tab that is not in front gets none."""
    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000,
                         polling=200)
    time.sleep(0.5)


def _visible(locator, timeout: float = 60_000) -> None:
    from playwright.sync_api import expect

    expect(locator).to_be_visible(timeout=timeout)  # a cold first run on a loaded machine takes seconds


def _click(pg, name: str) -> None:
    """Press a button from the keyboard (a mouse click lands at coordinates aimed before a rerun moved them)."""
    pg.bring_to_front()
    _settle(pg)
    pg.get_by_role("button", name=name, exact=True).first.press("Enter")
    _settle(pg)


def _sign_in(pg, token: str) -> None:
    pg.get_by_label("API token").fill(token)
    _click(pg, "Sign in")


def _session_cookie(context, *, present: bool = True, other_than: str | None = None, timeout: float = 30.0) -> dict | None:
    """The session cookie once the page has traded its one-time code for it (one whose value
    is not ``other_than``), or, with ``present=False``, once sign-out has cleared it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c for c in context.cookies() if c["name"] == COOKIE and c["value"] != other_than]
        if bool(found) == present:
            return found[0] if found else None
        time.sleep(0.2)  # the frame's fetch is on its way
    raise AssertionError(f"session cookie {'never set' if present else 'still set'}: {context.cookies()}")


def _results_heading(pg):
    return pg.get_by_role("heading", name=f"Results: {NAME}")


def _pages_hold_no(pages, *secrets: str) -> None:
    for pg in pages:
        for frame in pg.frames:
            html = frame.content()
            for secret in secrets:
                assert secret not in html, f"a secret is in the page source of {frame.url}"
        readable = pg.evaluate("() => document.cookie")
        for secret in secrets:
            assert secret not in readable


def _logs_hold_no(home: Path, *secrets: str) -> None:
    logs = [p for p in home.rglob("*") if p.is_file() and (p.suffix in (".log", ".txt", ".out", ".err") or "log" in p.name)]
    assert any(p.name == "dashboard.log" for p in logs) and any(p.name == "api.log" for p in logs)
    for path in logs:
        text = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in text, f"a secret is in {path}"


def test_one_sign_in_survives_reloads_and_links_and_a_revoked_key_ends_it(stack, browser) -> None:
    from playwright.sync_api import expect

    api, url, home = stack
    with api.client("admin") as admin:
        made = admin.post("/v1/keys", json={"name": "browser-session", "scope": "editor"})
        made.raise_for_status()
    token, key_id = made.json()["token"], made.json()["id"]
    seen = Seen()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = _new_page(context, seen)

    # A shared link before sign-in: the sign-in form, then straight to the linked page.
    pg.goto(f"{url}/?page=results&exp={KEY}")
    _visible(pg.get_by_label("API token"))
    _sign_in(pg, token)
    _visible(_results_heading(pg))
    cookie = _session_cookie(context)
    sid = cookie["value"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert sid != token and len(sid) >= 43

    # A reload keeps the session and the page.
    pg.reload()
    _visible(_results_heading(pg))
    expect(pg.get_by_label("API token")).to_have_count(0)
    _visible(pg.get_by_text("Signed in as"))

    # A link opened in another tab opens straight to its page; so does one followed in this tab.
    other = _new_page(context, seen)
    other.goto(f"{url}/?page=edit&exp={KEY}")
    _visible(other.get_by_role("heading", name=NAME, exact=True))  # the experiment's own page
    expect(other.get_by_label("API token")).to_have_count(0)
    pg.goto(url)
    _visible(pg.get_by_role("heading", name="Experiments"))
    pg.goto(f"{url}/?page=results&exp={KEY}")
    _visible(_results_heading(pg))
    _settle(pg)
    _settle(other)
    _pages_hold_no([pg, other], token, sid)

    # The key is revoked: the next interaction in each tab ends the session, with a reason.
    with api.client("admin") as admin:
        admin.delete(f"/v1/keys/{key_id}").raise_for_status()
    _click(pg, "Experiments")
    _visible(pg.get_by_label("API token"))
    _visible(pg.get_by_text("Your session has ended"))
    _click(other, "Experiments")
    _visible(other.get_by_label("API token"))
    pg.reload()  # the cookie names a session the server ended
    _visible(pg.get_by_label("API token"))
    _visible(pg.get_by_text("Your session has ended"))
    assert "page=results" in pg.url  # signing in again would land where the link pointed

    _settle(pg)
    _pages_hold_no([pg, other], token, sid)
    for seen_url in seen.urls:
        assert token not in seen_url and sid not in seen_url, seen_url
    assert any("page=results" in u for u in seen.urls)  # the watcher saw the deep links
    context.close()
    _logs_hold_no(home, token, sid)


def test_sign_out_ends_the_session_everywhere(stack, browser) -> None:
    api, url, home = stack
    token = api.tokens["viewer"]
    seen = Seen()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = _new_page(context, seen)
    pg.goto(url)
    _sign_in(pg, token)
    _visible(pg.get_by_role("heading", name="Experiments"))
    sid = _session_cookie(context)["value"]
    other = _new_page(context, seen)
    other.goto(f"{url}/?page=results&exp={KEY}")
    _visible(_results_heading(other))

    _click(pg, "Sign out")
    _visible(pg.get_by_text("Signed out."))
    _session_cookie(context, present=False)  # the browser forgets it
    _click(other, "Experiments")  # the other tab ends at its next interaction
    _visible(other.get_by_label("API token"))
    _visible(other.get_by_text("Your session has ended"))

    # The old id is worth nothing, even sent again by hand.
    context.add_cookies([{"name": COOKIE, "value": sid, "url": url}])
    other.goto(f"{url}/?page=results&exp={KEY}")
    _visible(other.get_by_label("API token"))
    _sign_in(other, token)  # and a new sign-in lands on the linked page
    _visible(_results_heading(other))
    _session_cookie(context, other_than=sid)

    _settle(other)
    _pages_hold_no([pg, other], token, sid)
    for seen_url in seen.urls:
        assert token not in seen_url and sid not in seen_url, seen_url
    context.close()
    _logs_hold_no(home, token, sid)
