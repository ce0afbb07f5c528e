"""The dashboard's sign-in sessions (``ablab.dashboards.session``): expiry (idle and
absolute), sign-out, revocation, the one-time handoff code, and the route that trades it for
an HttpOnly, SameSite=Strict cookie, only for the dashboard's own pages."""

from __future__ import annotations

import threading

import pytest

from ablab.dashboards import session
from ablab.dashboards.session import COOKIE, HEADER, SessionStore

TOKEN = "abl_" + "s3cret" * 8


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> SessionStore:
    return SessionStore(idle_s=100.0, max_s=1000.0, handoff_s=60.0, clock=clock)


def _new(store: SessionStore, token: str = TOKEN) -> str:
    return store.create(api_url="http://api", token=token, user="me", scope="editor")


def test_a_session_holds_what_a_page_needs_and_ids_are_random(store: SessionStore) -> None:
    sid = _new(store)
    found = store.get(sid)
    assert found is not None and (found.api_url, found.token, found.user, found.scope) == ("http://api", TOKEN, "me", "editor")
    assert len(sid) >= 43 and sid != _new(store)  # 256 bits, url-safe
    assert store.get("not-a-session") is None and store.get("") is None and store.get(None) is None


def test_ids_are_kept_only_as_digests_and_tokens_stay_out_of_reprs(store: SessionStore) -> None:
    sid = _new(store)
    assert sid not in store._sessions  # keyed by SHA-256
    assert TOKEN not in repr(store.get(sid)) and sid not in repr(store) and TOKEN not in repr(store)


