"""The CLI's bridge to the ClickHouse store (``ablab.streaming.store``)."""

from __future__ import annotations

from ablab.cli._common import console, fail
from ablab.platform.config import Settings


def upgrade(settings: Settings) -> None:
    try:
        from ablab.streaming.store import apply_ddl, get_clickhouse_client
    except ImportError:
        console.print("[yellow]ClickHouse store not installed in this build; skipped its DDL[/]")
        return
    try:
        client = get_clickhouse_client(settings)
        applied = apply_ddl(client)
    except Exception as exc:
        fail(f"ClickHouse DDL failed: {exc}", hint="check ABLAB_CLICKHOUSE_URL; in embedded mode stop the API first (chdb allows one process)")
    console.print(f"[green]ClickHouse[/] DDL applied ({applied})")
