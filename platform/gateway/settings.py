"""Gateway settings: named backends, templates, the event outbox.

Backends come from ``ABLAB_GATEWAY_BACKENDS`` (JSON) or a ``--config`` YAML file::

    backends:
      smollm: {url: http://127.0.0.1:8081/v1, kind: llamacpp, price: {device: cpu}}
      hosted: {url: https://api.example.com/v1, api_key_env: HOSTED_KEY, timeout_s: 60,
               price: {input_per_mtok: 0.15, output_per_mtok: 0.60, version: list-2026-01}}
    default_backend: smollm          # units in no experiment (else the only/first backend)
    templates:                       # named prompt templates; {input} is the caller's text
      terse: "Answer in one sentence.\n\n{input}"

The YAML may also be the bare ``{name: backend}`` mapping, as the JSON variable is.

``/metrics`` is public unless ``ABLAB_GATEWAY_METRICS_TOKEN`` is set (an environment
variable only, never the YAML or a flag, which land in files and process lists): then a
scrape must send it as a bearer token. Only its SHA-256 digest is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND_KINDS = ("openai", "vllm", "llamacpp")
ANY_MODEL = ("*",)
METRICS_TOKEN_ENV = "ABLAB_GATEWAY_METRICS_TOKEN"
MIN_METRICS_TOKEN_CHARS = 16  # a guessable token guards nothing


class GatewayConfigError(ValueError):
    """A gateway setting is wrong; the message names the setting and what to do."""


@dataclass(frozen=True, slots=True)
class Price:
    """Per-token list prices (per million tokens) or a device kind for self-hosted backends."""

    input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    version: str | None = None
    device: str | None = None  # 'cpu' | 'cuda': device-seconds × platform/assets/prices.json


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    url: str  # the OpenAI base URL, ending in /v1 as clients expect
    kind: str = "openai"
    api_key_env: str | None = None
    timeout_s: float = 120.0
    price: Price | None = None
    # The model names this backend serves: ("*",) any (a backend built in code, or `models: ["*"]`);
    # None: those its GET /models lists (a configured backend without `models`), so a request
    # for a model no backend serves is answered 404 instead of by whichever backend it reaches.
    models: tuple[str, ...] | None = ANY_MODEL
    # Pass the caller's Authorization on to this backend. None: only where the backend has no
    # key of its own (api_key_env). Never to a backend the variant chose in place of the caller's.
    forward_caller_auth: bool | None = None
    # Serves OpenAI's Responses API (POST /v1/responses): vLLM does; others only when set.
    responses: bool | None = None

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    @property
    def any_model(self) -> bool:
        return self.models is not None and "*" in self.models

    @property
    def forwards_caller_auth(self) -> bool:
        return self.forward_caller_auth if self.forward_caller_auth is not None else self.api_key_env is None

    @property
    def serves_responses(self) -> bool:
        return self.responses if self.responses is not None else self.kind == "vllm"


@dataclass(frozen=True)
class GatewaySettings:
    backends: dict[str, Backend]
    default_backend: str
    templates: dict[str, str] = field(default_factory=dict)
    api_url: str = "http://127.0.0.1:8000"
    token: str | None = None  # sdk-scoped: config refresh and event delivery
    outbox_dir: Path | None = None  # None: events are not written (tests of the proxy alone)
    refresh_s: float = 10.0
    experiments: tuple[str, ...] | None = None  # only these experiments (default: all)
    # SHA-256 hex of the token /metrics asks for; None: public. The digest, not the token, so
    # the settings can be printed or logged and the comparison takes fixed-length inputs.
    metrics_token_sha256: str | None = field(default=None, repr=False)
    # Shadows (docs/gateway.md): when one starts ("after": once the primary's last byte came
    # from its backend; "beside": with the primary), and how many may run at once in all
    # (each experiment's own cap applies too; one more is dropped, never queued).
    shadow_launch: str = "after"
    shadow_max_inflight: int = 64
    # X-Ablab-Experiment / X-Ablab-Variant on answers: off unless set (they tell any caller
    # which variant each unit is in). X-Ablab-Trace-Id is always sent (feedback needs it).
    variant_headers: bool = False
    # SHA-256 digests of the keys gateway callers present (auth.py); empty: no caller key asked
    # for, which load_settings refuses while any backend lends an operator key (api_key_env).
    caller_key_digests: frozenset[str] = field(default=frozenset(), repr=False)
    max_body_bytes: int = 16 * 1024 * 1024  # a request body over this is refused (413)

    def backend(self, name: str | None) -> Backend:
        key = name or self.default_backend
        try:
            return self.backends[key]
        except KeyError:
            raise GatewayConfigError(f"backend {key!r} is not configured; known: {sorted(self.backends)}") from None


def token_digest(token: str) -> str:
    """What :attr:`GatewaySettings.metrics_token_sha256` holds for ``token``."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _metrics_token(env: dict[str, str]) -> str | None:
    token = env.get(METRICS_TOKEN_ENV)
    if token is None:
        return None
    token = token.strip()
    if len(token) < MIN_METRICS_TOKEN_CHARS:
        raise GatewayConfigError(f"{METRICS_TOKEN_ENV}: at least {MIN_METRICS_TOKEN_CHARS} characters (e.g. "
                                 "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or unset for a "
                                 "public /metrics")
    return token_digest(token)


