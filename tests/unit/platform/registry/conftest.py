"""A real, freshly migrated SQLite config database for the registry's services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade


@pytest.fixture()
def unit_of_work(tmp_path: Path) -> Iterator[Callable[[], AbstractContextManager[Session]]]:
    """``with unit_of_work() as session:`` one committed transaction, as the API runs each request."""
    url = f"sqlite:///{tmp_path / 'config.db'}"
    upgrade(url)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    yield lambda: transaction(factory)
    engine.dispose()
