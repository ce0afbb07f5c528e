"""HTTP limits for slow or greedy callers: what one connection may send, and for how long.

- **Head**: the request line and headers must arrive within ``head_timeout_s`` (from the
  connection opening, or the previous answer on a kept-alive one: the API's
  :class:`~ablab.platform.api.server.GuardedHTTPProtocol`), in at most ``MAX_HEAD_BYTES``
  and ``MAX_HEADERS`` headers; over either, the caller gets a 431 and the connection closes
  (the bytes are counted as they arrive, so a 10 MB header is never buffered).
- **Body**: a declared ``Content-Length`` over the limit is refused (413) before a byte of
  the body is read; a chunked body is counted as it is read and refused as soon as it passes
  the limit (:func:`read_body`); the whole body must arrive within ``body_timeout_s`` of the
  head, else 408 and the connection closes. Refusals carry ``Connection: close``, so the
  rest of an oversized upload is never read.
- **Connections**: ``limit_concurrency`` (uvicorn's 503 past it) and a 5 s keep-alive idle.

A caller that hangs up mid-upload is one log line at INFO, not a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.requests import Request
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ablab.platform.api.server import KEEP_ALIVE_S, GuardedHTTPProtocol
from ablab.platform.gateway.protocol import ProtocolError

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # request line and headers
MAX_HEADERS = 100
HEAD_TIMEOUT_S = 10.0  # defaults where the settings give none
BODY_TIMEOUT_S = 30.0

# httptools (uvicorn[standard]) reports where a head ends; under h11 its own size bound holds.
_COUNTS_HEAD = hasattr(AutoHTTPProtocol, "on_headers_complete")

_STATUS_LINES = {400: b"HTTP/1.1 400 Bad Request\r\n", 408: b"HTTP/1.1 408 Request Timeout\r\n",
                 431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n"}
_MESSAGES = {400: "the request is not valid HTTP/1.1", 408: "the request body did not arrive in time",
             431: "the request's headers are too large or too many"}

# Refusals made below the app (the protocol) are counted through these, one per running app
# (its lifespan registers its counter); a plain list, as a protocol has no handle on the app.
_refusal_counters: list[Callable[[str], None]] = []


class ClientGone(Exception):
    """The caller closed the connection before its request body arrived."""


class HardeningMetrics:
    """Counters for what the limits and the bookkeeping guard refused or survived, on the
    gateway's registry (``/metrics``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter("ablab_gateway_http_refused", "Requests refused by the HTTP limits or as malformed, by reason.",
                               ("reason",), registry=registry)
        self.bookkeeping_failures = Counter(
            "ablab_gateway_bookkeeping_failures",
            "Failures in metering or event writing (the answer still went out), by stage.", ("stage",), registry=registry)
        self.caller_errors = Counter(
            "ablab_gateway_caller_errors",
            "Caller-caused 4xx (refused by the gateway, or by the backend), by endpoint and status: never an "
            "inference event's error, so never in error_rate or a guardrail.", ("endpoint", "status"), registry=registry)

    def count_refusal(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def register(self) -> None:
        _refusal_counters.append(self.count_refusal)

    def unregister(self) -> None:
        if self.count_refusal in _refusal_counters:
            _refusal_counters.remove(self.count_refusal)


def _count(reason: str) -> None:
    for count in list(_refusal_counters):
        count(reason)


def _content_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or len(text) > 18:
        raise ProtocolError("Content-Length is not a byte count", param="Content-Length")
    return int(text)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (413) on a declared or counted size over ``max_bytes``;
    :class:`ClientGone` if the caller hangs up first. The time bound is the protocol's."""
    declared = _content_length(request)
    if declared is not None and declared > max_bytes:
        raise ProtocolError(f"request body is {declared} bytes; the limit is {max_bytes}", param="body", status=413)
    receive = request.receive
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the common case: the whole body in one message
        if len(body) > max_bytes:
            raise ProtocolError(f"request body is over the {max_bytes}-byte limit", param="body", status=413)
        return body
    chunks = [body]
    received = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        piece = message.get("body", b"")
        received += len(piece)
        if received > max_bytes:
            raise ProtocolError(f"request body is over the {max_bytes}-byte limit (cut off at {received} bytes)",
                                param="body", status=413)
        chunks.append(piece)
        if not message.get("more_body", False):
            return b"".join(chunks)


class GatewayHTTPProtocol(GuardedHTTPProtocol):
    """The API's head deadline, plus a bound on the head's bytes and headers (httptools
    buffers a header whole before handing it over, so the bytes are counted as they arrive)
    and a body deadline from the end of the head. Class attributes are the settings (one
    process serves one gateway; ``uvicorn_options`` sets them)."""

    # None: from the platform's settings on first use (each worker process reads its own)
    head_timeout_s: float | None = None
    body_timeout_s: float | None = None
    max_head_bytes = MAX_HEAD_BYTES
    max_headers = MAX_HEADERS

    def connection_made(self, transport: Any) -> None:
        cls = GatewayHTTPProtocol
        if cls.head_timeout_s is None or cls.body_timeout_s is None:
            from ablab.platform.config import get_settings

            s = get_settings()
            cls.head_timeout_s = s.http_header_timeout_s if cls.head_timeout_s is None else cls.head_timeout_s
            cls.body_timeout_s = s.http_body_timeout_s if cls.body_timeout_s is None else cls.body_timeout_s
        self._in_head = _COUNTS_HEAD
        self._head_bytes = 0
        self._header_count = 0
        self._refusing: int | None = None
        super().connection_made(transport)

    # -- the head's size and header count ------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refusing is not None:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_head_bytes and self._refusing is None and _COUNTS_HEAD:
            self._refuse(431, "head_too_large")

    def on_message_begin(self) -> None:
        self._header_count = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refusing = 431
            raise ValueError("too many headers")  # stops the parser; send_400_response answers 431
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its parser refuses, in OpenAI's error shape (431 where the
        head was refused for its header count)."""
        if self._refusing == 431:
            self._refusing = None
            self._refuse(431, "too_many_headers")
            return
        self._refuse(400, "invalid_http")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        super().on_headers_complete()
        self._arm(self.body_timeout_s or BODY_TIMEOUT_S, self._body_overdue)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_head_deadline()
        self._in_head = _COUNTS_HEAD

    # -- deadlines -------------------------------------------------------------------

    def _arm_head_deadline(self) -> None:
        self._arm(self.head_timeout_s or HEAD_TIMEOUT_S, self._head_overdue)

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(delay, callback)

    def _head_overdue(self) -> None:
        self._head_deadline = None
        cycle = self.cycle
        if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
            log.info("closed a connection from %s: no complete request head within %g s", _peer(self), self.head_timeout_s)
            _count("head_timeout")
            self.transport.close()

    def _body_overdue(self) -> None:
        self._head_deadline = None
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_complete and not self.transport.is_closing():
            log.info("closed a connection from %s: the request body did not arrive within %g s", _peer(self),
                     self.body_timeout_s)
            _count("body_timeout")
            if not cycle.response_started:
                self._refuse(408, "body_timeout", count=False)
            else:
                self.transport.close()

    def _refuse(self, status: int, reason: str, *, count: bool = True) -> None:
        """Answer ``status`` in OpenAI's error shape and close (below the app: nothing of the
        request reached it, or what did is abandoned)."""
        import orjson

        if count:
            log.info("refused a request from %s: %s", _peer(self), reason)
            _count(reason)
        body = orjson.dumps({"error": {"message": _MESSAGES[status], "type": "invalid_request_error", "param": None,
                                       "code": reason}})
        if not self.transport.is_closing():
            self.transport.write(_STATUS_LINES[status] + b"content-type: application/json\r\ncontent-length: "
                                 + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()


def _peer(protocol: Any) -> str:
    client = getattr(protocol, "client", None)
    return f"{client[0]}:{client[1]}" if client else "?"


def uvicorn_options(*, max_connections: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that bound what one caller can
    hold. The deadlines and the connection cap are the platform's HTTP settings, as the API's
    (``ABLAB_HTTP_HEADER_TIMEOUT_S``, ``ABLAB_HTTP_BODY_TIMEOUT_S``, ``ABLAB_HTTP_MAX_CONNECTIONS``);
    the protocol is named by import path, so worker processes load it (and the settings) too."""
    if max_connections is None:
        from ablab.platform.config import get_settings

        max_connections = get_settings().http_max_connections
    return {
        "http": f"{__name__}:GatewayHTTPProtocol",
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": max_connections,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,  # under h11 (no httptools), its own head bound
    }