def test_idle_sessions_end_and_each_use_restarts_the_idle_clock(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    clock.now += 99
    assert store.get(sid) is not None  # used: idle again from here
    clock.now += 99
    assert store.get(sid) is not None
    clock.now += 100
    assert store.get(sid) is None
    clock.now -= 50  # gone for good, not merely hidden while the clock says so
    assert store.get(sid) is None


def test_a_peek_does_not_keep_a_session_alive(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    clock.now += 60
    assert store.get(sid, touch=False) is not None
    clock.now += 40
    assert store.get(sid) is None


def test_sessions_end_at_their_absolute_lifetime_however_active(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    for _ in range(19):
        clock.now += 50
        assert store.get(sid) is not None
    clock.now += 50  # 1000 s after sign-in
    assert store.get(sid) is None


def test_sign_out_ends_the_session_for_every_holder(store: SessionStore) -> None:
    sid, other = _new(store), _new(store)
    assert store.end(sid) is True
    assert store.get(sid) is None and store.get(other) is not None
    assert store.end(sid) is False and store.end(None) is False


def test_a_refused_token_ends_every_session_holding_it(store: SessionStore) -> None:
    first, second, unrelated = _new(store), _new(store), _new(store, token="abl_other")
    assert store.end_token(TOKEN) == 2
    assert store.get(first) is None and store.get(second) is None and store.get(unrelated) is not None


def test_expired_sessions_are_purged_when_others_begin(store: SessionStore, clock: Clock) -> None:
    for _ in range(5):
        _new(store)
    clock.now += 101
    _new(store)
    assert len(store._sessions) == 1 and len(store) == 1


def test_a_handoff_code_is_claimed_once_within_its_minute(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    code = store.handoff(sid)
    assert code != sid and store.pending(code)
    claimed = store.claim(code)
    assert claimed is not None and claimed[0] == sid
    assert not store.pending(code) and store.claim(code) is None  # single use
    late = store.handoff(sid)
    clock.now += 60
    assert not store.pending(late) and store.claim(late) is None
    assert not store.pending(None) and not store.pending("")


def test_a_handoff_for_an_ended_session_gives_nothing(store: SessionStore) -> None:
    sid = _new(store)
    code = store.handoff(sid)
    store.end(sid)
    assert store.claim(code) is None


def test_a_code_serves_its_own_purpose_only(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    begin, end = store.handoff(sid), store.handoff(sid, session.END)
    assert store.claim_end(begin) is None and store.claim(end) is None  # neither is used up by the wrong door
    assert store.claim(begin) is not None
    store.end(sid)
    assert store.claim_end(end) == sid and store.claim_end(end) is None  # the session is gone; the code once
    late = store.handoff(sid, session.END)
    clock.now += 60
    assert store.claim_end(late) is None
    with pytest.raises(ValueError):
        store.handoff(sid, "other")


def test_the_cookie_lives_until_the_session_absolute_end(store: SessionStore, clock: Clock) -> None:
    sid = _new(store)
    clock.now += 90
    found = store.get(sid)
    assert found is not None and store.cookie_max_age(found) == 910


def test_concurrent_sign_ins_and_outs_keep_the_store_consistent(store: SessionStore) -> None:
    made: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(200):
            sid = _new(store)
            with lock:
                made.append(sid)
            store.get(sid)
            store.end(sid)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 1600 and len(store) == 0


def test_lifetimes_come_from_settings_with_ablab_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from ablab.platform.config import Settings

    defaults = Settings()
    assert (defaults.dashboard_session_idle_s, defaults.dashboard_session_max_s) == (12 * 3600, 7 * 86400)
    monkeypatch.setenv("ABLAB_DASHBOARD_SESSION_IDLE_S", "600")
    monkeypatch.setenv("ABLAB_DASHBOARD_SESSION_MAX_S", "3600")
    assert (Settings().dashboard_session_idle_s, Settings().dashboard_session_max_s) == (600, 3600)
    with pytest.raises(ValueError):
        SessionStore(idle_s=0, max_s=10)


# -- the route -------------------------------------------------------------------------------------
@pytest.fixture
def http(store: SessionStore):
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    app = Starlette(routes=session.routes(lambda: store))
    with TestClient(app, base_url="http://dash.test") as client:
        yield client


SAME = {HEADER: "1", "Sec-Fetch-Site": "same-origin", "Origin": "http://dash.test"}


def test_the_route_trades_a_code_for_an_httponly_strict_cookie(http, store: SessionStore) -> None:
    sid = _new(store)
    code = store.handoff(sid)
    answer = http.post(session.PATH, content=code, headers=SAME)
    assert answer.status_code == 204
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={sid};")
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "path", "max-age"} <= attrs and "samesite=strict" in cookie.lower()
    assert "secure" not in attrs  # plain HTTP here; HTTPS (or X-Forwarded-Proto: https) adds it
    assert answer.headers["cache-control"] == "no-store"
    again = http.post(session.PATH, content=code, headers=SAME)
    assert again.status_code == 410 and "set-cookie" not in again.headers
    behind_tls = http.post(session.PATH, content=store.handoff(sid), headers={**SAME, "X-Forwarded-Proto": "https"})
    assert "secure" in behind_tls.headers["set-cookie"].lower()


@pytest.mark.parametrize("headers", [
    {},  # a plain form post
    {"Sec-Fetch-Site": "same-origin"},  # no custom header: not our page's fetch
    {HEADER: "1", "Sec-Fetch-Site": "cross-site", "Origin": "http://evil.test"},
    {HEADER: "1", "Sec-Fetch-Site": "same-site", "Origin": "http://other.dash.test"},
    {HEADER: "1", "Origin": "http://evil.test"},  # an old browser: the Origin decides
    {HEADER: "1"},  # neither Sec-Fetch-Site nor Origin
])
def test_only_the_dashboards_own_pages_may_use_the_route(http, store: SessionStore, headers: dict[str, str]) -> None:
    sid = _new(store)
    code, farewell = store.handoff(sid), store.handoff(sid, session.END)
    answer = http.post(session.PATH, content=code, headers=headers)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert store.pending(code)  # an attacker's try does not burn the user's code
    http.cookies.set(COOKIE, sid)
    assert http.request("DELETE", session.PATH, content=farewell, headers=headers).status_code == 403
    assert store.get(sid) is not None and store.pending(farewell)


def test_an_old_browser_with_a_matching_origin_is_accepted(http, store: SessionStore) -> None:
    code = store.handoff(_new(store))
    assert http.post(session.PATH, content=code, headers={HEADER: "1", "Origin": "http://dash.test"}).status_code == 204
    proxied = store.handoff(_new(store))  # behind a proxy that rewrites Host and says where it came from
    assert http.post(session.PATH, content=proxied, headers={HEADER: "1", "Origin": "https://ablab.example",
                                                             "X-Forwarded-Host": "ablab.example"}).status_code == 204


def test_sign_out_clears_the_cookie_it_set_and_no_later_one(http, store: SessionStore) -> None:
    sid = _new(store)
    farewell = store.handoff(sid, session.END)
    store.end(sid)  # the page ended it when the user pressed Sign out
    http.cookies.set(COOKIE, sid)
    answer = http.request("DELETE", session.PATH, content=farewell, headers=SAME)
    assert answer.status_code == 204
    assert answer.headers["set-cookie"].startswith(f'{COOKIE}="";') and "max-age=0" in answer.headers["set-cookie"].lower()
    assert http.request("DELETE", session.PATH, content=farewell, headers=SAME).status_code == 410  # once

    # A sign-out page posting late, after a new sign-in in another tab, leaves the new cookie alone.
    old, new = _new(store), _new(store)
    late = store.handoff(old, session.END)
    store.end(old)
    http.cookies.set(COOKIE, new)
    answer = http.request("DELETE", session.PATH, content=late, headers=SAME)
    assert answer.status_code == 204 and "set-cookie" not in answer.headers and store.get(new) is not None
    # A sign-in code is no sign-out code.
    assert http.request("DELETE", session.PATH, content=store.handoff(new), headers=SAME).status_code == 410
    assert store.get(new) is not None


def test_the_route_refuses_an_oversized_body(http, store: SessionStore) -> None:
    assert http.post(session.PATH, content="x" * 10_000, headers=SAME).status_code == 413


def test_the_route_follows_the_base_url_path() -> None:
    assert session.route_path(None) == session.route_path("") == session.route_path("/") == "/_ablab/session"
    assert session.route_path("/dash/") == "/dash/_ablab/session"
    paths = {r.path for r in session.routes(base_url_path="dash")}
    assert paths == {"/dash/_ablab/session"}


def test_the_page_script_carries_the_code_never_the_session_id(store: SessionStore) -> None:
    sid = _new(store)
    code = store.handoff(sid)
    page = session.script("POST", code)
    assert code in page and sid not in page and TOKEN not in page
    assert '"/_ablab/session"' in page and HEADER in page and "same-origin" in page
    assert '"DELETE"' in session.script("DELETE", code)
    with pytest.raises(ValueError):
        session.script("GET", code)


# -- the per-run check -------------------------------------------------------------------------------
def test_the_per_run_check_is_one_read_and_says_when_the_token_is_refused() -> None:
    import httpx

    from ablab.dashboards.client import ApiClient, ApiError

    seen: list[str] = []

    def answer(status: int, *, whoami: bool = True):
        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(f"{request.method} {request.url.path}")
            if request.url.path == "/v1/whoami" and not whoami:
                return httpx.Response(404, json={"detail": "not found"})
            return httpx.Response(status, json={"detail": "unknown or revoked token"} if status == 401 else {"items": []})
        return httpx.MockTransport(handler)

    ApiClient("http://api", TOKEN, transport=answer(200)).check()
    assert seen == ["GET /v1/whoami"]
    with pytest.raises(ApiError) as refused:
        ApiClient("http://api", TOKEN, transport=answer(401)).check()
    assert refused.value.status == 401 and "revoked" in refused.value.detail
    seen.clear()
    ApiClient("http://api", TOKEN, transport=answer(200, whoami=False)).check()  # an API without /v1/whoami
    assert seen == ["GET /v1/whoami", "GET /v1/experiments"]  # reads only: no probing writes
