"""A scripted OpenAI-compatible backend: a tiny real HTTP/1.1 server (asyncio, keep-alive)
whose answers follow a script chosen by the request's ``model``. The gateway's contract
tests and ``benchmarks/bench_gateway.py`` run against it: it costs almost nothing per
request, so what they measure is the proxy.

Scripts (``model``): ``ok`` (role-only first chunk, content, usage chunk ``choices: []`` when
asked), ``usage-null`` (usage chunk with ``choices: null``), ``no-usage``, ``tools``,
``reasoning``, ``garbage`` (a non-JSON chunk mid-stream), ``http429``, ``http500``,
``slow`` (a chunk every 20 ms), ``sleep-<ms>`` (a chunk every <ms> ms; a whole answer after
tokens × <ms>), ``hang`` (accepts the request and never answers), ``flood`` (one SSE event that never ends:
4 MiB without a separator), ``die`` (the connection drops
mid-stream), ``bad-json`` (non-streaming 200 with a non-JSON body). Anything else behaves as ``ok``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

WORDS = ("Hello", " there", ",", " this", " is", " a", " scripted", " answer", ".")


def _delay(script: str) -> float:
    """Seconds between chunks of a ``slow`` or ``sleep-<ms>`` script (0: at once)."""
    if script == "slow":
        return 0.02
    if script.startswith("sleep-"):
        try:
            return max(0.0, float(script[6:]) / 1000.0)
        except ValueError:
            return 0.0
    return 0.0


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class ScriptedBackend:
    """``with ScriptedBackend() as b: b.url`` → ``http://127.0.0.1:PORT/v1``. ``requests``
    keeps the last bodies and headers received (for asserting what reached the backend)."""

    def __init__(self, *, tokens: int = len(WORDS), host: str = "127.0.0.1", port: int = 0) -> None:
        self.tokens = tokens
        self.host, self.port = host, port
        self.requests: deque[tuple[dict[str, str], dict[str, Any]]] = deque(maxlen=256)
        self.disconnects = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> ScriptedBackend:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._conn, self.host, self.port, backlog=1024))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-backend", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shutdown() -> None:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ScriptedBackend:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def serve_forever(self) -> None:
        """Run in the current loop (the benchmark's own process)."""
        server = await asyncio.start_server(self._conn, self.host, self.port, backlog=4096)
        async with server:
            await server.serve_forever()

    # -- HTTP ----------------------------------------------------------------------------

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._respond(method, path, headers, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _respond(self, method: str, path: str, headers: dict[str, str], raw: bytes, w: asyncio.StreamWriter) -> bool:
        if method == "GET" and path.endswith("/models"):
            self._send(w, 200, json.dumps({"object": "list", "data": [{"id": "ok", "object": "model", "owned_by": "scripted"}]}).encode())
            return True
        body = json.loads(raw) if raw else {}
        self.requests.append((headers, body))
        script = body.get("model", "ok")
        script = script if isinstance(script, str) else "ok"
        if script == "hang":
            await asyncio.sleep(3600)  # until the backend stops (its tasks are cancelled)
            return False
        delay = _delay(script)
        if script in ("http429", "http500"):
            status = int(script[4:])
            self._send(w, status, json.dumps({"error": {"message": f"scripted {status}", "type": "server_error"}}).encode())
            return True
        chat = path.endswith("/chat/completions")
        rid = headers.get("x-request-id", "req")
        if not body.get("stream"):
            if script == "bad-json":
                self._send(w, 200, b"<html>not json</html>", ctype="text/html")
                return True
            if delay:
                await asyncio.sleep(delay * self.tokens)
            text = "".join(WORDS[i % len(WORDS)] for i in range(self.tokens))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} if chat
                      else {"index": 0, "text": text, "finish_reason": "stop"})
            obj = {"id": rid, "object": "chat.completion" if chat else "text_completion", "model": script,
                   "choices": [choice], "usage": {"prompt_tokens": 11, "completion_tokens": self.tokens, "total_tokens": 11 + self.tokens}}
            self._send(w, 200, json.dumps(obj).encode())
            return True
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                b"x-request-id: " + rid.encode() + b"\r\n\r\n")
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        try:
            for piece in self._script(script, chat, rid, include_usage):
                if piece is None:
                    await asyncio.sleep(delay)
                    continue
                if piece == b"DIE":
                    await w.drain()
                    w.transport.abort()
                    return False
                w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                if delay:
                    await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()
        except ConnectionError:
            self.disconnects += 1
            return False
        return True

    def _script(self, script: str, chat: bool, rid: str, include_usage: bool) -> Iterator[bytes | None]:
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": 0, "model": script}

        def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": d, "finish_reason": finish} if chat else {"index": 0, "text": d.get("content", ""), "finish_reason": finish}
            return _chunk({**base, "choices": [choice]})

        if chat:
            yield delta({"role": "assistant", "content": ""})
        if script == "flood":
            yield b"data: {\"x\":\""
            for _ in range(64):
                yield b"x" * 65536
            return
        for i in range(self.tokens):
            if script.startswith("sleep-"):
                yield None  # before each chunk: the first one too (TTFT = one delay)
            if script == "tools":
                call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ""}} if i == 0 \
                    else {"index": 0, "function": {"arguments": '{"q":1}'[i % 7:i % 7 + 1] or "}"}}
                yield delta({"tool_calls": [call]})
            elif script == "reasoning" and i < self.tokens // 2:
                yield delta({"reasoning_content": WORDS[i % len(WORDS)]})
            else:
                yield delta({"content": WORDS[i % len(WORDS)]})
            if script == "garbage" and i == 1:
                yield b"data: this is not json {\n\n"
            if script == "slow":
                yield None
            if script == "die" and i == 2:
                yield b"DIE"
        yield delta({}, "tool_calls" if script == "tools" else "stop")
        if include_usage and script not in ("no-usage",):
            usage = {"prompt_tokens": 11, "completion_tokens": self.tokens, "total_tokens": 11 + self.tokens}
            yield _chunk({**base, "choices": None if script == "usage-null" else [], "usage": usage})
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _send(w: asyncio.StreamWriter, status: int, body: bytes, *, ctype: str = "application/json") -> None:
        reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "X")
        w.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
