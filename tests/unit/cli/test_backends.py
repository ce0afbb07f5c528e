"""``GET /v1/backends``' source (ablab.cli.backends): which backends the gateway has, whether
each answers, and for a local llama.cpp one that does not, the wheel build's progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ablab.cli.backends import BackendStatus, configured_backends, describe
from ablab.inference.llamacpp import BuildState
from ablab.platform.config import Settings

LLAMA = {"smollm2": {"url": "http://127.0.0.1:8082/v1", "kind": "llamacpp"},
         "hosted": {"url": "https://api.example.com/v1", "kind": "openai"}}


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, analytics=False)


def test_a_building_backend_reports_its_percentage(tmp_path: Path) -> None:
    status = BackendStatus(_settings(tmp_path), env={"ABLAB_GATEWAY_BACKENDS": json.dumps(LLAMA)},
                           probe=lambda url: "example.com" in url, build_state=lambda: BuildState("building", 120, 280))
    rows = {r["name"]: r for r in status.backends()["items"]}
    assert rows["smollm2"]["state"] == "building" and rows["smollm2"]["progress"] == pytest.approx(120 / 280)
    assert "42% (120/280 compile steps)" in rows["smollm2"]["detail"]
    assert rows["hosted"]["state"] == "serving"
    assert rows["smollm2"]["default"] and not rows["hosted"]["default"]  # the first backend is the default


@pytest.mark.parametrize(("build", "state"), [
    (BuildState("installed"), "starting"), (BuildState("failed", log=Path("/x.log")), "failed"),
    (BuildState("not built"), "not built"), (BuildState("building"), "building")])
def test_a_silent_local_llama_backend_says_why(build: BuildState, state: str) -> None:
    row = describe("smollm2", "llamacpp", default=True, serving=False, local=True, build=build)
    assert row["state"] == state and row["detail"]


def test_remote_or_other_backends_are_just_unreachable() -> None:
    assert describe("x", "llamacpp", default=False, serving=False, local=False, build=None)["state"] == "unreachable"
    assert describe("x", "openai", default=False, serving=False, local=True, build=None)["state"] == "unreachable"


def test_the_demo_gateway_config_is_read_when_no_variable_names_backends(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "gateway.yaml").write_text(yaml.safe_dump({"backends": LLAMA, "default_backend": "hosted"}))
    assert [b.name for b in configured_backends(_settings(tmp_path), {})] == ["hosted", "smollm2"]
    (tmp_path / "run" / "gateway.yaml").write_text("backends: [")  # broken: the gateway reports it; here, nothing
    assert configured_backends(_settings(tmp_path), {}) == []
    assert configured_backends(_settings(tmp_path), {"ABLAB_GATEWAY_BACKENDS": "{"}) == []


def test_the_route_gathers_the_rows_for_viewers(tmp_path: Path) -> None:
    from ablab.platform.api.app import create_app
    from ablab.platform.auth import create_api_key
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import Scope

    settings = _settings(tmp_path)
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        token = create_api_key(session, name="v", scope=Scope.viewer)[1]
    engine.dispose()
    status = BackendStatus(settings, env={"ABLAB_GATEWAY_BACKENDS": json.dumps(LLAMA)}, probe=lambda url: False,
                           build_state=lambda: BuildState("building", 7, 10))
    with TestClient(create_app(settings, extensions=[lambda state: status])) as client:
        assert client.get("/v1/backends").status_code == 401
        body = client.get("/v1/backends", headers={"Authorization": f"Bearer {token}"}).json()
    assert [(r["name"], r["state"]) for r in body["items"]] == [("smollm2", "building"), ("hosted", "unreachable")]
    assert body["items"][0]["progress"] == pytest.approx(0.7) and body["checked_at"]
