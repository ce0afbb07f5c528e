"""The data-plane POSTs skip Starlette's middleware (``GatewayApp``); every other method and
path still goes through Starlette's router, with its answers."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from ablab.platform.gateway.app import GatewayApp, create_app
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab_testing.gateway_harness import local_sdk


def test_routing_around_the_fast_path(tmp_path: Path) -> None:
    settings = GatewaySettings(backends={"s": Backend("s", "http://127.0.0.1:9/v1", timeout_s=1.0)}, default_backend="s",
                               outbox_dir=tmp_path / "outbox")
    app = create_app(settings, sdk=local_sdk({"a": {}}), ship=False)
    assert isinstance(app, GatewayApp)
    with TestClient(app) as client:
        assert client.get("/v1/chat/completions").status_code == 405  # not the fast path: Starlette's 405
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.post("/v1/nothing", json={}).status_code == 404
        # the fast path answers a malformed body in OpenAI's shape, as the routed handler did
        r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert r.headers["x-ablab-trace-id"]
        # an unreachable backend: the serving path's own 502, never a bare 500 from the server
        r = client.post("/v1/chat/completions", json={"model": "ok", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and r.json()["error"]["message"].startswith("backend unreachable")
