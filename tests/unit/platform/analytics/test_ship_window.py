"""After a ship (issue 33 item 5), on a real, migrated SQLite registry: the spec the results
engine reads is the comparison before the ship — its end is the ship's time, its weights the
split the variants had then (from the ship's audit entry) — while the experiment stays in the
ship's phase (a pause keeps it; a later phase ends it); and the guardian leaves a shipped
experiment alone (its comparison is closed) while it still pauses a breach elsewhere, on the
real store (chDB in memory)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.analytics import service
from ablab.platform.analytics.guardian import enforce_guardrails
from ablab.platform.registry import service as registry
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import ExperimentCreate, ExperimentUpdate, VariantIn
from ablab.platform.registry.ship import ShipRequest
from ablab.platform.stats.synthetic import synthetic_events
from ablab_testing import insert_synthetic_raw
from ablab_testing.analysis_window import PAIR, START


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'config.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def store() -> Iterator[Any]:
    """A fresh database of the in-memory ClickHouse engine, with the store's schema."""
    from ablab.streaming.store import apply_ddl, make_client

    client = make_client("chdb://memory")
    database = f"t_{uuid.uuid4().hex[:10]}"
    client.command(f"CREATE DATABASE {database}")
    client.database = database
    apply_ddl(client)
    yield client
    client.command(f"DROP DATABASE {database}")
    client.close()


def _experiment(sessions: sessionmaker[Session], key: str, weights: dict[str, float], **extra: Any) -> None:
    body = {"key": key, "name": key, "traffic": 1.0, "control": "control", "metrics": {"primary": ["e2e_ms"]},
            "variants": [{"key": k, "weight": w} for k, w in weights.items()], **extra}
    with transaction(sessions) as session:
        registry.create_experiment(session, data=ExperimentCreate.model_validate(body), actor="ed", bucket_space=10_000)
        exp = registry.transition(session, key=key, action="start", actor="ed")
        exp.started_at = START.to_pydatetime() - timedelta(seconds=1)  # the events below come after it


def _ship(sessions: sessionmaker[Session], key: str) -> None:
    with transaction(sessions) as session:
        registry.ship_variant(session, key=key, actor="alice", results_of=None,
                              request=ShipRequest(variant="int8", force=True, reason="launch"))


def _window(sessions: sessionmaker[Session], key: str) -> Any:
    with transaction(sessions) as session:
        exp = registry.to_read(registry.get_experiment(session, key))
        return exp, service.ship_of(session, exp)


def test_the_spec_after_a_ship_is_the_comparison_before_it(sessions: sessionmaker[Session]) -> None:
    _experiment(sessions, "x", {"control": 1.0, "int8": 3.0})
    exp, none = _window(sessions, "x")
    assert none is None and service.stats_spec(exp).end is None

    _ship(sessions, "x")
    exp, ship = _window(sessions, "x")
    assert ship is not None and ship.weights == {"control": 1.0, "int8": 3.0}
    assert {v.key: v.weight for v in exp.variants} == {"control": 0.0, "int8": 1.0}  # the registry's split now
    spec = service.stats_spec(exp, ship=ship)
    assert spec.weights == {"control": 1.0, "int8": 3.0}  # the split the compared units were assigned under
    at = ship.record.at.astimezone(UTC)
    assert spec.end == at.isoformat() and spec.shipped is not None
    assert (spec.shipped.variant, spec.shipped.phase, spec.shipped.at) == ("int8", 2, at.isoformat())
    windows_end = service.windows_end(ship)
    assert windows_end is not None and windows_end <= at.replace(tzinfo=None) and windows_end.second % 10 == 0

    with transaction(sessions) as session:  # a pause since makes later traffic no more comparable
        registry.transition(session, key="x", action="pause", actor="ed")
    assert _window(sessions, "x")[1] is not None
    with transaction(sessions) as session:  # a later phase, a new split, ends the ship's window
        version = registry.transition(session, key="x", action="start", actor="ed").version
        registry.update_experiment(session, key="x", actor="ed", expected_version=version, data=ExperimentUpdate(
            new_phase=True, variants=[VariantIn(key="control", weight=1), VariantIn(key="int8", weight=1)]))
    assert _window(sessions, "x")[1] is None


def test_the_guardian_leaves_a_shipped_experiment_alone(sessions: sessionmaker[Session], store: Any) -> None:
    from ablab.streaming.store.reads import StoreReads

    guardrail = [{"metric": "ttft_ms_p95", "max": 1.0}]  # every variant breaches it
    events = []
    for key in ("shipped", "running"):
        _experiment(sessions, key, {"control": 1.0, "int8": 1.0}, guardrails=guardrail)
        events.append(synthetic_events(variants=PAIR, n_requests=1_500, n_units=150, seed=2, experiment=key,
                                       start=START.isoformat(), duration_s=600))
    insert_synthetic_raw(store, pd.concat(events, ignore_index=True))  # one insert: event ids are per frame
    _ship(sessions, "shipped")

    from ablab.streaming.store import rollup

    # with the store's rollup maintenance step, as the API's monitor runs it
    paused = enforce_guardrails(sessions, StoreReads(store), sync_rollup=lambda spec: rollup.sync(store, spec))
    assert {p["experiment"] for p in paused} == {"running"}  # the same breach elsewhere is still enforced
    with transaction(sessions) as session:
        shipped = registry.to_read(registry.get_experiment(session, "shipped"))
        actions = [a.action for a in registry.audit_log(session, key="shipped")]
    assert not any(v.paused for v in shipped.variants) and "pause_variant" not in actions
