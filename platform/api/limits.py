"""Request-body limits for every route: size (413) and read time (408), in pure ASGI.

Measured on the hot path: an ``asyncio.timeout`` around each body read cost ~7 µs per
request (a timer handle scheduled and cancelled each time), about nine times the rest of
this middleware. Body reads waiting on the client are therefore registered in a dict and
one sweeper task per event loop, alive only while reads are pending, cancels those past
their deadline every ``SWEEP_S``; a read that completes at once costs two dict operations.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from ablab.platform.api import problems

SWEEP_S = 0.25


class _Read:
    __slots__ = ("deadline", "task", "timed_out")

    def __init__(self, deadline: float, task: asyncio.Task[Any]) -> None:
        self.deadline, self.task, self.timed_out = deadline, task, False


class BodyLimitMiddleware:
    """Bounds every request body before any route reads it.

    - size: a declared ``Content-Length`` over ``max_bytes`` is answered 413 without reading;
      a chunked body is cut off with 413 as soon as it passes ``max_bytes`` (never read whole);
    - time: the whole body must arrive within ``timeout_s`` of the request head (give or take
      ``SWEEP_S``), else 408, so a client trickling a body cannot hold a connection and a
      task indefinitely.

    The route sees a disconnect instead of the rest of the body; whatever it answers to
    that is replaced by the problem+json refusal, sent with ``Connection: close``, and
    counted in ``ablab_http_bodies_refused_total{reason}``.
    """

    def __init__(self, app: Any, *, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._reads: dict[int, _Read] = {}
        self._ids = itertools.count()
        self._sweeper: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(scope, send, 413, "too_large",
                          f"body of {declared} bytes is over the {self.max_bytes}-byte limit; send smaller batches")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        received = 0
        body_done = False
        refused: tuple[int, str, str] | None = None
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, body_done, refused
            if refused is not None:
                return {"type": "http.disconnect"}
            if body_done:  # waiting for a disconnect after the body is not reading it
                after: dict[str, Any] = await receive()
                return after
            read = _Read(deadline, asyncio.current_task())  # type: ignore[arg-type]
            key = next(self._ids)
            self._reads[key] = read
            self._ensure_sweeper(loop)
            try:
                message: dict[str, Any] = await receive()
            except asyncio.CancelledError:
                if not read.timed_out:
                    raise
                read.task.uncancel()
                refused = (408, "too_slow", f"the request body did not arrive within {self.timeout_s:g} s")
                return {"type": "http.disconnect"}
            finally:
                self._reads.pop(key, None)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = (413, "too_large", f"body is over the {self.max_bytes}-byte limit (cut off at "
                                                 f"{received} bytes); send smaller batches")
                    return {"type": "http.disconnect"}
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if refused is not None and not started:
                return  # the route's answer to a body it could not read; ours goes out below
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if refused is None or started:
                raise
        if refused is not None and not started:
            await _refuse(scope, send, *refused)

    def _ensure_sweeper(self, loop: asyncio.AbstractEventLoop) -> None:
        sweeper = self._sweeper
        if sweeper is None or sweeper.done() or sweeper.get_loop() is not loop:
            self._sweeper = loop.create_task(self._sweep(loop), name="ablab-body-deadlines")

    async def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._reads:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            for read in list(self._reads.values()):
                if read.deadline <= now and not read.timed_out and read.task.get_loop() is loop:
                    read.timed_out = True
                    read.task.cancel()


async def _refuse(scope: dict[str, Any], send: Any, status: int, reason: str, detail: str) -> None:
    state = getattr(scope["app"].state, "ablab", None) if "app" in scope else None
    if state is not None:
        state.metrics.bodies_refused.labels(reason).inc()
    title = "Payload too large" if status == 413 else "Request timeout"
    response = problems.problem(status, title, detail, field="body")
    response.headers["Connection"] = "close"
    await response(scope, _no_receive, send)


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() and len(text) < 20 else None
    return None
