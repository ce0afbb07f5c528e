"""The data plane's HTTP client against real servers: keep-alive reuse, a stale connection
retried once, httpx's exception types for the serving path, coalesced reads, timeouts."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from ablab.platform.gateway.relay import RelayClient
from ablab.platform.gateway.scripted import ScriptedBackend

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
