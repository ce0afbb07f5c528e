"""Two real API processes (uvicorn) sharing one database, SQLite file or PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ablab_testing import ApiServer, start_api, stop_api


@pytest.fixture(scope="module")
def two_apis(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, ApiServer]]:
    """``(a, b)``: each its own process, home and token set, over the same config DB."""
    servers: list[ApiServer] = []
    try:
        for name in ("api-a", "api-b"):
            servers.append(start_api(database_url, tmp_path_factory.mktemp(name)))
        yield servers[0], servers[1]
    finally:
        for server in servers:
            stop_api(server)
