"""Connections to the backends: a few small httpx pools per backend instead of one large one.

httpcore's pool matches every queued request against every connection on each request
start and each response close, so its cost per request grows with in-flight requests ×
connections (at 64 streams it was the gateway's largest cost in a profile). Round-robin over
``shards`` pools keeps each pool's product small; connections are still reused (keep-alive).
"""

from __future__ import annotations

import itertools

import httpx

from ablab.platform.gateway.settings import Backend

DEFAULT_SHARDS = 8


class UpstreamPool:
    def __init__(self, backend: Backend, *, shards: int = DEFAULT_SHARDS, verify: object) -> None:
        timeout = httpx.Timeout(backend.timeout_s, connect=min(10.0, backend.timeout_s))
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=30.0)
        self.clients = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=verify) for _ in range(shards)]  # type: ignore[arg-type]
        self._next = itertools.cycle(self.clients).__next__

    def client(self) -> httpx.AsyncClient:
        return self._next()

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()


def upstream_pools(backends: dict[str, Backend], *, shards: int = DEFAULT_SHARDS) -> dict[str, UpstreamPool]:
    verify = httpx.create_ssl_context()  # one context for every pool: each costs ~0.3 s of CPU to build
    return {name: UpstreamPool(b, shards=shards, verify=verify) for name, b in backends.items()}
