"""A real, freshly migrated SQLite config database for the registry's services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from ablab.platform.api.app import create_app
from ablab.platform.auth import create_api_key
from ablab.platform.config import Settings
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import Scope


@pytest.fixture()
def unit_of_work(tmp_path: Path) -> Iterator[Callable[[], AbstractContextManager[Session]]]:
    """``with unit_of_work() as session:`` one committed transaction, as the API runs each request."""
    url = f"sqlite:///{tmp_path / 'config.db'}"
    upgrade(url)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    yield lambda: transaction(factory)
    engine.dispose()


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The API in process on a fresh SQLite database, with an editor's and an sdk token
    (``Authorization`` header values)."""
    settings = Settings(home=tmp_path, analytics=False, kafka_bootstrap="127.0.0.1:1")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        tokens = {scope.value: create_api_key(session, name=scope.value, scope=scope)[1] for scope in (Scope.editor, Scope.sdk)}
    engine.dispose()
    with TestClient(create_app(settings)) as client:
        yield client, {k: f"Bearer {v}" for k, v in tokens.items()}
