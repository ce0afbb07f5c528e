"""Liveness, readiness and Prometheus metrics (no auth).

``/readyz`` fails (503) while a component this process runs or depends on is failing: the
config DB, ClickHouse, the in-process loader (cannot store, or stalled with records
waiting), the emitter's spool (dropping, or backlogged beyond a bound) and, where this
process runs the loader, the stream job (records to read and no checkpoint for a minute).
``/metrics`` exports the same components' counters, last success times and lags through a
prometheus_client collector: fixed metric names, the varying parts as labels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text

from ablab.platform.api.deps import StateDep
from ablab.platform.api.problems import problem
from ablab.platform.api.state import AppState

router = APIRouter(tags=["health"])
_probe_lock = threading.Lock()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _stream_probe(state: AppState) -> Any:
    """The stream job's probe, made on first use where this process runs the loader."""
    analytics = state.extras.get("analytics")
    if analytics is None or analytics.loader is None:
        return None
    with _probe_lock:
        probe = state.extras.get("stream_probe")
        if probe is None:
            from ablab.streaming.kafka.health import StreamJobProbe
            from ablab.streaming.kafka.topics import EVENT_TOPICS

            probe = StreamJobProbe(bootstrap=state.settings.kafka_bootstrap, topic=EVENT_TOPICS["inference"])
            state.extras["stream_probe"] = probe
        return probe


def _pipeline_checks(state: AppState) -> dict[str, Any]:
    from ablab.streaming.kafka.health import emitter_verdict, loader_verdict

    checks: dict[str, Any] = {}
    analytics = state.extras.get("analytics")
    if analytics is not None and analytics.loader is not None:
        checks["loader"] = lambda: loader_verdict(analytics.loader.stats)
    ingest = state.extras.get("ingest")
    if ingest is not None:
        checks["emitter"] = lambda: emitter_verdict(ingest.emitter.counters())
    probe = _stream_probe(state)
    if probe is not None:
        checks["stream_job"] = probe
    return checks


@router.get("/readyz")
def readyz(state: StateDep) -> Response:
    checks: dict[str, str] = {}
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        checks["database"] = f"ok (migration {revision})"
    except Exception as exc:  # noqa: BLE001 - report any failure as not ready
        checks["database"] = f"failed: {type(exc).__name__}"
    probes = {**state.extras.get("readiness", {}), **_pipeline_checks(state)}
    for name, probe in probes.items():
        try:
            checks[name] = probe()
        except Exception as exc:  # noqa: BLE001
            checks[name] = f"failed: {type(exc).__name__}: {exc}"
    failed = [k for k, v in checks.items() if v.startswith("failed")]
    if failed:
        hint = " (run `ablab db upgrade`?)" if "database" in failed else ""
        return problem(503, "Not ready", f"not ready: {', '.join(failed)}{hint}", checks=checks)
    return JSONResponse({"status": "ready", "checks": checks})


def _event_fields() -> frozenset[str]:
    from ablab.platform import events

    names = {"$", "events", "labels", "records"}
    for model in (events.ExposureEvent, events.InferenceEvent, events.RumEvent, events.FeedbackEvent, events.CostEvent):
        names.update(model.model_fields)
    return frozenset(names)


