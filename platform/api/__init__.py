"""The HTTP API (FastAPI): thin routers over the registry, assignment and analysis services."""
