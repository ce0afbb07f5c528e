"""What the API needs from the event pipeline and the analytics store, as protocols.

The control plane defines these and never imports their implementations: the Kafka
ingestion edge and the ClickHouse store live in ``ablab.streaming`` and are wired into the
app by ``ablab.cli.wiring`` (``create_app(settings, ingest=..., analytics=...)``). An API
built without them answers their routes with 503 and names the setting to change.

Every component reports its own readiness (``checks``) and Prometheus families
(``collect``); ``/readyz`` and ``/metrics`` only gather them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ablab.platform.analytics.store_port import AnalyticsReads

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ablab.platform.stats.spec import ExperimentSpec

# A readiness probe: "ok …" or "failed: …" (what ``/readyz`` looks for) and never raises on
# its component's failure.
Probe = Callable[[], str]


@runtime_checkable
class Component(Protocol):
    """Something the API process runs beside its routes."""

    def checks(self) -> Mapping[str, Probe]:
        """Readiness probes by name (shown under ``checks`` in ``/readyz``)."""
        ...

    def collect(self) -> Iterable[Metric]:
        """Prometheus metric families, read at scrape time (fixed names, varying parts as labels)."""
        ...

    def close(self) -> None: ...


class IngestAccepted(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class IngestPipeline(Component, Protocol):
    """The ingestion edge: validates each record, forwards the valid ones, dead-letters the rest.

    Each call answers the counts of one request; a request that cannot be read at all raises
    an :class:`ablab.platform.errors.AblabError` naming the field at fault.
    """

    def events(self, body: bytes) -> IngestAccepted: ...

    def feedback(self, body: bytes) -> IngestAccepted: ...

    def billing(self, body: bytes, *, signature: str | None, timestamp: str | None) -> IngestAccepted: ...


class AnalyticsBackend(Component, AnalyticsReads, Protocol):
    """The analytics store as the control plane uses it: results' reads
    (:class:`~ablab.platform.analytics.store_port.AnalyticsReads`: the per-unit plan over
    ``raw_events``, the per-unit rollup, exposures, shadows), the 10 s windows and the
    rollup's maintenance step. No SQL about the store's tables is written outside the store."""

    def window_rows(self, experiment: str, *, start: datetime | None = None, end: datetime | None = None) -> list[dict[str, Any]]:
        """The experiment's 10 s windows, oldest first (the input of :func:`ablab.platform.stats.timeseries.timeseries`)."""
        ...

    def sync_rollup(self, spec: ExperimentSpec) -> Mapping[str, int]:
        """The per-unit rollup's maintenance step for one experiment: record its SLOs and
        whether it keeps segment rows, recompute the units that are stale; units repaired by
        cause. Called after create/update commits and by the monitor's pass, never by a read.
        A failure raises, after the backend counted it (``ablab_rollup_sync_failures`` in
        :meth:`collect`); the caller logs it and the monitor's next pass retries."""
        ...
