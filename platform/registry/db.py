"""Engine and session construction for the config database (SQLite or PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool


def make_engine(url: str, *, revision_reader: bool = False) -> Engine:
    """The config DB's engine. ``revision_reader``: for the one-row read on every request
    (the auth revocation counter): autocommit, so no BEGIN/ROLLBACK round trips; no pool
    and no pre-ping, because the caller keeps its own few connections and retries on a
    fresh one when the server dropped one."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        extra: dict = {"isolation_level": "AUTOCOMMIT", "poolclass": NullPool} if revision_reader else {}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **extra)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if revision_reader:
        return create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
