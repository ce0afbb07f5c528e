"""ClickHouse store: the one client factory, DDL migrations, parameterized queries."""

from ablab.streaming.store.client import StoreURLError, get_clickhouse_client, make_client
from ablab.streaming.store.ddl import applied_versions, apply_ddl, migration_files

__all__ = [
    "StoreURLError",
    "applied_versions",
    "apply_ddl",
    "get_clickhouse_client",
    "make_client",
    "migration_files",
]
