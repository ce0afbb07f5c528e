"""The `ablab` command line.

Each concern keeps its commands in its own module here, exposing ``register(app)``.
Modules import their heavy dependencies (torch, pyflink, chdb) inside the command
bodies, so ``ablab --help`` stays fast and the light install (``pip install ablab``: the
SDK and the gateway) runs every command it can; the others name the extra they need.
"""

from __future__ import annotations

import importlib

import typer

COMMAND_MODULES = (
    "db",
    "keys",
    "api",
    "experiments",
    "ship",
    "streaming",
    "inference",
    "analysis",
    "ope",
    "dashboard",
    "stack",
    "gateway",
)

app = typer.Typer(
    name="ablab",
    help="Online A/B experimentation and attribution for LLM inference strategies.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        qualified = f"{__name__}.{name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            if exc.name == qualified:  # that part of the CLI is not built yet
                continue
            raise
        module.register(app)


_register_all()


# Top-level module -> the extra that installs it (pyproject.toml's optional dependencies).
EXTRA_OF = {
    "sqlalchemy": "server", "alembic": "server", "psycopg": "server", "scipy": "server", "pandas": "server",
    "pyarrow": "server", "clickhouse_connect": "server", "chdb": "server", "kafka": "server",
    "pyflink": "stream", "torch": "inference", "streamlit": "dashboard", "altair": "dashboard", "openai": "gateway",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that provides the module `exc` failed to import, if it is one of ours."""
    return EXTRA_OF.get((exc.name or "").partition(".")[0])


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        from rich.markup import escape

        from ablab.cli._common import console

        console.print(f"[bold red]error:[/] this command needs `{exc.name}`, which the light install leaves out")
        console.print("[dim]next:[/] " + escape(f"pip install 'ablab[{extra}]' (or 'ablab[all]'; scripts/bootstrap.sh installs everything)"))
        raise SystemExit(1) from None
