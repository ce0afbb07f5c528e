"""ASGI entry point for uvicorn and other servers: ``ablab.platform.api.server:app``."""

from ablab.platform.api.app import create_app

app = create_app()
