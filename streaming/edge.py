"""The API's ingestion edge on Kafka: :mod:`ablab.streaming.ingest` behind the
:class:`ablab.platform.api.ports.IngestPipeline` protocol, with its readiness and metrics.

The emitter spools to disk while Kafka is down. Each API worker process takes the first
free spool slot, so a restarted worker picks up (and replays) what its predecessor in that
slot left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NoReturn

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ablab.platform import errors
from ablab.platform.config import Settings
from ablab.streaming.ingest import (
    EdgeLimits,
    IngestRejected,
    IngestResult,
    IngestStats,
    ReplayGuard,
    ingest_billing,
    ingest_events,
    ingest_feedback,
)

SPOOL_SLOTS = 64

# The status an IngestRejected carries → the control plane's error of that status.
_ERRORS: dict[int, type[errors.AblabError]] = {
    400: errors.AblabError, 401: errors.Unauthorized, 409: errors.Conflict, 413: errors.PayloadTooLarge,
}


def _raise(exc: IngestRejected) -> NoReturn:
    error = _ERRORS.get(exc.status_code, errors.AblabError)
    raise error(exc.message, field=exc.field) from exc


def _event_fields() -> frozenset[str]:
    from ablab.platform import events

    names = {"$", "events", "labels", "records"}
    for model in (events.ExposureEvent, events.InferenceEvent, events.RumEvent, events.FeedbackEvent, events.CostEvent):
        names.update(model.model_fields)
    return frozenset(names)


class KafkaIngest:
    """Validates each record and forwards the valid ones to Kafka through one emitter."""

    def __init__(self, settings: Settings, *, variants_of: Callable[[str], Collection[str] | None],
                 replay_guard: ReplayGuard) -> None:
        from ablab.streaming.kafka.emitter import emitter_from_settings
        from ablab.streaming.kafka.spool import SpoolLockedError

        for slot in range(SPOOL_SLOTS):
            try:
                self.emitter = emitter_from_settings(name=f"api-{slot}", settings=settings,
                                                     heartbeat_s=settings.stream_heartbeat_s)
                break
            except SpoolLockedError:
                continue
        else:
            raise RuntimeError(f"all {SPOOL_SLOTS} API spool slots are locked; too many API workers on one ABLAB_HOME")
        self.settings = settings
        self.stats = IngestStats()
        self.limits = EdgeLimits.from_settings(settings)
        self.replay_guard = replay_guard
        self.variants_of = variants_of

    def _common(self) -> dict[str, Any]:
        return {"sink": self.emitter, "stats": self.stats, "variants_of": self.variants_of, "limits": self.limits}

    def events(self, body: bytes) -> IngestResult:
        try:
            return ingest_events(body=body, **self._common())
        except IngestRejected as exc:
            _raise(exc)

    def feedback(self, body: bytes) -> IngestResult:
        try:
            return ingest_feedback(body=body, **self._common())
        except IngestRejected as exc:
            _raise(exc)

    def billing(self, body: bytes, *, signature: str | None, timestamp: str | None) -> IngestResult:
        try:
            return ingest_billing(body=body, signature=signature, timestamp=timestamp,
                                  secret=self.settings.webhook_secret.get_secret_value(),
                                  replay_guard=self.replay_guard, **self._common())
        except IngestRejected as exc:
            _raise(exc)

    def checks(self) -> Mapping[str, Callable[[], str]]:
        from ablab.streaming.kafka.health import emitter_verdict

        return {"emitter": lambda: emitter_verdict(self.emitter.counters())}

    def collect(self) -> Iterator[Any]:
        requests = CounterMetricFamily("ablab_ingest_requests", "Ingestion requests", labels=["endpoint"])
        outcomes = CounterMetricFamily("ablab_ingest_events", "Ingested records by outcome", labels=["endpoint", "outcome"])
        fields = CounterMetricFamily("ablab_ingest_rejected_fields", "Rejected records by offending field "
                                     "(fields outside the event schema as $other)", labels=["endpoint", "field"])
        known = _event_fields()
        rejected_by_field: dict[tuple[str, str], int] = {}
        for name, count in self.stats.as_dict().items():
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
        counters = self.emitter.counters()
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

    def close(self) -> None:
        # With the broker gone, waiting to deliver is pointless: spool what is left at once
        # (the next API on this slot replays it), so SIGTERM is not held up for seconds.
        up = bool(self.emitter.counters().get("broker_up"))
        self.emitter.close(timeout_s=10.0 if up else 1.0)
