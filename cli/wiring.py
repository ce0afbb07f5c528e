"""The API with its event pipeline and analytics store: the one place that joins the control
plane (``ablab.platform``) to its streaming implementations.

``ablab.platform.api.app.create_app`` knows only the protocols in
``ablab.platform.api.ports``; this module passes the Kafka ingestion edge
(:class:`ablab.streaming.edge.KafkaIngest`) and the ClickHouse store with its in-process
loader (:class:`ablab.streaming.analytics.AnalyticsStore`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from ablab.platform.api.app import Extension
from ablab.platform.api.app import create_app as create_control_plane
from ablab.platform.api.state import AppState
from ablab.platform.config import Settings, get_settings

if TYPE_CHECKING:  # imported when the app starts, so `ablab --help` never loads Kafka or chdb
    from ablab.cli.backends import BackendStatus
    from ablab.streaming.analytics import AnalyticsStore
    from ablab.streaming.edge import KafkaIngest


def kafka_ingest(state: AppState) -> KafkaIngest:
    from ablab.platform.api.webhooks import SqlReplayGuard
    from ablab.streaming.edge import KafkaIngest

    return KafkaIngest(state.settings, variants_of=state.assignments.live_variants,
                       replay_guard=SqlReplayGuard(state.engine))


def analytics_store(state: AppState) -> AnalyticsStore:
    from ablab.streaming.analytics import AnalyticsStore

    settings = state.settings
    embedded = settings.resolved_clickhouse_url.startswith("chdb")
    run_loader = settings.run_loader if settings.run_loader is not None else embedded
    return AnalyticsStore(settings, run_loader=run_loader, known_experiments=state.registered_experiments)


def backend_status(state: AppState) -> BackendStatus:
    """``GET /v1/backends``: the gateway's LLM backends, serving or why not (a wheel's build)."""
    from ablab.cli.backends import BackendStatus

    return BackendStatus(state.settings)


def create_app(settings: Settings | None = None, *, extensions: list[Extension] | None = None) -> FastAPI:
    """The full API: ingestion always, the analytics store when ``settings.analytics`` is on,
    the backends' status always."""
    return create_control_plane(settings or get_settings(), ingest=kafka_ingest, analytics=analytics_store,
                                extensions=[backend_status, *(extensions or [])])
