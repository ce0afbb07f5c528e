"""The `ablab` command line.

Each concern keeps its commands in its own module here, exposing ``register(app)``.
Modules import their heavy dependencies (torch, pyflink, chdb) inside the command
bodies, so ``ablab --help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

COMMAND_MODULES = (
    "db",
    "keys",
    "api",
    "experiments",
    "streaming",
    "inference",
    "analysis",
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


def main() -> None:
    app()
