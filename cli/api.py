"""`ablab api`: serve the HTTP API with uvicorn."""

from __future__ import annotations

import typer

from ablab.cli._common import console
from ablab.platform.config import get_settings


def api(
    host: str = typer.Option(None, help="Interface to bind (default ABLAB_API_HOST, 127.0.0.1)."),
    port: int = typer.Option(None, help="Port (default ABLAB_API_PORT, 8000)."),
    workers: int = typer.Option(1, min=1, help="Worker processes (embedded chdb needs 1)."),
    migrate: bool = typer.Option(True, help="Apply config-DB migrations before serving."),
) -> None:
    """Serve the HTTP API (OpenAPI docs at /docs)."""
    import uvicorn

    from ablab.platform.api.server import uvicorn_options

    settings = get_settings()
    if migrate:
        from ablab.platform.registry.migrate import upgrade

        upgrade(settings.resolved_database_url)
    host = host or settings.api_host
    port = port or settings.api_port
    console.print(f"[green]ablab API[/] on http://{host}:{port} (docs at /docs)")
    uvicorn.run(
        "ablab.cli.asgi:app",
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
        **uvicorn_options(settings),
    )


def register(app: typer.Typer) -> None:
    app.command("api")(api)
