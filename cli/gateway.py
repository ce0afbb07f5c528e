"""`ablab gateway`: the OpenAI-compatible experiment gateway."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ablab.cli._common import console, fail

if TYPE_CHECKING:
    from ablab.platform.gateway.settings import GatewaySettings

TOKEN_ENV = "ABLAB_SDK_TOKEN"


def gateway(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8090, min=1, max=65535, help="Port; clients use http://HOST:PORT/v1 as their base URL."),
    config: Path = typer.Option(None, "--config", exists=True, dir_okay=False,
                                help="YAML with `backends`, `default_backend`, `templates` (else ABLAB_GATEWAY_BACKENDS JSON)."),
    api_url: str = typer.Option(None, help="The ablab API (assignment config, events). Default ABLAB_API_URL."),
    token: str = typer.Option(None, envvar=TOKEN_ENV, show_envvar=True,
                              help="An sdk-scoped token (ablab keys create --name gateway --scope sdk)."),
    outbox: Path = typer.Option(None, help="Event outbox directory (default ABLAB_HOME/gateway-outbox)."),
    experiment: list[str] = typer.Option(None, "--experiment", help="Only assign these experiments (repeatable; default all)."),
    refresh_s: float = typer.Option(10.0, min=0.5, help="Seconds between assignment-config refreshes."),
    workers: int = typer.Option(1, "--workers", min=1, max=256,
                                help="Gateway processes sharing the port (SO_REUSEPORT); one forwarder ships every "
                                     "worker's outbox (OUTBOX/worker-<i>). One per core the gateway may use."),
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/models
    in front of your backends, assigning each unit (X-Ablab-Unit header, else the body's `user`)
    to its variant."""
    import uvicorn

    from ablab.platform.config import get_settings
    from ablab.platform.gateway.settings import METRICS_TOKEN_ENV, GatewayConfigError, load_settings

    base = get_settings()
    try:
        settings = load_settings(
            config_file=config,
            api_url=api_url or base.api_url,
            token=token or os.environ.get(TOKEN_ENV),
            outbox_dir=outbox or (base.home / "gateway-outbox"),
            refresh_s=refresh_s,
            experiments=tuple(experiment) if experiment else None,
        )
    except GatewayConfigError as exc:
        fail(str(exc), hint="see docs/gateway.md for the settings format")
    if not settings.token:
        console.print(f"[yellow]no sdk token[/]: requests go to {settings.default_backend!r}, nothing is assigned or "
                      f"recorded (set {TOKEN_ENV}; ablab keys create --name gateway --scope sdk)")
    names = ", ".join(f"{n} -> {b.url}" for n, b in settings.backends.items())
    console.print(f"[green]ablab gateway[/] on http://{host}:{port}/v1  backends: {names}  (default {settings.default_backend})")
    if settings.metrics_token_sha256 is not None:
        console.print(f"/metrics needs the bearer token in {METRICS_TOKEN_ENV}")
    if workers > 1:
        from ablab.platform.gateway.relay_workers import run

        console.print(f"{workers} workers; outboxes under {settings.outbox_dir}/worker-<i>, one forwarder")
        run(settings, workers=workers, host=host, port=port, factory=gateway_app, log_level=base.log_level)
        return
    app, sdk = gateway_app(settings, ship=True)
    try:
        from ablab.platform.gateway.limits import uvicorn_options  # head/body deadlines, header bounds, connection cap

        uvicorn.run(app, host=host, port=port, log_level=base.log_level.lower(), access_log=False, loop="uvloop",
                    **uvicorn_options())
    finally:
        if sdk is not None:
            sdk.close()


def gateway_app(settings: GatewaySettings, *, ship: bool) -> tuple[Any, Any]:
    """One process's gateway app, wired to the optional parts this install has: the in-repo
    model's token scorer for entropy compression (when torch is installed) and the assignment
    client (when there is an SDK token). Returns the app and the client to close at exit."""
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.rewrite import torch_available

    compress = None
    if torch_available():  # the in-repo model scores tokens for entropy compression
        from ablab.inference.compression import compress
    sdk = None
    if settings.token:
        from ablab.platform.sdk import AblabClient

        sdk = AblabClient(settings.api_url, settings.token, refresh_s=settings.refresh_s)
        if not sdk.wait_ready(10.0):
            console.print(f"[yellow]the assignment config is not loaded yet[/] (API at {settings.api_url}); units get "
                          "the default backend until it is")
    return create_app(settings, sdk=sdk, ship=ship, compress=compress), sdk


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
