"""The body-limit middleware on its own: pass-through, 413 before/while reading, 408 for a stalled body."""

from __future__ import annotations

import asyncio
import json

from ablab.platform.api.limits import BodyLimitMiddleware


async def echo_app(scope, receive, send) -> None:
    from starlette.requests import Request

    body = await Request(scope, receive).body()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def call(middleware: BodyLimitMiddleware, chunks: list[bytes], *, headers=(), stall: bool = False):
    """Run one request through ``middleware``; returns (status, body, chunks the app pulled)."""
    pulled = []

    async def receive():
        if pulled.__len__() < len(chunks):
            pulled.append(chunks[len(pulled)])
            return {"type": "http.request", "body": pulled[-1], "more_body": len(pulled) < len(chunks) or stall}
        await asyncio.Event().wait()  # a client that stopped sending
        return {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": list(headers)}
    asyncio.run(middleware(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, len(pulled), dict(start["headers"])


def test_bodies_within_the_limit_pass_through() -> None:
    status, body, _, _ = call(BodyLimitMiddleware(echo_app, max_bytes=100, timeout_s=5), [b"a" * 60, b"b" * 40])
    assert (status, body) == (200, b"100")


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    status, body, pulled, headers = call(BodyLimitMiddleware(echo_app, max_bytes=100, timeout_s=5), [b"a" * 10],
                                         headers=[(b"content-length", b"101")])
    assert status == 413 and pulled == 0 and json.loads(body)["field"] == "body"
    assert headers[b"connection"] == b"close"


def test_a_chunked_body_is_cut_off_as_it_passes_the_limit() -> None:
    chunks = [b"x" * 40] * 100
    status, body, pulled, _ = call(BodyLimitMiddleware(echo_app, max_bytes=100, timeout_s=5), chunks)
    assert status == 413 and pulled == 3 and "limit" in json.loads(body)["detail"]


def test_a_stalled_body_gets_408() -> None:
    status, body, pulled, _ = call(BodyLimitMiddleware(echo_app, max_bytes=100, timeout_s=0.3), [b"x" * 10], stall=True)
    assert status == 408 and pulled == 1 and json.loads(body)["title"] == "Request timeout"
