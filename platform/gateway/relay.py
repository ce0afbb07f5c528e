"""The data plane: a raw asyncio HTTP/1.1 client to the backends and a raw ASGI response to the
caller, so a streamed answer's bytes cross the gateway with no per-chunk framework round trip.

Why not httpx for the relayed request: in a profile of 64 concurrent 16-chunk streams, httpx,
httpcore, h11 and anyio spent more CPU per stream than everything else in the gateway
(h11's per-chunk events, anyio's per-read attribute lookups, httpcore's pool matching every
queued request against every connection). Here each backend connection is an
``asyncio.Protocol`` with httptools' C parser (what uvicorn itself uses): body bytes land in a
buffer from the parser's callback, and the relay takes *everything buffered* at each wake-up,
so when a backend sends several events per read, or the gateway is busy, they leave in one
write (coalescing costs no latency: nothing waits for more). Reading pauses while more than
:data:`MAX_BUFFERED` bytes wait for a slow caller.

:class:`RelayClient` mimics the small part of ``httpx.AsyncClient`` the serving path uses
(``build_request`` + ``send(..., stream=True)``; responses with ``status_code``, ``headers``,
``aread``, ``aiter_raw``, ``aclose``) and raises httpx's exception types, so the serving path's
error handling is unchanged. Connections are kept alive per backend (LIFO, expired after
``keepalive_s`` idle); a request whose reused connection turns out closed before any answer
byte is retried once on a fresh one.

:class:`SseResponse` sends the start, then each relayed piece as it comes; a caller's
disconnect (one waiting ``receive()`` per stream) cancels the relay, as Starlette's
StreamingResponse would, without its per-request task group.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

MAX_BUFFERED = 256 * 1024  # bytes read from a backend and not yet sent on: beyond this, pause reading
_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _Conn(asyncio.Protocol):
    """One keep-alive connection to a backend; at most one request on it at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int, bool]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.header_list: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.last_activity = time.monotonic()

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_activity = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("backend asked to upgrade the connection"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"backend sent invalid HTTP: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            if self.headers_done and not any(k in (b"content-length", b"transfer-encoding") for k, _ in self.header_list):
                self.complete = True  # a body without a length ends at EOF (HTTP/1.0 style)
            else:
                self.error = httpx.RemoteProtocolError("backend closed the connection mid-answer") if self.got_bytes \
                    else httpx.ConnectError("backend closed the connection before answering")
        self._wake()

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_list.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > MAX_BUFFERED and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside the callback
        self.complete = True
        self._wake()

    # -- the request side ----------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until the parser has something new (or the backend has been silent ``timeout_s``)."""
        w = self.waiter = self.loop.create_future()
        handle = self.loop.call_later(max(0.0, self.last_activity + timeout_s - time.monotonic()), self._timed_out, w)
        try:
            await w
        finally:
            handle.cancel()
            self.waiter = None

    def _timed_out(self, w: asyncio.Future[None]) -> None:
        if not w.done():
            w.set_exception(httpx.ReadTimeout("the backend sent nothing within its timeout"))

    def take(self) -> bytes:
        """Everything buffered, as one piece (reading resumes if it was paused)."""
        body = self.body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return data

    def start(self, head: bytes, content: bytes) -> None:
        self._reset()
        if self.closed or self.transport is None or self.transport.is_closing():
            self.error = httpx.ConnectError("backend closed the connection before answering")
            return
        self.transport.write(head + content if len(content) < 65536 else head)
        if len(content) >= 65536:
            self.transport.write(content)


class UpstreamRequest:
    __slots__ = ("method", "url", "content", "headers")

    def __init__(self, method: str, url: str, content: bytes, headers: Mapping[str, str]) -> None:
        self.method, self.url, self.content, self.headers = method, url, content, headers


class UpstreamResponse:
    """The backend's answer; its body is read with :meth:`aiter_raw` or :meth:`aread`, and
    :meth:`aclose` returns the connection to the pool when the answer was read whole."""

    __slots__ = ("_client", "_conn", "status_code", "_header_list", "_headers", "_timeout_s", "_closed")

    def __init__(self, client: RelayClient, conn: _Conn, timeout_s: float) -> None:
        self._client, self._conn, self._timeout_s = client, conn, timeout_s
        self.status_code = conn.status
        self._header_list = conn.header_list
        self._headers: httpx.Headers | None = None
        self._closed = False

    @property
    def headers(self) -> httpx.Headers:
        """Built when first read (a relayed stream never reads them)."""
        if self._headers is None:
            self._headers = httpx.Headers(self._header_list)
        return self._headers

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.buffered:
                yield conn.take()
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait(self._timeout_s)

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._release(self._conn)


class RelayClient:
    """Keep-alive HTTP/1.1 connections to one backend (``max_idle`` kept, LIFO)."""

    def __init__(self, *, timeout_s: float, connect_timeout_s: float = 10.0, max_idle: int = 256,
                 keepalive_s: float = 4.0, ssl: ssl_module.SSLContext | None = None) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        # below uvicorn's 5 s default keep-alive, so the backend rarely closes a connection we are about to reuse
        self.keepalive_s = keepalive_s
        self._ssl = ssl
        self._idle: dict[tuple[str, int, bool], list[_Conn]] = {}
        self._all: set[_Conn] = set()

    def build_request(self, method: str, url: str, *, content: bytes = b"", headers: Mapping[str, str] | None = None) -> UpstreamRequest:
        return UpstreamRequest(method, url, content, headers or {})

    async def send(self, request: UpstreamRequest, *, stream: bool = True) -> UpstreamResponse:
        parts = urlsplit(request.url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        key = (host, port, tls)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{request.method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-length: {len(request.content)}\r\n"]
        for k, v in request.headers.items():
            if k.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
                lines.append(f"{k}: {v}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        for attempt in (0, 1):
            conn = await self._acquire(key, fresh=attempt == 1)
            conn.start(head, request.content)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self.timeout_s)
            except httpx.ConnectError:
                self._discard(conn)
                if conn.reused and attempt == 0:
                    continue  # the backend had closed this idle connection: once more on a new one
                raise
            except BaseException:
                self._discard(conn)
                raise
            response = UpstreamResponse(self, conn, self.timeout_s)
            if not stream:
                await response.aread()
            return response
        raise AssertionError("unreachable")

    async def _acquire(self, key: tuple[str, int, bool], *, fresh: bool) -> _Conn:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                conn.reused = True
                return conn
            self._discard(conn)
        loop = asyncio.get_running_loop()
        conn = _Conn(loop, key)
        host, port, tls = key
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, host, port, ssl=self._ssl_context() if tls else None),
                                   self.connect_timeout_s)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        self._all.add(conn)
        return conn

    def _ssl_context(self) -> ssl_module.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    def _release(self, conn: _Conn) -> None:
        keep = conn.complete and not conn.closed and conn.error is None and not conn.buffered \
            and conn.keep_alive
        if not keep:
            self._discard(conn)
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            self._discard(conn)
            return
        conn.idle_since = time.monotonic()
        conn.reused = True
        idle.append(conn)

    def _discard(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.close()
        conn.closed = True

    @property
    def open_connections(self) -> int:
        return len(self._all)

    async def aclose(self) -> None:
        for conn in list(self._all):
            self._discard(conn)
        self._idle.clear()


class SseResponse:
    """A raw ASGI response relaying ``body`` (an async iterator of bytes) as it comes."""

    __slots__ = ("body", "status_code", "raw_headers")

    def __init__(self, body: AsyncIterator[bytes], *, status_code: int = 200, headers: Mapping[str, str] | None = None,
                 media_type: str = "text/event-stream") -> None:
        self.body = body
        self.status_code = status_code
        self.raw_headers = _raw_headers(headers or {}, media_type)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def disconnected(t: asyncio.Task[MutableMapping[str, Any]]) -> None:
            nonlocal gone
            if t.cancelled() or t.exception() is not None or t.result().get("type") == "http.disconnect":
                if not finished:
                    gone = True
                    task.cancel()

        finished = False
        listener = asyncio.ensure_future(_until_disconnect(receive))
        listener.add_done_callback(disconnected)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for piece in self.body:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # the caller left: a normal end for the server, as Starlette's response does
        finally:
            finished = True
            if not listener.done():
                listener.remove_done_callback(disconnected)
                listener.cancel()
            aclose = getattr(self.body, "aclose", None)
            if aclose is not None:
                await aclose()


async def _until_disconnect(receive: _Receive) -> MutableMapping[str, Any]:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return message


def _raw_headers(headers: Mapping[str, str], media_type: str) -> list[tuple[bytes, bytes]]:
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if not any(k == b"content-type" for k, _ in out):
        out.append((b"content-type", media_type.encode("latin-1")))
    return out


def header_pairs(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
