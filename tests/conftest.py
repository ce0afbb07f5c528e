"""Shared fixtures: a real SQL database (SQLite file or PostgreSQL) and a real API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ablab_testing import ApiServer, fresh_postgres_database, start_api, stop_api

__all__ = ["ApiServer", "fresh_postgres_database", "start_api", "stop_api"]


def pytest_configure(config: pytest.Config) -> None:
    # A private base temp dir per run: pytest's default numbered dirs are pruned by any
    # newer run, which deletes the databases of a run still in progress beside it.
    if not config.option.basetemp:
        import tempfile

        config.option.basetemp = tempfile.mkdtemp(prefix="ablab-pytest-")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'ablab.db'}"
    return fresh_postgres_database()


@pytest.fixture(scope="module")
def api_server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A real uvicorn process on a free port, over a freshly migrated database."""
    home = tmp_path_factory.mktemp("home")
    server = start_api(database_url, home)
    yield server
    stop_api(server)
