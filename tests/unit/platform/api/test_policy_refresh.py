"""The policy model refresher (issue #33): a running experiment's router variant is refit from
its logged events (through the analytics port), the new version reaches ``GET /v1/sdk/config``
as ``policy_models`` with a new ETag, an unchanged fit publishes nothing, too few requests keep
the previous model, and each outcome is counted on ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from ablab.platform.api.app import create_app
from ablab.platform.api.policy_refresh import PolicyRefresher
from ablab.platform.auth import create_api_key
from ablab.platform.config import Settings
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import Environment, experiment_events, router_policy
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import Scope


class EventStore:
    """The analytics port's ``logged_events`` over a table the test sets (the store's own
    reading is tested with chDB in tests/integration/platform/api/test_ope_route.py)."""

    def __init__(self) -> None:
        self.tables: dict[str, pa.Table] = {}

    def logged_events(self, experiment: str) -> pa.Table:
        return self.tables[experiment]

    def sync_rollup(self, spec: Any) -> dict[str, int]:
        return {}

    def checks(self) -> dict[str, Any]:
        return {}

    def collect(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, dict[str, str], EventStore]]:
    monkeypatch.setenv("ABLAB_POLICY_REFIT_S", "3600")  # the passes are run by the test
    monkeypatch.setenv("ABLAB_POLICY_REFIT_FIRST_S", "3600")
    settings = Settings(home=tmp_path, analytics=True, guardrail_interval_s=0, kafka_bootstrap="127.0.0.1:1")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        tokens = {s.value: create_api_key(session, name=s.value, scope=s)[1] for s in (Scope.editor, Scope.sdk)}
    engine.dispose()
    store = EventStore()
    with TestClient(create_app(settings, analytics=lambda state: store)) as client:
        yield client, {k: f"Bearer {v}" for k, v in tokens.items()}, store


def _events(n: int, start: datetime) -> tuple[pa.Table, dict[str, Any]]:
    env = Environment()
    events, spec = experiment_events(env, Decider(router_policy(env), None, salt="sim:router"), np.random.default_rng(4),
                                     key="sim", n=n, n_units=n // 10, start=start.replace(tzinfo=None).isoformat())
    return pa.Table.from_pandas(pd.DataFrame(events), preserve_index=False), spec


def test_a_router_is_refit_and_its_model_reaches_the_sdk_config(app) -> None:
    client, auth, store = app
    _, spec = _events(10, datetime.now(UTC))
    body = {"key": "sim", "name": "sim", "traffic": 1, "control": "control", "variants": spec["variants"]}
    client.post("/v1/experiments", json=body, headers={"Authorization": auth["editor"]}).raise_for_status()
    client.post("/v1/experiments/sim/start", headers={"Authorization": auth["editor"]}).raise_for_status()
    refresher = next(c for c in client.app.state.ablab.components if isinstance(c, PolicyRefresher))
    first = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]})
    assert "policy_models" not in first.json()

    store.tables["sim"], _ = _events(100, datetime.now(UTC) + timedelta(seconds=1))
    assert refresher.refit_once() == {"sim/router": "not_enough_data"}  # no model: the policy stays uniform
    store.tables["sim"], _ = _events(8000, datetime.now(UTC) + timedelta(seconds=1))
    assert refresher.refit_once() == {"sim/router": "published"}
    second = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"], "If-None-Match": first.headers["ETag"]})
    assert second.status_code == 200 and second.headers["ETag"] != first.headers["ETag"]
    (held,) = second.json()["policy_models"]
    model = PolicyModel.from_json(held["model"])  # refuses a version that does not match its content
    assert (held["experiment"], held["variant"], held["version"]) == ("sim", "router", model.version)
    assert model.policy_hash == router_policy().content_hash

    assert refresher.refit_once() == {"sim/router": "unchanged"}  # the same logs: the same version
    third = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"], "If-None-Match": second.headers["ETag"]})
    assert third.status_code == 304
    store.tables["sim"], _ = _events(100, datetime.now(UTC) + timedelta(seconds=1))
    assert refresher.refit_once() == {"sim/router": "not_enough_data"}
    fourth = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]}).json()
    assert fourth["policy_models"][0]["version"] == model.version  # the previous model stays
    metrics = client.get("/metrics").text
    assert 'ablab_policy_refits_total{outcome="not_enough_data"} 2.0' in metrics
    assert 'ablab_policy_refits_total{outcome="published"} 1.0' in metrics
