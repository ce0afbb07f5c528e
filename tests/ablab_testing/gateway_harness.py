"""The gateway unit tests' harness: a real gateway (uvicorn in a thread) in front of the scripted
backend, configured in place with the real SDK client (no API)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.gateway.app import create_app
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.sdk import AblabClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("gateway failed to start")
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def local_sdk(variants: dict[str, dict[str, Any]], *, key: str = "exp") -> AblabClient:
    """The real SDK client with a config given in place (no API needed for the proxy's tests)."""
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    spec = ExperimentSpec(key=key, salt=f"{key}-salt", control=next(iter(variants)),
                          variants=tuple(VariantSpec(k, 1.0, s) for k, s in variants.items()))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    sdk._ready.set()
    return sdk


class Gateway:
    def __init__(self, url: str, outbox: Path, app: Any) -> None:
        self.url, self.outbox, self.app = url, outbox, app

    def events(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.outbox.glob("*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
        return out

    def state(self) -> Any:
        return self.app.state.holder["state"]


@contextmanager
def gateway_for(backend_url: str, tmp: Path, variants: dict[str, dict[str, Any]] | None = None,
                *, kind: str = "openai", extra: dict[str, Backend] | None = None, templates: dict[str, str] | None = None) -> Iterator[Gateway]:
    backends = {"scripted": Backend("scripted", backend_url, kind=kind, timeout_s=5.0), **(extra or {})}
    settings = GatewaySettings(backends=backends, default_backend="scripted", outbox_dir=tmp / "outbox",
                               templates=templates or {}, variant_headers=True)  # the tests read the variant
    sdk = local_sdk(variants or {"a": {}, "b": {"params": {"temperature": 0.2}}})
    app = create_app(settings, sdk=sdk, ship=False)
    with serve(app) as url:
        yield Gateway(url, tmp / "outbox", app)
