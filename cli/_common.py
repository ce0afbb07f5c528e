"""Helpers shared by the CLI modules: one console, one way to fail."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console(stderr=True)
out = Console()


def fail(message: str, *, hint: str | None = None, code: int = 1) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}")
    if hint:
        console.print(f"[dim]next:[/] {hint}")
    raise typer.Exit(code)
