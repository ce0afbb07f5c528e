"""The data plane's HTTP client against real servers: keep-alive reuse, a stale connection
retried once, httpx's exception types for the serving path, coalesced reads, timeouts."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from ablab.platform.gateway.relay import RelayClient
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab_testing.gateway_harness import Gateway, free_port, local_sdk

BODY = b'{"model":"ok","stream":true,"messages":[{"role":"user","content":"hi"}]}'


async def _stream(client: RelayClient, url: str, model: str = "ok") -> tuple[int, bytes, int]:
    body = BODY.replace(b'"ok"', b'"' + model.encode() + b'"')
    resp = await client.send(client.build_request("POST", url + "/chat/completions", content=body,
                                                  headers={"content-type": "application/json"}))
    pieces = [p async for p in resp.aiter_raw()]
    await resp.aclose()
    return resp.status_code, b"".join(pieces), len(pieces)


def test_streams_reuse_one_connection_and_read_the_whole_answer(backend: ScriptedBackend) -> None:
    async def main() -> None:
        client = RelayClient(timeout_s=5)
        for _ in range(5):
            status, data, _ = await _stream(client, backend.url)
            assert status == 200 and data.endswith(b"data: [DONE]\n\n") and data.count(b"data: ") == 12
        assert client.open_connections == 1  # kept alive and reused
        status, data, _ = await _stream(client, backend.url, "http429")
        assert status == 429 and b"scripted 429" in data
        await client.aclose()

    asyncio.run(main())


def test_a_backend_that_sent_everything_at_once_is_relayed_in_one_piece(backend: ScriptedBackend) -> None:
    async def main() -> None:
        client = RelayClient(timeout_s=5)
        await _stream(client, backend.url)
        await asyncio.sleep(0.05)  # the whole answer is in the socket before the first read
        resp = await client.send(client.build_request("POST", backend.url + "/chat/completions", content=BODY))
        await asyncio.sleep(0.05)
        pieces = [p async for p in resp.aiter_raw()]
        await resp.aclose()
        assert len(pieces) == 1 and pieces[0].count(b"data: ") == 12  # 12 events, one write to the caller
        await client.aclose()

    asyncio.run(main())


def test_errors_are_httpx_types_and_a_stale_connection_is_retried(backend: ScriptedBackend) -> None:
    async def main() -> None:
        client = RelayClient(timeout_s=0.3)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        with pytest.raises(httpx.ConnectError):
            await _stream(client, f"http://127.0.0.1:{closed}/v1")
        with pytest.raises(httpx.ReadTimeout):
            await _stream(client, backend.url, "hang")
        with pytest.raises(httpx.RemoteProtocolError):
            await _stream(client, backend.url, "die")
        # an idle connection the server closed is noticed, and the request goes out on a new one
        status, _, _ = await _stream(client, backend.url)
        assert status == 200
        for conns in client._idle.values():
            for conn in conns:
                assert conn.transport is not None
                conn.transport.close()  # as if the backend's keep-alive timer had closed it
        status, data, _ = await _stream(client, backend.url)
        assert status == 200 and data.endswith(b"[DONE]\n\n")
        await client.aclose()

    asyncio.run(main())


def test_a_reused_connection_closed_before_answering_is_retried_once_on_a_new_one() -> None:
    """A backend that answers one request per connection and drops the second unanswered (a
    keep-alive timer firing as the request arrives): the caller never sees it."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    connections = 0

    async def one_request_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(answer)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the second request on this connection: dropped
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(one_request_per_connection, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = RelayClient(timeout_s=5)
        for _ in range(3):
            resp = await client.send(client.build_request("POST", url + "/x", content=b"{}"))
            assert resp.status_code == 200 and await resp.aread() == b"{}"
            await resp.aclose()
        assert connections == 3  # requests 2 and 3 each failed on a reused connection, then succeeded
        await client.aclose()
        server.close()

    asyncio.run(main())


def test_a_caller_gone_mid_stream_under_the_gateways_own_http_protocol(backend: ScriptedBackend, tmp_path) -> None:
    """What ``ablab gateway`` serves with (uvloop and the hardened HTTP protocol): a caller that
    hangs up mid-stream ends the relay (the backend's connection is dropped, not drained), its
    event says so, and nothing stays in flight."""
    import threading

    import uvicorn

    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.limits import uvicorn_options
    from ablab.platform.gateway.settings import Backend, GatewaySettings

    settings = GatewaySettings(backends={"scripted": Backend("scripted", backend.url, timeout_s=5.0)},
                               default_backend="scripted", outbox_dir=tmp_path / "outbox")
    app = create_app(settings, sdk=local_sdk({"a": {}}), ship=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop",
                                           **uvicorn_options(max_connections=64)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.01)
    gw = Gateway(f"http://127.0.0.1:{port}", tmp_path / "outbox", app)
    try:
        body = {"model": "sleep-200", "messages": [{"role": "user", "content": "hi"}], "stream": True, "user": "u1"}
        with httpx.Client(timeout=10) as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            trace = r.headers["x-ablab-trace-id"]
            for _ in r.iter_raw():
                break  # gone after the first bytes; the backend would take 9 × 200 ms more
        for _ in range(200):  # until the gateway has written the request's event (state, not time)
            if any(e["trace_id"] == trace and e["type"] == "inference" for e in gw.events()):
                break
            httpx.get(gw.url + "/healthz", timeout=10)
        ev = next(e for e in gw.events() if e["trace_id"] == trace and e["type"] == "inference")
        assert ev["error"] == "client_disconnected" and ev["e2e_ms"] < 1500
        assert gw.state().inflight["scripted"] == 0
        assert gw.state().clients["scripted"].data.open_connections == 0  # the backend's connection dropped
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_backend_behind_an_environment_proxy_keeps_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    from ablab.platform.gateway.settings import Backend
    from ablab.platform.gateway.upstream import upstream_pools

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    pools = upstream_pools({"hosted": Backend("hosted", "https://api.example.com/v1"),
                            "local": Backend("local", "http://127.0.0.1:8081/v1")})
    assert isinstance(pools["hosted"].relay(), httpx.AsyncClient)  # httpx honours the proxy
    assert isinstance(pools["local"].relay(), RelayClient)

    async def close() -> None:
        for pool in pools.values():
            await pool.aclose()

    asyncio.run(close())
