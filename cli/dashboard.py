"""`ablab dashboard`: run the Streamlit app against the ablab HTTP API."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from ablab.cli._common import console, fail
from ablab.platform.config import get_settings


def app_file(name: str = "asgi.py") -> Path:
    """A file of the installed ``ablab.dashboards`` package: by default its server
    (``asgi.py``: the Streamlit app ``app.py`` plus the sign-in cookie's route)."""
    import ablab.dashboards

    for location in ablab.dashboards.__path__:
        candidate = Path(location) / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"ablab.dashboards has no {name}")


def streamlit_command(*, port: int, host: str, headless: bool) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(app_file()),
        "--server.port", str(port), "--server.address", host,
        "--server.headless", "true" if headless else "false",
        "--browser.gatherUsageStats", "false",
        "--theme.base", "light", "--client.toolbarMode", "viewer",
    ]


def dashboard(
    port: int = typer.Option(None, help="Port (default ABLAB_DASHBOARD_PORT, 8501)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    api_url: str = typer.Option(None, help="ablab API to talk to (default ABLAB_API_URL)."),
    headless: bool = typer.Option(True, help="Do not open a browser."),
) -> None:
    """Serve the Streamlit app (experiments, set-up forms, results)."""
    settings = get_settings()
    port = port or settings.dashboard_port
    env = {**os.environ, "ABLAB_API_URL": api_url or settings.api_url}
    console.print(f"[green]ablab dashboard[/] on http://{host}:{port} (API {env['ABLAB_API_URL']})")
    command = streamlit_command(port=port, host=host, headless=headless)
    try:
        # Become the Streamlit server, so a supervisor's SIGTERM reaches it (a child would be orphaned).
        os.execve(command[0], command, env)
    except OSError as exc:
        fail(f"could not start streamlit: {exc}")


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
