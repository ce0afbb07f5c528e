"""The rollup sync of POST/PATCH /v1/experiments runs after the registry commit, and a failing
one is logged and counted (``ablab_rollup_sync_failures`` in the store's ``collect``), never
swallowed silently; the write itself stands. The real store (chDB in memory) and a real
SQLite registry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from ablab.platform.api.app import create_app
from ablab.platform.auth import create_api_key
from ablab.platform.config import Settings
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import Scope
from ablab.streaming.analytics import AnalyticsStore

BODY = {"key": "sync-exp", "name": "sync", "owner": "o", "unit": "user", "traffic": 1.0, "control": "a",
        "variants": [{"key": "a", "weight": 0.5}, {"key": "b", "weight": 0.5}],
        "metrics": {"primary": ["e2e_ms"], "slos": {"ttft_ms": 300}}}


def _metric(store: AnalyticsStore, name: str) -> float:
    for family in store.collect():
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise KeyError(name)


def test_sync_after_commit_and_a_failure_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(home=tmp_path, analytics=True, run_loader=False, guardrail_interval_s=0,
                        clickhouse_url="chdb://memory", kafka_bootstrap="127.0.0.1:1")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        token = create_api_key(session, name="e", scope=Scope.editor)[1]

    def committed(key: str) -> bool:  # read by another connection: only committed rows show
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM experiments WHERE key = :k"), {"k": key}).scalar())

    seen: list[tuple[str, bool]] = []
    stores: list[AnalyticsStore] = []

    def analytics(state):
        store = AnalyticsStore(state.settings, run_loader=False)
        stores.append(store)
        real = store.rollup.sync

        def sync(spec):
            seen.append((spec.key, committed(spec.key)))
            if len(seen) == 1:
                raise RuntimeError("store down")
            return real(spec)

        monkeypatch.setattr(store.rollup, "sync", sync)
        return store

    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(settings, analytics=analytics)) as client, caplog.at_level(logging.WARNING):
        created = client.post("/v1/experiments", json=BODY, headers=headers)
        assert created.status_code == 201, created.text  # the write stands although its sync failed
        store = stores[0]
        assert seen == [("sync-exp", True)]  # the registry row was committed before the sync ran
        assert _metric(store, "ablab_rollup_sync_failures") == 1 and _metric(store, "ablab_rollup_syncs") == 0
        assert any("rollup sync of sync-exp failed" in r.getMessage() for r in caplog.records)

        patched = client.patch("/v1/experiments/sync-exp", json={"metrics": {"primary": ["e2e_ms"], "slos": {"ttft_ms": 250}}},
                               headers={**headers, "If-Match": created.headers["ETag"]})
        assert patched.status_code == 200, patched.text
        assert seen[-1] == ("sync-exp", True)
        assert _metric(store, "ablab_rollup_sync_failures") == 1 and _metric(store, "ablab_rollup_syncs") == 1
        slo_key = store.rollup.client.query(
            "SELECT slo_key FROM rollup_slos WHERE experiment = 'sync-exp' ORDER BY updated_at DESC LIMIT 1").result_rows
        assert slo_key and '"ttft_ms":250.0' in slo_key[0][0]
    engine.dispose()
