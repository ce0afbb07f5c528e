"""`ablab db upgrade|current`: config-DB migrations (Alembic) and the ClickHouse DDL."""

from __future__ import annotations

import typer

from ablab.cli._common import console, fail, out
from ablab.platform.config import get_settings

db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)


@db_app.command("upgrade")
def upgrade(
    revision: str = typer.Option("head", help="Alembic revision to upgrade the config DB to."),
    clickhouse: bool = typer.Option(True, help="Also apply the ClickHouse DDL migrations."),
) -> None:
    """Apply config-DB migrations (Alembic) and ClickHouse DDL. Idempotent."""
    from ablab.platform.registry.migrate import current
    from ablab.platform.registry.migrate import upgrade as alembic_upgrade

    settings = get_settings()
    url = settings.resolved_database_url
    try:
        alembic_upgrade(url, revision)
    except Exception as exc:
        fail(f"config DB migration failed: {exc}", hint="check ABLAB_DATABASE_URL and that the database is reachable")
    console.print(f"[green]config DB[/] at revision [bold]{current(url)}[/] ({settings.public_dict()['database_url'] or url.split('///')[0] + '///…'})")
    if clickhouse:
        from ablab.cli import analytics_store

        analytics_store.upgrade(settings)


@db_app.command("current")
def show_current() -> None:
    """Print the config DB's migration revision."""
    from ablab.platform.registry.migrate import current

    out.print(current(get_settings().resolved_database_url) or "none")


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
