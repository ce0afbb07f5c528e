"""The gateway's HTTP limits, probed with raw sockets against a real gateway (uvicorn with
``limits.uvicorn_options``, the options ``ablab gateway`` serves with) in front of the
scripted backend: oversized and trickled heads and bodies, a hang-up mid-upload, the
connection cap."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from ablab.platform.gateway.app import create_app
from ablab.platform.gateway.limits import GatewayHTTPProtocol, uvicorn_options
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab_testing.gateway_harness import free_port, local_sdk

LIMIT = 64 * 1024
CHAT = json.dumps({"model": "ok", "messages": [{"role": "user", "content": "hi"}]}).encode()


@contextmanager
def limited_gateway(backend_url: str, tmp: Path, *, max_connections: int = 1024) -> Iterator[tuple[int, Any]]:
    settings = GatewaySettings(backends={"s": Backend("s", backend_url, timeout_s=5.0)}, default_backend="s",
                               outbox_dir=tmp / "outbox", max_body_bytes=LIMIT)
    app = create_app(settings, sdk=local_sdk({"a": {}}), ship=False)
    port = free_port()
    # log_config=None: uvicorn's own records reach the root logger (and caplog)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on",
                            **uvicorn_options(max_connections=max_connections))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "gateway failed to start"
        thread.join(0.01)
    try:
        yield port, app
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(autouse=True)
def short_deadlines(monkeypatch):
    monkeypatch.setattr(GatewayHTTPProtocol, "head_timeout_s", 0.5)
    monkeypatch.setattr(GatewayHTTPProtocol, "body_timeout_s", 0.5)


@pytest.fixture
def gw(backend: ScriptedBackend, tmp_path: Path):
    with limited_gateway(backend.url, tmp_path) as found:
        yield found


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything until the server closes (or ``timeout``)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def status_and_body(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


def head(path: str = "/v1/chat/completions", **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gw", "Content-Type: application/json",
             *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def metric(app: Any, reason: str) -> float:
    return app.state.holder["state"].metrics.registry.get_sample_value("ablab_gateway_http_refused_total", {"reason": reason}) or 0.0


def test_a_declared_oversized_body_is_refused_before_a_byte_is_read(gw, backend) -> None:
    port, app = gw
    seen = len(backend.requests)
    with connect(port) as s:
        s.sendall(head(Content_Length=str(300 * 1024 * 1024)))  # the head only: nothing else will come
        status, body = status_and_body(read_all(s))
    assert status == 413 and body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "body"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert len(backend.requests) == seen and metric(app, "too_large") == 1


def test_a_chunked_upload_is_cut_off_at_the_limit_not_read_whole(gw) -> None:
    port, _ = gw
    piece = b"x" * 16384
    sent = 0
    with connect(port) as s:
        s.sendall(head(Transfer_Encoding="chunked"))
        answer = b""
        try:
            while sent < 50 * LIMIT:
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
                if select.select([s], [], [], 0.02)[0]:
                    answer = read_all(s)
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = answer or read_all(s)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert sent < 20 * LIMIT  # stopped near the limit (plus what the sockets' buffers held), not at 50x


def test_a_huge_header_is_refused_as_it_arrives(gw) -> None:
    port, app = gw
    with connect(port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Big: ")
        answer = b""
        for _ in range(2000):  # up to 8 MB of one header value, 4 KiB at a time
            try:
                s.sendall(b"a" * 4096)
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([s], [], [], 0.005)[0]:
                answer = read_all(s)
                break
    status, body = status_and_body(answer)
    assert status == 431 and body["error"]["code"] == "head_too_large"
    assert metric(app, "head_too_large") == 1


def test_too_many_headers_are_refused(gw) -> None:
    port, app = gw
    with connect(port) as s:
        s.sendall(head(**{f"X_H{i}": "1" for i in range(500)}, Content_Length=str(len(CHAT))) + CHAT)
        status, body = status_and_body(read_all(s))
    assert status == 431 and body["error"]["code"] == "too_many_headers"
    with connect(port) as s:  # a normal number of headers is fine
        s.sendall(head(**{f"X_H{i}": "1" for i in range(40)}, Content_Length=str(len(CHAT)), Connection="close") + CHAT)
        assert read_all(s).startswith(b"HTTP/1.1 200")


def test_a_slow_head_is_closed_at_its_deadline(gw) -> None:
    port, app = gw
    with connect(port) as s:
        started = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
        for _ in range(3):  # a byte now and then does not extend it (slowloris)
            time.sleep(0.2)
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                break
        assert read_all(s, timeout=10) == b""
        assert time.monotonic() - started < 5
    assert metric(app, "head_timeout") == 1


def test_a_slow_body_gets_408_and_the_connection_closed(gw, backend) -> None:
    port, app = gw
    seen = len(backend.requests)
    with connect(port) as s:
        s.sendall(head(Content_Length=str(len(CHAT))) + CHAT[:10])
        started = time.monotonic()
        status, body = status_and_body(read_all(s, timeout=10))
    assert status == 408 and body["error"]["code"] == "body_timeout" and time.monotonic() - started < 5
    assert len(backend.requests) == seen and metric(app, "body_timeout") == 1


def test_a_caller_hanging_up_mid_upload_is_one_log_line_and_the_gateway_serves_on(gw, caplog) -> None:
    caplog.set_level("INFO")
    port, app = gw
    with connect(port) as s:
        s.sendall(head(Content_Length="50000") + b"{" + b" " * 20000)
    deadline = time.monotonic() + 10
    while metric(app, "client_gone") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(app, "client_gone") == 1
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=CHAT, timeout=10)
    assert r.status_code == 200
    lines = [rec for rec in caplog.records if "hung up" in rec.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "INFO"
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= 40], caplog.text


def test_the_connection_cap_refuses_past_it(backend, tmp_path) -> None:
    with limited_gateway(backend.url, tmp_path, max_connections=4) as (port, _):
        idle = [connect(port) for _ in range(4)]
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=CHAT, timeout=10)
            assert r.status_code == 503
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the server notices the closes
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=CHAT, timeout=10)
            if r.status_code == 200:
                break
            time.sleep(0.05)
        assert r.status_code == 200


def test_what_the_http_parser_refuses_is_a_400_in_openai_shape(gw) -> None:
    port, app = gw
    for bad in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: abc\r\n\r\n",
                b"GARBAGE\x00\x01 / HTTP/9\r\n\r\n"):
        with connect(port) as s:
            s.sendall(bad)
            status, body = status_and_body(read_all(s))
        assert status == 400 and body["error"]["code"] == "invalid_http" and body["error"]["type"] == "invalid_request_error"
    assert metric(app, "invalid_http") == 2
