"""Which backend serves a request's ``model``, and which models no backend serves (404).

Each backend's models are its ``models`` setting, or, when it has none, what its
``GET /models`` lists: fetched at start and again when a request names a model no backend is
known to serve (at most once per ``REFRESH_MIN_S`` per backend, one fetch at a time). A
backend with ``models: ["*"]`` (or ``any_model: true``) takes any name. While a backend's list
cannot be fetched, the gateway cannot tell a model is unknown and lets the request through.

The backend a request *names* is the default backend when it serves the model, else the
first backend that does; a variant's ``backend`` factor may move it elsewhere (the caller's
``Authorization`` never follows it there: :func:`ablab.platform.gateway.auth.forwarded_authorization`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ablab.platform.gateway.settings import Backend, GatewaySettings

log = logging.getLogger(__name__)
REFRESH_MIN_S = 10.0
FETCH_TIMEOUT_S = 5.0

# (backend) -> its model ids, or None when the listing could not be fetched
Fetch = Callable[[Backend], Awaitable[frozenset[str] | None]]


class ModelNotFound(LookupError):
    """No backend serves the requested model."""


class ModelCatalog:
    def __init__(self, settings: GatewaySettings, fetch: Fetch) -> None:
        self.settings = settings
        self._fetch = fetch
        self.listed: dict[str, frozenset[str] | None] = {}  # discovering backends only
        self._fetched_at: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}

    def discovering(self) -> list[Backend]:
        return [b for b in self.settings.backends.values() if b.models is None]

    async def refresh(self, backends: list[Backend] | None = None) -> None:
        """Fetch the listings of ``backends`` (default: every discovering backend) at once;
        a fetch already running is joined, not repeated."""
        todo = []
        for b in backends if backends is not None else self.discovering():
            task = self._inflight.get(b.name)
            if task is None or task.done():
                task = asyncio.ensure_future(self._one(b))
                self._inflight[b.name] = task
            todo.append(task)
        if todo:
            await asyncio.gather(*todo, return_exceptions=True)

    async def _one(self, backend: Backend) -> None:
        self._fetched_at[backend.name] = time.monotonic()
        try:
            found = await asyncio.wait_for(self._fetch(backend), FETCH_TIMEOUT_S)
        except Exception as exc:  # a backend that cannot list its models is "unknown", not fatal
            log.warning("backend %r: could not list its models (%s); requests for any model pass to it until it can",
                        backend.name, type(exc).__name__)
            found = None
        previous = self.listed.get(backend.name)
        self.listed[backend.name] = found
        if found is not None and found != previous:
            log.info("backend %r serves %s", backend.name, sorted(found)[:20])

    def serves(self, backend: Backend, model: str) -> bool | None:
        """True/False, or None when its list is not known."""
        if backend.models is not None:
            return backend.any_model or model in backend.models
        listed = self.listed.get(backend.name)
        return None if listed is None else model in listed

    def _route(self, model: str | None, only: Callable[[Backend], bool] | None = None) -> tuple[Backend | None, bool]:
        """(the named backend or None, whether some backend's list is unknown); ``only``:
        the backends that may serve it (those serving the endpoint)."""
        default = self.settings.backends[self.settings.default_backend]
        if (only is None or only(default)) and (model is None or self.serves(default, model)):
            return default, False
        unknown = False
        for b in self.settings.backends.values():
            if only is not None and not only(b):
                continue
            found = True if model is None else self.serves(b, model)
            if found:
                return b, False
            unknown |= found is None
        return None, unknown

    async def named_backend(self, model: str | None, only: Callable[[Backend], bool] | None = None) -> Backend | None:
        """The backend the request names; :class:`ModelNotFound` when no backend serves
        ``model``; None when some do, but none of those ``only`` accepts."""
        backend, unknown = self._route(model, only)
        if backend is not None:
            return backend
        now = time.monotonic()
        stale = [b for b in self.discovering() if now - self._fetched_at.get(b.name, -1e9) >= REFRESH_MIN_S]
        if stale:  # a model added since the last listing, or a backend that was down
            await self.refresh(stale)
            backend, unknown = self._route(model, only)
            if backend is not None:
                return backend
        if only is not None:
            if unknown:  # an accepted backend whose list is not known may serve it: it answers
                return next(b for b in self.settings.backends.values() if only(b) and self.serves(b, model or "") is None)
            if self._route(model) == (None, False):
                raise ModelNotFound(model)
            return None
        if unknown:  # cannot tell: the default backend answers (as before the lists existed)
            return self.settings.backends[self.settings.default_backend]
        raise ModelNotFound(model)

    def known_models(self) -> list[str]:
        out: list[str] = []
        for b in self.settings.backends.values():
            names = b.models if b.models is not None else self.listed.get(b.name) or ()
            out.extend(n for n in sorted(names) if n != "*" and n not in out)
        return out
