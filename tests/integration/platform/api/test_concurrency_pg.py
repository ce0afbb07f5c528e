"""PostgreSQL: migrations both ways, the append-only audit trigger, and optimistic locking
under real concurrency (two API processes on one database, and two ORM sessions)."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from ablab.platform.errors import PreconditionFailed
from ablab.platform.registry import migrate, service
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.schemas import ExperimentCreate, ExperimentUpdate
from ablab_testing import concurrent_requests, fresh_postgres_database, start_api, stop_api, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

REGISTRY_TABLES = {"experiments", "variants", "layers", "holdouts", "api_keys", "audit_log", "registry_revision", "strategy_factors", "auth_revision"}
WRITERS = 8


def experiment_body(key: str) -> dict:
    return {
        "key": key,
        "name": f"Concurrency {key}",
        "unit": "user",
        "traffic": 1.0,
        "control": "control",
        "variants": [
            {"key": "control", "weight": 1, "strategy": {}},
            {"key": "int8", "weight": 1, "strategy": {"precision": "int8"}},
        ],
    }


# A losing writer whose UPDATE waited on the winner's row lock must get 412, not 500
# (found by these tests; _flush_versioned once read the instance after a failed flush).


@pytest.fixture()
def pg_url() -> str:
    return fresh_postgres_database()


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_upgrade_downgrade_upgrade(pg_url: str) -> None:
    assert _tables(pg_url) == set()
    migrate.upgrade(pg_url)
    head = migrate.current(pg_url)
    assert head is not None
    assert REGISTRY_TABLES <= _tables(pg_url)

    migrate.downgrade(pg_url, "base")
    assert migrate.current(pg_url) is None
    assert _tables(pg_url) <= {"alembic_version"}  # every registry table (and the trigger) is gone

    migrate.upgrade(pg_url)
    assert migrate.current(pg_url) == head
    assert REGISTRY_TABLES <= _tables(pg_url)


def test_audit_log_rejects_update_and_delete_in_the_database(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO audit_log (at, actor, action, entity_type, entity_key) "
                    "VALUES (now(), 'test', 'create', 'experiment', 'e1')"
                )
            )
        # Raw SQL, below the ORM's own guard: the trigger itself must refuse.
        for statement in ("UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"):
            with pytest.raises(DBAPIError, match="append-only"):
                with engine.begin() as conn:
                    conn.execute(text(statement))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT actor FROM audit_log")).scalars().all() == ["test"]
    finally:
        engine.dispose()


def test_concurrent_patches_over_two_api_processes(pg_url: str, tmp_path) -> None:
    homes = [tmp_path / "api-a", tmp_path / "api-b"]
    for home in homes:
        home.mkdir()
    servers = []
    try:
        servers.extend(start_api(pg_url, home) for home in homes)
        key = f"race-{uuid.uuid4().hex[:8]}"
        with servers[0].client("editor") as c:
            assert c.post("/v1/experiments", json=experiment_body(key)).status_code == 201
            assert c.get(f"/v1/experiments/{key}").headers["etag"] == '"1"'

        responses = concurrent_requests(servers, "editor", WRITERS, lambda c, i: c.patch(
            f"/v1/experiments/{key}", json={"traffic": round(0.1 + i / 100, 2)}, headers={"If-Match": '"1"'}))
        statuses = [r.status_code for r in responses]
        assert sorted(statuses) == [200] + [412] * (WRITERS - 1), statuses

        for server in servers:  # both processes read the same committed state
            with server.client("viewer") as c:
                got = c.get(f"/v1/experiments/{key}")
                assert got.json()["version"] == 2 and got.headers["etag"] == '"2"'
                audit = c.get(f"/v1/experiments/{key}/audit").json()
                assert sorted(a["action"] for a in audit) == ["create", "update"], audit
    finally:
        for server in servers:
            stop_api(server)


@pytest.fixture
def registry(pg_url: str):
    """The migrated registry on PostgreSQL with one experiment in it, seen through sessions."""
    migrate.upgrade(pg_url)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    key = f"exp-{uuid.uuid4().hex[:8]}"
    try:
        with transaction(sessions) as s:
            service.create_experiment(s, data=ExperimentCreate.model_validate(experiment_body(key)), actor="test", bucket_space=10_000)
        yield engine, sessions, key
    finally:
        engine.dispose()


def test_two_sessions_same_version_second_flush_is_412(registry) -> None:
    _, sessions, key = registry
    first, second = sessions(), sessions()
    try:
        assert service.get_experiment(first, key).version == 1
        assert service.get_experiment(second, key).version == 1  # both read version 1
        service.update_experiment(first, key=key, data=ExperimentUpdate(traffic=0.3), expected_version=1, actor="first")
        first.commit()
        # The second session's copy still says version 1, so the If-Match check passes;
        # only the version_id_col guard (UPDATE … WHERE version = 1) can catch it.
        with pytest.raises(PreconditionFailed) as caught:
            service.update_experiment(second, key=key, data=ExperimentUpdate(traffic=0.7), expected_version=1, actor="second")
        assert caught.value.status_code == 412
        second.rollback()
    finally:
        first.close()
        second.close()

    with transaction(sessions) as s:
        exp = service.get_experiment(s, key)
        assert (exp.version, exp.traffic) == (2, 0.3)
        actions = [(a.action, a.actor) for a in service.audit_log(s, key=key)]
        assert sorted(actions) == [("create", "test"), ("update", "first")]


def test_writer_that_waits_on_the_row_lock_gets_412(registry) -> None:
    """The interleaving real traffic produces: the loser's UPDATE blocks until the winner commits."""
    engine, sessions, key = registry
    winner, loser = sessions(), sessions()
    outcome: dict[str, BaseException] = {}
    try:
        service.get_experiment(winner, key)
        service.get_experiment(loser, key)
        # The winner's flush holds the row lock until it commits.
        service.update_experiment(winner, key=key, data=ExperimentUpdate(traffic=0.3), expected_version=1, actor="winner")

        def lose() -> None:
            try:
                service.update_experiment(loser, key=key, data=ExperimentUpdate(traffic=0.7), expected_version=1, actor="loser")
            except BaseException as exc:
                outcome["error"] = exc

        def loser_waits_on_the_lock() -> bool:
            with engine.connect() as probe:
                return probe.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar_one() > 0

        thread = threading.Thread(target=lose)
        thread.start()
        wait_for(loser_waits_on_the_lock, timeout_s=60, what="the loser's UPDATE blocked on the row lock",
                 interval_s=0.05)
        winner.commit()
        thread.join(timeout=60)
        error = outcome.get("error")
        assert isinstance(error, PreconditionFailed), repr(error)
        assert error.status_code == 412
    finally:
        loser.rollback()
        winner.close()
        loser.close()
    with transaction(sessions) as s:
        assert service.get_experiment(s, key).version == 2
