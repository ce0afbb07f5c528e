"""Dashboard sign-in sessions: a random id in an HttpOnly cookie, the token on the server.

After sign-in the browser holds only ``ablab_session``, a random id (256 bits) in a cookie
that is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends
it) and ``Secure`` over HTTPS. The dashboard process maps the id to what a page needs: the
API URL, the token, and the name and scope ``/v1/whoami`` gave. The token never reaches
the browser again, nor a URL, nor a log line.

The store is a dict in the dashboard process, guarded by a lock, keyed by the SHA-256 of
the id. One process is enough: the dashboard runs one (Streamlit keeps each tab's state in
its process anyway), and keeping tokens in memory keeps them off disk. A restart ends
every session (each browser signs in again).

A session ends when it has been idle for ``ABLAB_DASHBOARD_SESSION_IDLE_S`` (12 h), when
it is ``ABLAB_DASHBOARD_SESSION_MAX_S`` old (7 days, however active), on sign-out (for
every tab and reload of that browser), and when the API refuses its token (a revoked or
expired key: the dashboard asks ``/v1/whoami`` on every run, so at the next interaction).

Setting an HttpOnly cookie needs an HTTP response, which a Streamlit script run has not:
sign-in stores the session and a one-time code (60 s, single use); the signed-in page
posts that code from a same-origin frame to ``POST /_ablab/session``, a route of the
dashboard's own server (``ablab.dashboards.asgi``), which answers with the cookie. Sign-out
ends the session at once and the page posts a second one-time code to ``DELETE
/_ablab/session``, which clears the cookie if it still names that session (not one a later
sign-in set). Both refuse a request from another origin.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

COOKIE = "ablab_session"
PATH = "/_ablab/session"
HEADER = "X-Ablab-Session"  # a header a cross-site form cannot send; a cross-origin fetch with it needs CORS
HANDOFF_S = 60.0
BEGIN, END = "begin", "end"  # what a one-time code is for: setting the cookie, clearing it
_MAX_BODY = 256


@dataclass(frozen=True)
class Session:
    """What a signed-in page needs. ``token`` stays out of ``repr`` (and so out of tracebacks)."""

    api_url: str
    token: str = field(repr=False)
    user: str
    scope: str
    created: float
    last_seen: float


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class SessionStore:
    """Sessions by the SHA-256 of their id, and pending handoff codes; thread-safe."""

    def __init__(self, *, idle_s: float, max_s: float, handoff_s: float = HANDOFF_S,
                 clock: Callable[[], float] = time.time) -> None:
        if idle_s <= 0 or max_s <= 0:
            raise ValueError("session lifetimes must be positive")
        self.idle_s = idle_s
        self.max_s = max_s
        self.handoff_s = handoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._codes: dict[str, tuple[str, str, float]] = {}  # digest of code -> (purpose, session id, expires)

    def __len__(self) -> int:
        with self._lock:
            self._purge(self._clock())
            return len(self._sessions)

    def __repr__(self) -> str:
        return f"SessionStore(sessions={len(self)}, idle_s={self.idle_s}, max_s={self.max_s})"

    # -- sessions -----------------------------------------------------------------------------
    def create(self, *, api_url: str, token: str, user: str, scope: str) -> str:
        """A new session; returns its id (the cookie's value: show it to no one)."""
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._purge(now)
            self._sessions[_digest(sid)] = Session(api_url, token, user, scope, now, now)
        return sid

    def get(self, sid: str | None, *, touch: bool = True) -> Session | None:
        """The live session of this id (its idle clock restarts), or None: unknown, ended or expired."""
        if not sid:
            return None
        key = _digest(sid)
        now = self._clock()
        with self._lock:
            found = self._sessions.get(key)
            if found is None:
                return None
            if self._expired(found, now):
                del self._sessions[key]
                return None
            if touch:
                found = self._sessions[key] = replace(found, last_seen=now)
            return found

    def end(self, sid: str | None) -> bool:
        """Sign-out: the session is gone for every tab and reload that used it."""
        if not sid:
            return False
        with self._lock:
            return self._sessions.pop(_digest(sid), None) is not None

    def end_token(self, token: str) -> int:
        """End every session holding ``token`` (the API refused it: revoked or expired)."""
        with self._lock:
            doomed = [k for k, s in self._sessions.items() if hmac.compare_digest(s.token.encode(), token.encode())]
            for key in doomed:
                del self._sessions[key]
            return len(doomed)

    # -- one-time codes: what a page trades for setting (BEGIN) or clearing (END) its cookie --------
    def handoff(self, sid: str, purpose: str = "begin") -> str:
        """A code that ``claim`` turns into ``sid`` once, within ``handoff_s``, for ``purpose``."""
        if purpose not in (BEGIN, END):
            raise ValueError(purpose)
        code = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._codes[_digest(code)] = (purpose, sid, now + self.handoff_s)
        return code

    def pending(self, code: str | None) -> bool:
        """Whether ``code`` may still be claimed (the page has not posted it yet)."""
        if not code:
            return False
        with self._lock:
            entry = self._codes.get(_digest(code))
            return entry is not None and entry[2] > self._clock()

    def claim(self, code: str) -> tuple[str, Session] | None:
        """The session id and session for a sign-in code, once; None when unknown, used,
        expired, for another purpose, or its session ended meanwhile."""
        now = self._clock()
        with self._lock:
            entry = self._take(code, BEGIN, now)
            if entry is None:
                return None
            found = self._sessions.get(_digest(entry))
            if found is None or self._expired(found, now):
                return None
            return entry, found

    def claim_end(self, code: str) -> str | None:
        """The session id a sign-out code was made for, once (the session itself is gone)."""
        with self._lock:
            return self._take(code, END, self._clock())

    def cookie_max_age(self, session: Session) -> int:
        """Seconds the cookie should live: until the session's absolute end."""
        return max(0, int(session.created + self.max_s - self._clock()))

    # -- internals ----------------------------------------------------------------------------
    def _expired(self, session: Session, now: float) -> bool:
        return now - session.last_seen >= self.idle_s or now - session.created >= self.max_s

    def _take(self, code: str, purpose: str, now: float) -> str | None:
        key = _digest(code)
        entry = self._codes.get(key)
        if entry is None or entry[0] != purpose:
            return None
        del self._codes[key]
        return entry[1] if entry[2] > now else None

    def _purge(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[key]
        for key in [k for k, (_, _, expires) in self._codes.items() if expires <= now]:
            del self._codes[key]


_store: SessionStore | None = None
_store_lock = threading.Lock()


def store() -> SessionStore:
    """The process's store, with the lifetimes of ``ABLAB_DASHBOARD_SESSION_IDLE_S`` and
    ``ABLAB_DASHBOARD_SESSION_MAX_S``."""
    global _store
    with _store_lock:
        if _store is None:
            from ablab.platform.config import get_settings

            settings = get_settings()
            _store = SessionStore(idle_s=settings.dashboard_session_idle_s, max_s=settings.dashboard_session_max_s)
        return _store


# -- the HTTP side: the route that sets and clears the cookie ------------------------------------
def route_path(base_url_path: str | None) -> str:
    """``/_ablab/session`` under Streamlit's ``server.baseUrlPath``, if one is set."""
    base = (base_url_path or "").strip("/")
    return f"/{base}{PATH}" if base else PATH


def _same_origin(request: Any) -> bool:
    """Only the dashboard's own pages may call the route. The custom header makes a
    cross-origin fetch need a CORS preflight, which this server never grants, and a form
    cannot send it; a browser's ``Sec-Fetch-Site`` must say same-origin; a browser too old
    to send that must send an ``Origin`` naming this host (``Host`` or, behind a proxy,
    ``X-Forwarded-Host``)."""
    headers = request.headers
    if headers.get(HEADER) != "1":
        return False
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = headers.get("origin", "")
    hosts = {h for h in (headers.get("host"), headers.get("x-forwarded-host")) if h}
    return "://" in origin and origin.split("://", 1)[1] in hosts


def _secure(request: Any) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


def routes(session_store: Callable[[], SessionStore] = store, *, base_url_path: str | None = None) -> list[Any]:
    """Starlette routes for ``st.App``: ``POST`` trades a sign-in code for the cookie,
    ``DELETE`` trades a sign-out code for clearing it."""
    from starlette.responses import Response
    from starlette.routing import Route

    def _plain(status: int, text: str = "") -> Response:
        return Response(text, status_code=status, media_type="text/plain",
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    async def _code(request: Any) -> str | Response:
        if not _same_origin(request):
            return _plain(403, "same-origin requests only")
        body = (await request.body())[:_MAX_BODY + 1]
        if len(body) > _MAX_BODY:
            return _plain(413, "too long")
        return body.decode("ascii", "replace").strip()

    async def begin(request: Any) -> Response:
        code = await _code(request)
        if isinstance(code, Response):
            return code
        claimed = session_store().claim(code)
        if claimed is None:
            return _plain(410, "this sign-in has expired or was used: sign in again")
        sid, found = claimed
        response = _plain(204)
        response.set_cookie(COOKIE, sid, max_age=session_store().cookie_max_age(found), path="/",
                            httponly=True, samesite="strict", secure=_secure(request))
        return response

    async def finish(request: Any) -> Response:
        code = await _code(request)
        if isinstance(code, Response):
            return code
        sid = session_store().claim_end(code)
        if sid is None:
            return _plain(410, "unknown or used sign-out")
        session_store().end(sid)  # already gone when the page signed out; harmless again
        response = _plain(204)
        if hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), sid.encode()):  # not a cookie a later sign-in set
            response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=_secure(request))
        return response

    path = route_path(base_url_path)
    return [Route(path, begin, methods=["POST"]), Route(path, finish, methods=["DELETE"])]


def script(method: str, code: str, *, base_url_path: str | None = None) -> str:
    """The page a same-origin frame runs to post a one-time code: ``POST`` a sign-in code,
    ``DELETE`` a sign-out code. The session id never appears in any page."""
    import json

    if method not in ("POST", "DELETE"):
        raise ValueError(method)
    return ("<script>fetch(" + json.dumps(route_path(base_url_path)) + ", {method: " + json.dumps(method)
            + ", credentials: 'same-origin', cache: 'no-store', headers: {" + json.dumps(HEADER) + ": '1', "
            "'Content-Type': 'text/plain'}, body: " + json.dumps(code) + "});</script>")
