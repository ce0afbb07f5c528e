"""PostgreSQL: a delete racing an experiment write that uses the same factor or layer. One
of the two waits for the other's commit, so no experiment is ever left naming a factor or
layer that is gone, and the loser gets a 409 or 422, not a 500."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.errors import Conflict, Invalid
from ablab.platform.registry import migrate
from ablab.platform.registry import service as registry
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.factors import service as factors
from ablab.platform.registry.factors.schemas import FactorCreate
from ablab.platform.registry.schemas import ExperimentCreate, LayerCreate
from ablab_testing import fresh_postgres_database, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture()
def db() -> Iterator[tuple[Engine, sessionmaker[Session]]]:
    url = fresh_postgres_database()
    migrate.upgrade(url)
    engine = make_engine(url)
    yield engine, make_sessionmaker(engine)
    engine.dispose()


def _experiment(key: str, treatment: dict, **placement: object) -> ExperimentCreate:
    return ExperimentCreate.model_validate({
        "key": key, "name": key, "traffic": 1.0, "control": "a", **placement,
        "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": treatment}]})


def _in_thread(factory: sessionmaker[Session], work: Callable[[Session], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``work`` in its own committed transaction on another thread; ``outcome["error"]`` is
    what it raised (None when it committed)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            with transaction(factory) as session:
                work(session)
            outcome["error"] = None
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _waits_on_a_lock(engine: Engine, thread: threading.Thread) -> Callable[[], bool]:
    def check() -> bool:
        if not thread.is_alive():
            pytest.fail("the second writer did not wait for the first one's commit")
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                          "AND wait_event_type = 'Lock'")).scalar())
    return check


def test_a_factor_delete_waits_for_the_experiment_write_that_checked_the_factor(db) -> None:
    engine, factory = db
    with transaction(factory) as session:
        factors.declare_factor(session, data=FactorCreate(name="engine", type="enum", values=["a", "b"]), actor="ed")
    writer = factory()
    try:
        registry.create_experiment(writer, data=_experiment("racer", {"engine": "b"}), actor="ed", bucket_space=10_000)
        thread, outcome = _in_thread(factory, lambda s: factors.delete_factor(s, name="engine", actor="ed"))
        wait_for(_waits_on_a_lock(engine, thread), timeout_s=30, what="the delete to wait on the writer", interval_s=0.05)
        writer.commit()
    finally:
        writer.close()
    thread.join(30)
    assert isinstance(outcome["error"], Conflict), outcome
    assert "racer" in outcome["error"].message
    with transaction(factory) as session:
        assert factors.catalog(session).get("engine") is not None


def test_an_experiment_write_waits_for_the_factor_delete_and_then_finds_it_undeclared(db) -> None:
    engine, factory = db
    with transaction(factory) as session:
        factors.declare_factor(session, data=FactorCreate(name="engine", type="enum", values=["a", "b"]), actor="ed")
    deleter = factory()
    try:
        factors.delete_factor(deleter, name="engine", actor="ed")
        thread, outcome = _in_thread(factory, lambda s: registry.create_experiment(
            s, data=_experiment("late", {"engine": "b"}), actor="ed", bucket_space=10_000))
        wait_for(_waits_on_a_lock(engine, thread), timeout_s=30, what="the write to wait on the delete", interval_s=0.05)
        deleter.commit()
    finally:
        deleter.close()
    thread.join(30)
    assert isinstance(outcome["error"], Invalid), outcome
    assert "'engine' is not declared" in outcome["error"].message
    with transaction(factory) as session:
        assert registry.list_experiments(session)[1] == 0


def test_a_layer_delete_racing_an_experiment_into_it_is_a_409_naming_it(db) -> None:
    engine, factory = db
    with transaction(factory) as session:
        registry.create_layer(session, data=LayerCreate(key="ranking"), actor="ed")
    writer = factory()
    try:
        registry.create_experiment(writer, data=_experiment("inside", {}, layer="ranking"), actor="ed", bucket_space=10_000)
        thread, outcome = _in_thread(factory, lambda s: registry.delete_layer(s, key="ranking", actor="ed"))
        wait_for(_waits_on_a_lock(engine, thread), timeout_s=30, what="the delete to wait on the writer", interval_s=0.05)
        writer.commit()
    finally:
        writer.close()
    thread.join(30)
    assert isinstance(outcome["error"], Conflict), outcome  # not the foreign key's IntegrityError (a 500)
    assert "experiment inside;" in outcome["error"].message
    with transaction(factory) as session:
        assert [layer.key for layer in registry.list_layers(session)] == ["ranking"]
