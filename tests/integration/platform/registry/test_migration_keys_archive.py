"""Migration 0002 on SQLite and PostgreSQL: it goes down and up, and a database that
already holds two active keys with one name keeps both tokens working under new names."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from ablab.platform.auth import authenticate, create_api_key
from ablab.platform.registry import migrate
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.schemas import Scope

pytestmark = pytest.mark.integration


def _fresh(database_url: str, tmp_path) -> str:
    if database_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'mig.db'}"
    from ablab_testing import fresh_postgres_database

    return fresh_postgres_database()


HEAD = "0006"  # the newest migration (0006: policy models), which upgrade() reaches through 0002


def test_duplicate_active_names_are_told_apart_and_keep_working(database_url: str, tmp_path) -> None:
    url = _fresh(database_url, tmp_path)
    migrate.upgrade(url, "0004")
    engine = create_engine(url)
    with engine.begin() as conn:
        for i, name in enumerate(["ci", "ci", "ci", "other"]):
            conn.execute(text("INSERT INTO api_keys (name, prefix, token_hash, scope, created_at) "
                              "VALUES (:n, :p, :h, 'sdk', CURRENT_TIMESTAMP)"), {"n": name, "p": f"abl_{i}", "h": f"{i:064d}"})
    engine.dispose()
    migrate.upgrade(url)
    assert migrate.current(url) == HEAD
    engine = create_engine(url)
    with engine.connect() as conn:
        names = [r[0] for r in conn.execute(text("SELECT name FROM api_keys ORDER BY id"))]
        assert conn.execute(text("SELECT revision FROM auth_revision WHERE id = 1")).scalar() == 0
    engine.dispose()
    assert names == ["ci", "ci #2", "ci #3", "other"]

    sessions = make_sessionmaker(make_engine(url))
    with transaction(sessions) as session:
        key, token = create_api_key(session, name="fresh", scope=Scope.viewer)
    with transaction(sessions) as session:
        assert authenticate(session, token) is not None

    migrate.downgrade(url, "0004")
    migrate.upgrade(url)
    assert migrate.current(url) == HEAD
