"""Policy models survive an API restart (issue #33, docs/policies.md "Model refresh"): the
refresher fits a router's model from logged events and stores it in the config DB; the running
API serves it; that process is killed and a new one on the same database, with refits off,
serves the same version (same ETag) and decides with it before any refit could run.
SQLite, and PostgreSQL when configured."""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sqlalchemy import func, select

from ablab.platform.api.policy_refresh import PolicyRefresher
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import Environment, experiment_events, router_policy
from ablab.platform.registry import migrate
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.models import Experiment, PolicyModelRow
from ablab.platform.registry.sdk_config import publish_model
from ablab_testing import ApiServer, start_api, stop_api

pytestmark = pytest.mark.integration
NO_REFITS = {"ABLAB_POLICY_REFIT_S": "0", "ABLAB_POLICY_REFIT_FIRST_S": "0"}


class LoggedEvents:
    """The analytics port's one read the refresher makes, over simulated logs."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables

    def logged_events(self, experiment: str) -> pa.Table:
        return self.tables[experiment]


def _simulated(n: int, start: datetime) -> tuple[pa.Table, dict[str, Any]]:
    env = Environment()
    events, spec = experiment_events(env, Decider(router_policy(env), None, salt="sim:router"), np.random.default_rng(4),
                                     key="sim", n=n, n_units=n // 10, start=start.replace(tzinfo=None).isoformat())
    return pa.Table.from_pandas(pd.DataFrame(events), preserve_index=False), spec


def _served(server: ApiServer, *, within_s: float = 30.0) -> httpx.Response:
    """The SDK config once it carries a policy model (the API re-reads the registry revision
    every second): waits on that state, not on a sleep of a guessed length."""
    deadline = time.monotonic() + within_s
    with server.client("sdk") as c:
        while True:
            r = c.get("/v1/sdk/config")
            r.raise_for_status()
            if r.json().get("policy_models") or time.monotonic() > deadline:
                return r
            time.sleep(0.1)


def test_a_restarted_api_serves_the_model_it_had(database_url: str, tmp_path) -> None:
    _, spec = _simulated(10, datetime.now(UTC))
    (tmp_path / "api-a").mkdir()
    first = start_api(database_url, tmp_path / "api-a", NO_REFITS)
    second: ApiServer | None = None
    try:
        with first.client("editor") as c:
            body = {"key": "sim", "name": "sim", "unit": "user", "traffic": 1, "control": "control",
                    "variants": spec["variants"]}
            assert c.post("/v1/experiments", json=body).status_code == 201
            assert c.post("/v1/experiments/sim/start").status_code == 200
        with first.client("sdk") as c:
            assert "policy_models" not in c.get("/v1/sdk/config").json()

        # the refresher's pass, on the API's database: fit from the logs, store, bump the revision
        engine = make_engine(database_url)
        try:
            table, _ = _simulated(8000, datetime.now(UTC) + timedelta(seconds=1))
            refresher = PolicyRefresher(make_sessionmaker(engine), LoggedEvents({"sim": table}),  # type: ignore[arg-type]
                                        interval_s=0, start=False)
            assert refresher.refit_once() == {"sim/router": "published"}
        finally:
            engine.dispose()
        before = _served(first)
        (held,) = before.json()["policy_models"]
        model = PolicyModel.from_json(held["model"])
        assert (held["experiment"], held["variant"], held["version"]) == ("sim", "router", model.version)

        first.process.send_signal(signal.SIGKILL)  # no shutdown hook gets to run
        first.process.wait(timeout=30)
        (tmp_path / "api-b").mkdir()
        second = start_api(database_url, tmp_path / "api-b", NO_REFITS)
        with second.client("sdk") as c:
            after = c.get("/v1/sdk/config")  # at once: no refit runs in this process
            assert after.json()["policy_models"] == before.json()["policy_models"]
            assert after.headers["ETag"] == before.headers["ETag"]  # an SDK holding the old ETag gets a 304
            assert c.get("/v1/sdk/config", headers={"If-None-Match": before.headers["ETag"]}).status_code == 304
            decided = []
            for i in range(200):
                found = c.post("/v1/assign", json={"unit_id": f"u{i}", "attributes": {"plan": "pro"},
                                                   "features": {"prompt_tokens": 40 * i}}).json()["assignments"]
                decided += [a["decision"] for a in found if a["variant"] == "router"]
        assert decided and {d["policy_version"] for d in decided} == {model.version}
        with second.client("viewer") as c:
            (listed,) = c.get("/v1/experiments/sim/policy-models").json()["items"]
        assert (listed["variant"], listed["version"], listed["served"]) == ("router", model.version, True)
        metrics = httpx.get(f"{second.base_url}/metrics").text
        assert "ablab_policy_refits_total" not in metrics  # refits are off here: the model came from the DB
    finally:
        if second is not None:
            stop_api(second)
        if first.process.poll() is None:
            stop_api(first)


def test_two_processes_publishing_one_version_at_once_store_it_once(database_url: str) -> None:
    """Two API processes' refreshers fit the same logs at once: the second insert waits on the
    first's unique key, then finds it taken and publishes nothing (no failure, one row)."""
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite serializes writers: the second never reaches the unique key")
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    try:
        with transaction(sessions) as s:
            s.add(Experiment(key="race", name="race", unit="user", traffic=1.0, control="a", salt="race", version=1))
        with transaction(sessions) as s:
            exp_id = s.scalar(select(Experiment.id).where(Experiment.key == "race"))
        model = {"version": "v1"}
        first = sessions()
        assert publish_model(first, exp_id, "router", "v1", model)  # holds the key, uncommitted
        result: list[bool] = []
        racer = threading.Thread(target=lambda: result.append(_publish_in(sessions, exp_id)))
        racer.start()
        racer.join(1.0)
        assert racer.is_alive()  # waiting on the first's uncommitted row
        first.commit()
        first.close()
        racer.join(30)
        assert result == [False]
        with transaction(sessions) as s:
            # this experiment's rows only: the module's database also holds the restart test's
            mine = select(func.count()).select_from(PolicyModelRow).where(PolicyModelRow.experiment_id == exp_id)
            assert s.scalar(mine) == 1
    finally:
        engine.dispose()


def _publish_in(sessions: Any, exp_id: int) -> bool:
    with transaction(sessions) as s:
        return publish_model(s, exp_id, "router", "v1", {"version": "v1"})