class PipelineCollector(Collector):
    """The streaming components' counters as Prometheus families (read at scrape time)."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        yield from self._ingest()
        yield from self._loader()
        probe = self.state.extras.get("stream_probe")
        if probe is not None and probe.lag is not None:
            yield GaugeMetricFamily("ablab_stream_job_lag", "Records on the inference topic the stream job has not "
                                    "checkpointed", value=probe.lag)
            if probe.last_progress_at is not None:
                # the probe keeps monotonic time; export wall-clock time of the last progress
                wall = time.time() - (time.monotonic() - probe.last_progress_at)
                yield GaugeMetricFamily("ablab_stream_job_last_progress_timestamp_seconds",
                                        "When the stream job's committed offsets last moved", value=wall)

    def _ingest(self) -> Iterator[Any]:
        ingest = self.state.extras.get("ingest")
        if ingest is None:
            return
        requests = CounterMetricFamily("ablab_ingest_requests", "Ingestion requests", labels=["endpoint"])
        outcomes = CounterMetricFamily("ablab_ingest_events", "Ingested records by outcome", labels=["endpoint", "outcome"])
        fields = CounterMetricFamily("ablab_ingest_rejected_fields", "Rejected records by offending field "
                                     "(fields outside the event schema as $other)", labels=["endpoint", "field"])
        known = _event_fields()
        rejected_by_field: dict[tuple[str, str], int] = {}
        for name, count in ingest.stats.as_dict().items():
            endpoint, _, rest = name.partition(".")
            if rest == "requests":
                requests.add_metric([endpoint], count)
            elif rest.startswith("rejected."):
                field = rest.removeprefix("rejected.").split(".")[0].split("[")[0]
                key = (endpoint, field if field in known else "$other")
                rejected_by_field[key] = rejected_by_field.get(key, 0) + count
            elif rest:
                outcomes.add_metric([endpoint, rest], count)
        for (endpoint, field), count in sorted(rejected_by_field.items()):
            fields.add_metric([endpoint, field], count)
        yield from (requests, outcomes, fields)
        counters = ingest.emitter.counters()
        emitted = CounterMetricFamily("ablab_emitter_records", "Emitter records by outcome", labels=["outcome"])
        gauges = GaugeMetricFamily("ablab_emitter_state", "Emitter queue, in-flight and spool sizes", labels=["part"])
        for name, value in sorted(counters.items()):
            if name in ("queued", "inflight", "spool_pending", "corrupt_spool_lines"):
                gauges.add_metric([name], float(value))
            elif name != "broker_up":
                emitted.add_metric([name], float(value))
        yield emitted
        yield gauges
        yield GaugeMetricFamily("ablab_emitter_broker_up", "1 while the emitter reaches Kafka",
                                value=1.0 if counters.get("broker_up") else 0.0)

    def _loader(self) -> Iterator[Any]:
        analytics = self.state.extras.get("analytics")
        if analytics is None or analytics.loader is None:
            return
        stats = analytics.loader.stats
        yield CounterMetricFamily("ablab_loader_consumed_records", "Records the loader read", value=stats.consumed)
        yield CounterMetricFamily("ablab_loader_batches", "Batches stored and committed", value=stats.batches)
        loaded = CounterMetricFamily("ablab_loader_loaded_rows", "Rows stored", labels=["table"])
        for table, count in sorted(stats.loaded.items()):
            loaded.add_metric([table], count)
        yield loaded
        dead = CounterMetricFamily("ablab_loader_dead_lettered_records", "Records dead-lettered, by offending field",
                                   labels=["field"])
        for field, count in sorted(stats.dead_lettered.items()):
            dead.add_metric([field], count)
        yield dead
        yield CounterMetricFamily("ablab_loader_failures", "Batch attempts that failed (the store did not answer)",
                                  value=stats.failures)
        yield CounterMetricFamily("ablab_loader_bisections", "Batches split around rows the store refused",
                                  value=stats.bisections)
        yield GaugeMetricFamily("ablab_loader_failing", "1 while the loader cannot store its batch",
                                value=1.0 if stats.consecutive_failures else 0.0)
        if stats.last_flush_at is not None:
            yield GaugeMetricFamily("ablab_loader_last_success_timestamp_seconds", "When the loader last committed a batch",
                                    value=stats.last_flush_at)
        lag = GaugeMetricFamily("ablab_loader_consumer_lag", "Records between the committed offset and the end",
                                labels=["topic", "partition"])
        for (topic, partition), count in sorted(dict(stats.lag).items()):
            lag.add_metric([topic, str(partition)], count)
        yield lag


@router.get("/metrics")
def metrics(state: StateDep) -> Response:
    pipeline = CollectorRegistry(auto_describe=False)
    pipeline.register(PipelineCollector(state))
    body = generate_latest(state.metrics.registry) + generate_latest(pipeline)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
