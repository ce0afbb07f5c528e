"""The one settings object of ablab.

Layers, lowest to highest: built-in defaults → a YAML file (``ABLAB_CONFIG``, else
``$ABLAB_HOME/config.yaml`` when present) → ``ABLAB_*`` environment variables →
keyword arguments given to :class:`Settings` (tests, the CLI's flags).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ablab.platform.fields import SLA_METRIC

_DEV_WEBHOOK_SECRET = "ablab-dev-webhook-secret"


def _config_file() -> Path | None:
    explicit = os.environ.get("ABLAB_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"ABLAB_CONFIG points at {path}, which does not exist")
        return path
    home = Path(os.environ.get("ABLAB_HOME", ".ablab"))
    candidate = home / "config.yaml"
    return candidate if candidate.is_file() else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ABLAB_", extra="ignore")

    env: Literal["development", "test", "production"] = "development"
    home: Path = Field(default=Path(".ablab"), description="Data directory (SQLite, chdb, Kafka logs, spool).")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in `home` when unset.")
    clickhouse_url: str | None = Field(default=None, description="`chdb://…` (embedded) or `http(s)://…`.")
    kafka_bootstrap: str = "127.0.0.1:9092"
    api_url: str = "http://127.0.0.1:8000"
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    dashboard_port: int = Field(default=8501, ge=1, le=65535)
    dashboard_api_urls: list[str] = Field(
        default=[], description="Other ablab APIs the dashboard's sign-in may offer; it talks to `api_url` and these only.")
    dashboard_session_idle_s: float = Field(
        default=12 * 3600.0, gt=0, description="A dashboard sign-in ends after this long with no page load or interaction.")
    dashboard_session_max_s: float = Field(
        default=7 * 86_400.0, gt=0, description="A dashboard sign-in ends this long after it began, however active.")
    webhook_secret: SecretStr = SecretStr(_DEV_WEBHOOK_SECRET)
    bucket_space: int = Field(default=10_000, ge=10_000, description="Assignment buckets per hash space.")
    sdk_refresh_s: float = Field(default=10.0, gt=0)
    log_level: str = "INFO"
    analytics: bool = Field(default=True, description="The API opens the ClickHouse store (results routes).")
    run_loader: bool | None = Field(default=None, description="Run the Kafka → ClickHouse loader in the API; default: when embedded.")
    guardrail_interval_s: float = Field(default=30.0, ge=0, description="Guardrail checks every N s; 0 = off.")
    allocator_experiments: list[str] = Field(
        default=[], description="Experiments (request-randomized) whose weights the SLA-constrained Thompson allocator sets.")
    allocator_interval_s: float = Field(default=60.0, gt=0, description="Re-weight allocator experiments at most every N s.")
    allocator_reward: str = Field(default="accuracy", description="Allocator reward: a higher-is-better proportion.")
    allocator_constraint: str = Field(default=SLA_METRIC, description="Allocator SLA metric (bound: the guardrail max).")
    allocator_floor: float = Field(default=0.05, gt=0, lt=0.5, description="Smallest weight share an arm keeps.")
    allocator_min_change: float = Field(default=0.02, ge=0, description="Re-weight only when a share moves this much.")
    allocator_min_trials: int = Field(default=50, ge=0, description="Labelled requests needed before the first re-weight.")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024,
        description="Largest request body the API reads (every route; a chunked body is refused as it passes it).")
    event_max_ahead_s: float = Field(
        default=300.0, ge=0, description="Ingestion refuses an event time further than this ahead of the receiving clock.")
    stream_heartbeat_s: float = Field(
        default=1.0, ge=0,
        description="The API writes a heartbeat to every inference partition every N s (0 = off), so the stream "
                    "job's event time follows the clock when requests stop and the last windows close.")
    event_max_age_s: float = Field(
        default=30 * 86_400.0, gt=0, description="Ingestion refuses an event time older than this (the retention).")
    webhook_tolerance_s: float = Field(
        default=300.0, gt=0, le=3600, description="A signed webhook's timestamp may be this far from now; each delivery is accepted once.")
    http_header_timeout_s: float = Field(
        default=10.0, gt=0, description="A client must send a request's headers within this many seconds.")
    http_body_timeout_s: float = Field(
        default=30.0, gt=0, description="A client must send a request's whole body within this many seconds (else 408).")
    http_max_connections: int = Field(
        default=1024, ge=1, description="Open connections per API process before new requests get 503.")
    demo_worker_ports: list[int] = Field(default=[8101, 8102], min_length=1, description="`up --demo` worker ports.")
    demo_gateway_port: int = Field(default=8090, ge=1, le=65535, description="`up --demo` gateway port.")
    demo_llm_port: int = Field(default=8081, ge=1, le=65535, description="`up --demo` SmolLM2 (llama_cpp.server) port.")
    demo_duration_s: float = Field(default=1800.0, gt=0, description="How long `up --demo` traffic runs.")
    metrics_auth: bool = Field(
        default=False, description="`/metrics` (which names experiments, variants and backends) needs a bearer token "
                                   "with the viewer scope (an admin, editor or viewer key); off: public, for a scraper "
                                   "inside the deployment's network.")
    tracing: Literal["off", "console", "otlp"] = Field(default="off", description="OpenTelemetry spans: off, console or OTLP/HTTP.")
    otlp_endpoint: str = Field(default="http://127.0.0.1:4318/v1/traces", description="OTLP/HTTP traces endpoint when tracing=otlp.")

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _refuse_insecure_defaults(self) -> Settings:
        if self.env == "production" and self.public_webhook_secret:
            raise ValueError("ABLAB_WEBHOOK_SECRET must be set in production (the default is public)")
        return self

    @property
    def public_webhook_secret(self) -> bool:
        """Whether the webhook secret is the built-in default, which anyone can read and sign with."""
        return self.webhook_secret.get_secret_value() == _DEV_WEBHOOK_SECRET

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'ablab.db'}"

    @property
    def resolved_clickhouse_url(self) -> str:
        return self.clickhouse_url or f"chdb:///{self.home / 'chdb'}"

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to print: secrets masked, passwords stripped from URLs."""
        data = self.model_dump(mode="json")
        data["webhook_secret"] = "**********"
        for key in ("database_url", "clickhouse_url"):
            if data.get(key):
                data[key] = _mask_url(data[key])
        return data


def _mask_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL (chdb://, http://): mask user:pass@ by hand
        if "@" in url and "://" in url:
            scheme, rest = url.split("://", 1)
            return f"{scheme}://***@{rest.split('@', 1)[1]}"
        return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def dump_yaml(settings: Settings) -> str:
    return yaml.safe_dump(settings.public_dict(), sort_keys=True)
