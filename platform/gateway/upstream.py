"""Connections to the backends, per backend: the data plane's :class:`~.relay.RelayClient`
(raw asyncio HTTP/1.1 with keep-alive; what relayed requests use) and a few small httpx pools
for the side calls (``/v1/models``, the prompt strategies' tokenizer and scorer calls).

The httpx pools are sharded because httpcore's pool matches every queued request against
every connection on each request start and close; its cost per request grows with in-flight
requests × connections. The side calls are few, so two shards are enough.
"""

from __future__ import annotations

import itertools
import ssl
import urllib.request
from typing import cast
from urllib.parse import urlsplit

import httpx

from ablab.platform.gateway.relay import RelayClient
from ablab.platform.gateway.settings import Backend

DEFAULT_SHARDS = 2


class UpstreamPool:
    def __init__(self, backend: Backend, *, shards: int = DEFAULT_SHARDS, verify: ssl.SSLContext) -> None:
        timeout = httpx.Timeout(backend.timeout_s, connect=min(10.0, backend.timeout_s))
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=30.0)
        self.clients = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=verify) for _ in range(shards)]
        self._next = itertools.cycle(self.clients).__next__
        self.data = RelayClient(timeout_s=backend.timeout_s, connect_timeout_s=min(10.0, backend.timeout_s), ssl=verify)
        # A backend reached through an HTTP(S)_PROXY from the environment (httpx honours them; the
        # relay client speaks only directly): its relayed requests keep going through httpx.
        self.proxied = _proxied(backend.url)

    def client(self) -> httpx.AsyncClient:
        """An httpx client for side calls."""
        return self._next()

    def relay(self) -> RelayClient:
        """The data plane's client: every relayed request goes through it (through httpx, which
        has the same ``build_request``/``send``/response surface, for a proxied backend)."""
        if self.proxied:
            return cast(RelayClient, self.clients[0])
        return self.data

    async def aclose(self) -> None:
        await self.data.aclose()
        for c in self.clients:
            await c.aclose()


def _proxied(url: str) -> bool:
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies.get(parts.scheme) and not proxies.get("all"):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def upstream_pools(backends: dict[str, Backend], *, shards: int = DEFAULT_SHARDS) -> dict[str, UpstreamPool]:
    verify = httpx.create_ssl_context()  # one context for every pool: each costs ~0.3 s of CPU to build
    return {name: UpstreamPool(b, shards=shards, verify=verify) for name, b in backends.items()}
