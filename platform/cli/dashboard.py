"""`ablab dashboard`: run the Streamlit app against the ablab HTTP API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from ablab.platform.cli._common import console, fail
from ablab.platform.config import get_settings


def app_file() -> Path:
    """The Streamlit script of the installed ``ablab.dashboards`` package."""
    import ablab.dashboards

    for location in ablab.dashboards.__path__:
        candidate = Path(location) / "app.py"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("ablab.dashboards has no app.py")


def streamlit_command(*, port: int, host: str, headless: bool) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(app_file()),
        "--server.port", str(port), "--server.address", host,
        "--server.headless", "true" if headless else "false",
        "--browser.gatherUsageStats", "false",
        "--theme.base", "light",
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
    try:
        code = subprocess.call(streamlit_command(port=port, host=host, headless=headless), env=env)
    except KeyboardInterrupt:
        code = 0
    if code not in (0, -2, 130):
        fail(f"streamlit exited with status {code}", hint="is the port free? try --port")


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
