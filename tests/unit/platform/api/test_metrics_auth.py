"""``/metrics`` names experiments, variants and backends: public by default, and behind a
viewer-scope API key (the app's own auth) when ``ABLAB_METRICS_AUTH`` is on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ablab.platform.api.app import create_app
from ablab.platform.auth import create_api_key, revoke_api_key_by_id
from ablab.platform.config import Settings
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import Scope


def _client(tmp_path: Path, **settings: object) -> Iterator[tuple[TestClient, dict[str, str]]]:
    config = Settings(home=tmp_path, analytics=False, **settings)
    upgrade(config.resolved_database_url)
    engine = make_engine(config.resolved_database_url)
    tokens: dict[str, str] = {}
    with transaction(make_sessionmaker(engine)) as session:
        for scope in Scope:
            tokens[scope.value] = create_api_key(session, name=scope.value, scope=scope)[1]
        revoked, tokens["revoked"] = create_api_key(session, name="gone", scope=Scope.viewer)
        revoke_api_key_by_id(session, key_id=revoked.id, actor="test")
    engine.dispose()
    with TestClient(create_app(config)) as client:
        yield client, tokens


@pytest.fixture()
def public(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    yield from _client(tmp_path)


@pytest.fixture()
def guarded(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    yield from _client(tmp_path, metrics_auth=True)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_metrics_stay_public_by_default(public: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = public
    assert Settings.model_fields["metrics_auth"].default is False
    answer = client.get("/metrics")
    assert answer.status_code == 200 and "ablab_http_requests_total" in answer.text
    assert client.get("/metrics", headers=_bearer("nonsense")).status_code == 200  # a header is not asked for


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer abl_wrong"}, {"Authorization": "Basic dXNlcjpwdw=="},
                                     {"Authorization": "Bearer "}, "revoked"])
def test_with_metrics_auth_a_missing_or_wrong_token_is_a_401_problem(
    guarded: tuple[TestClient, dict[str, str]], headers: dict[str, str] | str,
) -> None:
    client, tokens = guarded
    answer = client.get("/metrics", headers=_bearer(tokens[headers]) if isinstance(headers, str) else headers)
    assert answer.status_code == 401, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.headers["www-authenticate"] == "Bearer"
    body = answer.json()
    assert body["status"] == 401 and body["field"] == "Authorization" and "ablab_" not in answer.text


def test_with_metrics_auth_a_reader_scrapes_and_an_sdk_token_may_not(guarded: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = guarded
    for scope in ("viewer", "editor", "admin"):
        answer = client.get("/metrics", headers=_bearer(tokens[scope]))
        assert answer.status_code == 200 and "ablab_http_requests_total" in answer.text, scope
    # The sdk scope sends events and assigns; it reads nothing, these counters included.
    refused = client.get("/metrics", headers=_bearer(tokens["sdk"]))
    assert refused.status_code == 403 and refused.json()["field"] == "Authorization"
    # Probes stay open: a kubelet has no token.
    assert client.get("/healthz").status_code == 200


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ABLAB_METRICS_AUTH", "true")
    assert Settings(home=tmp_path).metrics_auth is True


def test_openapi_lists_the_metrics_refusals(public: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = public
    operation = client.get("/openapi.json").json()["paths"]["/metrics"]["get"]
    assert {"200", "401", "403"} <= set(operation["responses"])
