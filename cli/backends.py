"""Whether the LLM backends behind the gateway are serving, for ``GET /v1/backends``.

The backends are the gateway's (``ABLAB_GATEWAY_BACKENDS``, else the config ``ablab up
--demo`` writes to ``ABLAB_HOME/run/gateway.yaml``). Each is probed at ``GET {url}/models``;
one that does not answer and is a llama.cpp server on this machine reports why, from the
same source as ``ablab status``: the llama-cpp-python wheel's build log (its percentage),
a failed build, or an installed runtime still loading its model. The dashboard shows this
instead of "no events yet" for an experiment whose variants name such a backend.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ablab.platform.config import Settings

CACHE_S = 3.0  # the dashboard polls; probing more often tells nothing new
PROBE_TIMEOUT_S = 1.5
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")

Probe = Callable[[str], bool]


def configured_backends(settings: Settings, env: Mapping[str, str] | None = None) -> list[Any]:
    """The gateway's backends (``platform.gateway.settings.Backend``), default first; [] when
    none is configured or the configuration does not parse (the gateway reports that)."""
    from ablab.platform.gateway.settings import GatewayConfigError, parse_config

    env = os.environ if env is None else env
    try:
        if raw := env.get("ABLAB_GATEWAY_BACKENDS"):
            data, source = json.loads(raw), "ABLAB_GATEWAY_BACKENDS"
        else:
            path = Path(settings.home) / "run" / "gateway.yaml"
            if not path.is_file():
                return []
            import yaml

            try:
                data, source = yaml.safe_load(path.read_text()), str(path)
            except yaml.YAMLError:
                return []
        backends, default, _ = parse_config(data, source=source)
    except (GatewayConfigError, ValueError, OSError):
        return []
    return sorted(backends.values(), key=lambda b: b.name != default)


def answers(url: str) -> bool:
    """An OpenAI-compatible server answers ``GET /models`` (any HTTP answer: a hosted API
    may want a key for it, and still serves)."""
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/models", timeout=PROBE_TIMEOUT_S).status_code < 500
    except httpx.HTTPError:
        return False


def describe(name: str, kind: str, *, default: bool, serving: bool, local: bool, build: Any | None) -> dict[str, Any]:
    """One row of ``/v1/backends`` from what was observed (``build``: a
    ``ablab.inference.llamacpp.BuildState``, for a local llama.cpp backend that does not answer)."""
    row: dict[str, Any] = {"name": name, "kind": kind, "default": default, "progress": None}
    if serving:
        return {**row, "state": "serving", "detail": "answering"}
    if kind != "llamacpp" or not local or build is None:
        return {**row, "state": "unreachable", "detail": "not answering at its URL"}
    if build.state == "installed":
        return {**row, "state": "starting", "detail": "llama-cpp-python is installed; the server is loading its model "
                                                     "or not started (`ablab status`)"}
    if build.state == "building":
        progress = build.done / build.total if build.total else None
        return {**row, "state": "building", "progress": progress, "detail": build.describe()}
    return {**row, "state": build.state, "detail": build.describe()}


class BackendStatus:
    """An API component (``create_app(extensions=...)``) answering ``backends()``."""

    def __init__(self, settings: Settings, *, probe: Probe = answers, build_state: Callable[[], Any] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self._probe = probe
        self._build_state = build_state
        self._env = env
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def _build(self) -> Any:
        if self._build_state is not None:
            return self._build_state()
        from ablab.inference.llamacpp import build_state

        return build_state()

    def backends(self) -> dict[str, Any]:
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < CACHE_S:
                return self._cached[1]
            found = configured_backends(self.settings, self._env)
            with ThreadPoolExecutor(max_workers=max(1, min(8, len(found)))) as pool:
                serving = list(pool.map(lambda b: self._probe(b.url), found))
            build = None
            rows = []
            for i, (backend, up) in enumerate(zip(found, serving)):
                local = (urlsplit(backend.url).hostname or "") in LOOPBACK
                if not up and backend.kind == "llamacpp" and local and build is None:
                    build = self._build()
                rows.append(describe(backend.name, backend.kind, default=i == 0, serving=up, local=local, build=build))
            report = {"items": rows, "checked_at": datetime.now(UTC).isoformat(timespec="seconds")}
            self._cached = (time.monotonic(), report)
            return report

    # -- ports.Component: nothing to check or export, nothing to close ---------------------
    def checks(self) -> Mapping[str, Callable[[], str]]:
        return {}

    def collect(self) -> Iterable[Any]:
        return []

    def close(self) -> None:
        return None
