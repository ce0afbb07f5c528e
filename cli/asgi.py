"""ASGI entry point for uvicorn and other servers: ``ablab.cli.asgi:app`` (what ``ablab api``
serves), the API wired to Kafka and ClickHouse (:mod:`ablab.cli.wiring`)."""

from __future__ import annotations

from ablab.cli.wiring import create_app

app = create_app()
