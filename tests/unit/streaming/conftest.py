"""The real ClickHouse engine in memory (chDB) for unit tests: one engine per process, so
each test gets a database of its own and drops it afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def memory_db() -> Iterator[Any]:
    """A clickhouse-connect client on a fresh, empty database of the in-memory engine."""
    from ablab.streaming.store import make_client

    handle = make_client("chdb://memory")
    database = f"t_{uuid.uuid4().hex[:10]}"
    handle.command(f"CREATE DATABASE {database}")
    handle.database = database
    yield handle
    handle.command(f"DROP DATABASE {database}")
    handle.close()
