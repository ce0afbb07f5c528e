"""The one ClickHouse client factory, on clickhouse-connect.

Two kinds of URL (``Settings.clickhouse_url``):

- ``chdb:///abs/path`` (the embedded default, under ``ABLAB_HOME``): clickhouse-connect's own
  chDB backend, ClickHouse's engine inside this process. chDB locks its data directory and
  allows one engine path per process, so in embedded mode the API process owns the store
  and runs the loader in a thread; every other process goes through the API.
- ``http(s)://user:pass@host:8123/db``: a ClickHouse server.

Both give the same ``clickhouse_connect`` client, so every query runs unchanged on either.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ablab.platform.config import Settings


class StoreURLError(ValueError):
    """A ClickHouse URL that names no usable store."""


def make_client(url: str, *, settings: dict[str, object] | None = None) -> Client:
    """A client for ``url``: ``chdb://…`` embedded, ``http(s)://…`` server."""
    import clickhouse_connect

    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "chdb":
        path = parsed.path if not parsed.netloc else None
        if parsed.netloc and parsed.netloc not in ("memory", ":memory:"):
            raise StoreURLError(
                f"clickhouse_url {url!r}: use chdb:///absolute/path (three slashes) or chdb://memory"
            )
        if path:
            Path(path).mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=url, settings=settings or {})
    if scheme in ("http", "https"):
        if not parsed.hostname:
            raise StoreURLError(f"clickhouse_url {url!r} has no host")
        database = unquote(parsed.path.strip("/")) or "default"
        return clickhouse_connect.get_client(
            host=parsed.hostname,
            port=parsed.port or (8443 if scheme == "https" else 8123),
            username=unquote(parsed.username or "default"),
            password=unquote(parsed.password or ""),
            database=database,
            secure=scheme == "https",
            settings=settings or {},
        )
    raise StoreURLError(f"clickhouse_url {url!r}: scheme must be chdb, http or https, got {scheme or 'none'!r}")


def get_clickhouse_client(settings: Settings) -> Client:
    """The store named by ``settings.resolved_clickhouse_url`` (embedded chDB by default)."""
    return make_client(settings.resolved_clickhouse_url)
