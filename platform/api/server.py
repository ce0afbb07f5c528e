"""The HTTP server's limits for slow or greedy clients (:func:`uvicorn_options`, used by
``ablab api``, whose app is ``ablab.cli.asgi:app``): a deadline for each request's head (:class:`GuardedHTTPProtocol`), the
keep-alive idle timeout, a bound on open connections, and a header-size bound. The body's
size and read time are bounded in the app itself (``app._BodyLimitMiddleware``), so they
hold under any ASGI server.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ablab.platform.config import Settings, get_settings

KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024


class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with a deadline for the request head.

    From the moment a connection opens, or a response completes on a kept-alive one, the
    client has ``Settings.http_header_timeout_s`` to finish the request line and headers;
    then the connection is closed. uvicorn alone has no such deadline: its keep-alive timer
    is cancelled by the first byte received, so a client sending a byte every few seconds
    (slowloris) would hold the connection forever.
    """

    header_timeout_s: float | None = None  # from the settings on first use

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        if GuardedHTTPProtocol.header_timeout_s is None:
            GuardedHTTPProtocol.header_timeout_s = get_settings().http_header_timeout_s
        self._head_deadline = self.loop.call_later(GuardedHTTPProtocol.header_timeout_s, self._head_overdue)

    def _cancel_head_deadline(self) -> None:
        handle = getattr(self, "_head_deadline", None)
        if handle is not None:
            handle.cancel()
            self._head_deadline = None

    def _head_overdue(self) -> None:
        self._head_deadline = None
        waiting_for_head = self.cycle is None or self.cycle.response_complete
        if waiting_for_head and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` that bound what one client can hold."""
    return {
        "http": f"{__name__}:GuardedHTTPProtocol",
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": settings.http_max_connections,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,  # h11 only; httptools caps headers itself
    }

