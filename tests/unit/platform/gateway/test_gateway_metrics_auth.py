"""The gateway's ``/metrics`` names backends, experiments and variants: public by default,
behind a configured token (``ABLAB_GATEWAY_METRICS_TOKEN``) when one is set. The gateway has
no key database, so it keeps the token's digest and compares digests in constant time."""

from __future__ import annotations

import logging

import pytest
from starlette.testclient import TestClient

from ablab.platform.gateway.app import create_app, metrics_authorized
from ablab.platform.gateway.settings import (
    METRICS_TOKEN_ENV,
    Backend,
    GatewayConfigError,
    GatewaySettings,
    load_settings,
    token_digest,
)

TOKEN = "scrape-me-0123456789abcdef"
BACKENDS = '{"mine": {"url": "http://127.0.0.1:9/v1"}}'


def _settings(**env: str) -> GatewaySettings:
    return load_settings(env={"ABLAB_GATEWAY_BACKENDS": BACKENDS, **env})


def test_the_token_comes_from_the_environment_and_only_its_digest_is_kept() -> None:
    assert _settings().metrics_token_sha256 is None  # unset: public, as before
    settings = _settings(**{METRICS_TOKEN_ENV: f" {TOKEN}\n"})
    assert settings.metrics_token_sha256 == token_digest(TOKEN)
    assert TOKEN not in repr(settings) and settings.metrics_token_sha256 not in repr(settings)
    assert TOKEN not in str(vars(settings))


def test_a_token_in_the_environment_closes_metrics_to_scrapes_without_it() -> None:
    # End to end through load_settings, as `ablab gateway` starts (only names older code has too).
    settings = load_settings(env={"ABLAB_GATEWAY_BACKENDS": BACKENDS, "ABLAB_GATEWAY_METRICS_TOKEN": TOKEN})
    with TestClient(create_app(settings, ship=False)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("value", ["", "   ", "short"])
def test_an_empty_or_guessable_token_stops_the_start_by_name(value: str) -> None:
    with pytest.raises(GatewayConfigError, match=METRICS_TOKEN_ENV) as refused:
        _settings(**{METRICS_TOKEN_ENV: value})
    assert "short" not in str(refused.value)  # the value is not echoed


def _app(token: str | None) -> TestClient:
    settings = GatewaySettings(backends={"mine": Backend("mine", "http://127.0.0.1:9/v1")}, default_backend="mine",
                               metrics_token_sha256=token_digest(token) if token else None)
    return TestClient(create_app(settings, ship=False))


def test_without_a_token_metrics_stay_public() -> None:
    with _app(None) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200 and "ablab_gateway" in answer.text


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN}x",
                                    f"bearer {TOKEN[:-1]}"])
def test_with_a_token_a_missing_or_wrong_one_is_a_401_problem(header: str | None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with _app(TOKEN) as client:
        answer = client.get("/metrics", headers={"Authorization": header} if header is not None else {})
    assert answer.status_code == 401, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.headers["www-authenticate"] == "Bearer"
    body = answer.json()
    assert body["status"] == 401 and body["title"] == "Unauthorized" and body["field"] == "Authorization"
    assert METRICS_TOKEN_ENV in body["detail"] and TOKEN not in answer.text and "ablab_gateway" not in answer.text
    assert TOKEN not in caplog.text


def test_with_a_token_the_right_bearer_reads_metrics_and_probes_stay_open() -> None:
    with _app(TOKEN) as client:
        for scheme in ("Bearer", "bearer"):
            answer = client.get("/metrics", headers={"Authorization": f"{scheme} {TOKEN}"})
            assert answer.status_code == 200 and "ablab_gateway" in answer.text
        assert client.get("/healthz").status_code == 200  # liveness needs no token


def test_the_comparison_is_of_digests() -> None:
    settings = GatewaySettings(backends={}, default_backend="mine", metrics_token_sha256=token_digest(TOKEN))
    assert metrics_authorized(settings, f"Bearer {TOKEN}") and not metrics_authorized(settings, None)
    assert not metrics_authorized(settings, f"Bearer {token_digest(TOKEN)}")  # the digest is no token
    assert metrics_authorized(GatewaySettings(backends={}, default_backend="mine"), None)