SHADOW_LAUNCH_ENV = "ABLAB_GATEWAY_SHADOW_LAUNCH"
SHADOW_MAX_INFLIGHT_ENV = "ABLAB_GATEWAY_SHADOW_MAX_INFLIGHT"
SHADOW_LAUNCHES = ("after", "beside")


def _shadow_settings(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if (launch := env.get(SHADOW_LAUNCH_ENV)) is not None:
        if launch not in SHADOW_LAUNCHES:
            raise GatewayConfigError(f"{SHADOW_LAUNCH_ENV}: one of {list(SHADOW_LAUNCHES)}, got {launch!r}")
        out["shadow_launch"] = launch
    if (raw := env.get(SHADOW_MAX_INFLIGHT_ENV)) is not None:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if not 1 <= n <= 65536:
            raise GatewayConfigError(f"{SHADOW_MAX_INFLIGHT_ENV}: an integer in 1..65536, got {raw!r}")
        out["shadow_max_inflight"] = n
    return out


def _backend(name: str, raw: Any) -> Backend:
    where = f"backends.{name}"
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"{where}: expected a mapping with at least `url`")
    unknown = set(raw) - {"url", "kind", "api_key_env", "timeout_s", "price", "default", "models", "any_model",
                          "forward_caller_auth", "responses"}
    if unknown:
        raise GatewayConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise GatewayConfigError(f"{where}.url: an http(s) base URL such as http://127.0.0.1:8081/v1, got {url!r}")
    kind = raw.get("kind", "openai")
    if kind not in BACKEND_KINDS:
        raise GatewayConfigError(f"{where}.kind: one of {list(BACKEND_KINDS)}, got {kind!r}")
    timeout = raw.get("timeout_s", 120.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 3600:
        raise GatewayConfigError(f"{where}.timeout_s: seconds in (0, 3600], got {timeout!r}")
    price = None
    if (p := raw.get("price")) is not None:
        if not isinstance(p, dict) or set(p) - {"input_per_mtok", "output_per_mtok", "version", "device"}:
            raise GatewayConfigError(f"{where}.price: {{input_per_mtok, output_per_mtok, version}} or {{device: cpu|cuda}}")
        for k in ("input_per_mtok", "output_per_mtok"):
            if k in p and (not isinstance(p[k], (int, float)) or p[k] < 0):
                raise GatewayConfigError(f"{where}.price.{k}: a non-negative number, got {p[k]!r}")
        price = Price(
            input_per_mtok=p.get("input_per_mtok"), output_per_mtok=p.get("output_per_mtok"),
            version=p.get("version"), device=p.get("device"),
        )
    models: tuple[str, ...] | None = None  # configured without `models`: what its GET /models lists
    if raw.get("any_model") is not None:
        if not isinstance(raw["any_model"], bool):
            raise GatewayConfigError(f"{where}.any_model: true or false, got {raw['any_model']!r}")
        models = ANY_MODEL if raw["any_model"] else None
    if (listed := raw.get("models")) is not None:
        if not isinstance(listed, list) or not listed or not all(isinstance(m, str) and m for m in listed):
            raise GatewayConfigError(f"{where}.models: a non-empty list of model names, or [\"*\"] for any model, got {listed!r}")
        models = ANY_MODEL if "*" in listed else tuple(listed)
    flags: dict[str, bool] = {}
    for flag in ("forward_caller_auth", "responses"):
        if (value := raw.get(flag)) is not None:
            if not isinstance(value, bool):
                raise GatewayConfigError(f"{where}.{flag}: true or false, got {value!r}")
            flags[flag] = value
    return Backend(name=name, url=url.rstrip("/"), kind=kind, api_key_env=raw.get("api_key_env"),
                   timeout_s=float(timeout), price=price, models=models, **flags)


def parse_config(data: Any, *, source: str) -> tuple[dict[str, Backend], str, dict[str, str]]:
    """Backends, the default backend's name and the templates from a parsed JSON/YAML value."""
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{source}: expected a mapping of backends")
    raw_backends = data.get("backends", data) if "backends" in data else data
    templates = data.get("templates", {}) if "backends" in data else {}
    if not isinstance(raw_backends, dict) or not raw_backends:
        raise GatewayConfigError(f"{source}: no backends; give at least one as {{name: {{url: ...}}}}")
    backends = {str(name): _backend(str(name), raw) for name, raw in raw_backends.items()}
    default = data.get("default_backend") if "backends" in data else None
    if default is None:
        flagged = [n for n, raw in raw_backends.items() if isinstance(raw, dict) and raw.get("default")]
        default = flagged[0] if flagged else next(iter(backends))
    if default not in backends:
        raise GatewayConfigError(f"{source}: default_backend {default!r} is not one of {sorted(backends)}")
    if not isinstance(templates, dict) or not all(isinstance(v, str) and "{input}" in v for v in templates.values()):
        raise GatewayConfigError(f"{source}: templates are {{name: text}} and each text contains {{input}}")
    return backends, default, {str(k): v for k, v in templates.items()}


def load_settings(*, config_file: Path | None = None, env: dict[str, str] | None = None, **overrides: Any) -> GatewaySettings:
    """Settings from ``--config`` (YAML), else ``ABLAB_GATEWAY_BACKENDS``; API URL, token and
    outbox from the usual ``ABLAB_*`` settings unless given; the ``/metrics`` token from
    ``ABLAB_GATEWAY_METRICS_TOKEN``."""
    env = dict(os.environ if env is None else env)
    data: Any = None
    if config_file is not None:
        import yaml

        try:
            data = yaml.safe_load(Path(config_file).read_text())
        except OSError as exc:
            raise GatewayConfigError(f"--config {config_file}: {exc.strerror}") from None
        backends, default, templates = parse_config(data, source=str(config_file))
    elif raw := env.get("ABLAB_GATEWAY_BACKENDS"):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise GatewayConfigError(f"ABLAB_GATEWAY_BACKENDS: not JSON ({exc})") from None
        backends, default, templates = parse_config(data, source="ABLAB_GATEWAY_BACKENDS")
    else:
        raise GatewayConfigError(
            "no backends configured: set ABLAB_GATEWAY_BACKENDS='{\"local\": {\"url\": \"http://127.0.0.1:8081/v1\"}}' "
            "or pass --config gateway.yaml"
        )
    from ablab.platform.gateway.auth import KEYS_ENV, KEYS_FILE_ENV, lenders, load_key_digests

    values: dict[str, Any] = {"backends": backends, "default_backend": default, "templates": templates,
                              "metrics_token_sha256": _metrics_token(env), **_shadow_settings(env),
                              **_hardening_settings(data, env), "caller_key_digests": load_key_digests(env)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if (lending := lenders(values["backends"].values())) and not values["caller_key_digests"]:
        raise GatewayConfigError(
            f"backend(s) {lending} send the operator's key (api_key_env) with every request: set {KEYS_ENV} "
            f"(comma-separated keys) or {KEYS_FILE_ENV} (sha256:<hex> digests) so that only callers holding a "
            "gateway key can use it")
    return GatewaySettings(**values)


VARIANT_HEADERS_ENV = "ABLAB_GATEWAY_VARIANT_HEADERS"
MAX_BODY_ENV = "ABLAB_GATEWAY_MAX_BODY_BYTES"


def _hardening_settings(data: Any, env: dict[str, str]) -> dict[str, Any]:
    """``variant_headers`` (YAML top level or the env variable) and the body-size limit."""
    out: dict[str, Any] = {}
    top = data if isinstance(data, dict) and "backends" in data else {}
    flag: Any = top.get("variant_headers")
    if (raw := env.get(VARIANT_HEADERS_ENV)) is not None:
        if raw.strip().lower() not in ("1", "true", "yes", "0", "false", "no", ""):
            raise GatewayConfigError(f"{VARIANT_HEADERS_ENV}: true or false, got {raw!r}")
        flag = raw.strip().lower() in ("1", "true", "yes")
    if flag is not None:
        if not isinstance(flag, bool):
            raise GatewayConfigError(f"variant_headers: true or false, got {flag!r}")
        out["variant_headers"] = flag
    size: Any = env.get(MAX_BODY_ENV, top.get("max_body_bytes"))
    if size is not None:
        try:
            n = int(size)
        except (TypeError, ValueError):
            n = 0
        if not 1024 <= n <= 1 << 30:
            raise GatewayConfigError(f"max_body_bytes ({MAX_BODY_ENV}): bytes in 1024..{1 << 30}, got {size!r}")
        out["max_body_bytes"] = n
    return out
