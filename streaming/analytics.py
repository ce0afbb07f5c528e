"""The API's analytics store (:class:`ablab.platform.api.ports.AnalyticsBackend`) and, in
embedded mode, the loader it runs, with their readiness and metrics.

chdb locks its data directory, so in embedded mode the API process owns the store and
runs the Kafka → ClickHouse loader in a thread; every other process goes through the
API. One client is shared by the loader and the request threads, behind a lock, since
the embedded engine's client is not documented as thread-safe.

The store implements the whole port: results' reads (``ablab.streaming.store.reads``), the
windows, and the rollup's maintenance through one :class:`~ablab.streaming.store.rollup.RollupStore`,
which remembers what it verified. A failed maintenance step is counted
(``ablab_rollup_sync_failures``) and raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ablab.platform.config import Settings
from ablab.platform.stats.spec import ExperimentSpec
from ablab.streaming.store.reads import StoreReads
from ablab.streaming.store.rollup import RollupStore

log = logging.getLogger(__name__)


class SerializedClient:
    """A clickhouse-connect client whose calls run one at a time."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked


class SharedClient(StoreReads):
    """The process's store client: results' reads (the port), and every clickhouse-connect
    call of the serialized client (``query``, ``insert``…) for the loader and test support."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class AnalyticsStore(StoreReads):
    def __init__(self, settings: Settings, *, run_loader: bool, known_experiments: Any = None) -> None:
        from ablab.streaming.store import apply_ddl, get_clickhouse_client

        self.settings = settings
        self.embedded = settings.resolved_clickhouse_url.startswith("chdb")
        raw = SerializedClient(get_clickhouse_client(settings))
        apply_ddl(raw)
        super().__init__(raw, RollupStore(raw))
        # raw clickhouse-connect access for the loader and test support (not on the port), one rollup
        self.client = SharedClient(raw, self.rollup)
        self.rollup_syncs = 0
        self.rollup_sync_failures = 0
        self.loader: Any = None
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self._loader_thread: threading.Thread | None = None
        self._loader_stop: threading.Event | None = None
        if run_loader:
            from ablab.streaming.loader.service import Loader

            self.loader = Loader(
                raw, settings.kafka_bootstrap, known_experiments=known_experiments, known_experiments_refresh_s=0.0
            )
            self._loader_stop = threading.Event()
            self._loader_thread = threading.Thread(target=self._supervise, name="ablab-loader", daemon=True)
            self._loader_thread.start()
            log.info("loader running in-process (Kafka %s → %s)", settings.kafka_bootstrap, "chdb" if self.embedded else "ClickHouse")

    def _supervise(self) -> None:
        """Keep the loader running: the broker may start after the API, or restart."""
        assert self._loader_stop is not None
        delay = 1.0
        while not self._loader_stop.is_set():
            try:
                self.loader.run(self._loader_stop)
                delay = 1.0
            except Exception as exc:
                log.warning("loader stopped (%s: %s); retrying in %.0f s", type(exc).__name__, exc, delay)
                self._loader_stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def ping(self) -> str:
        self._client.query("SELECT 1")
        return "ok (embedded chdb)" if self.embedded else "ok"

    def window_rows(self, experiment: str, *, start: datetime | None = None, end: datetime | None = None) -> list[dict[str, Any]]:
        from ablab.streaming.store.queries import window_rows

        return window_rows(self._client, experiment=experiment, start=start, end=end)

    def sync_rollup(self, spec: ExperimentSpec) -> dict[str, int]:
        """The rollup's maintenance step (the port's): counted, and a failure counted and raised."""
        try:
            repaired = self.rollup.sync(spec)
        except Exception:
            self.rollup_sync_failures += 1
            raise
        self.rollup_syncs += 1
        return repaired

    def _stream_probe(self) -> Any:
        """The stream job's probe, made on first use where this process runs the loader."""
        if self.loader is None:
            return None
        with self._probe_lock:
            if self._probe is None:
                from ablab.streaming.kafka.health import StreamJobProbe
                from ablab.streaming.kafka.topics import EVENT_TOPICS

                self._probe = StreamJobProbe(bootstrap=self.settings.kafka_bootstrap, topic=EVENT_TOPICS["inference"])
            return self._probe

    def checks(self) -> Mapping[str, Callable[[], str]]:
        from ablab.streaming.kafka.health import loader_verdict

        checks: dict[str, Callable[[], str]] = {"clickhouse": self.ping}
        if self.loader is not None:
            loader = self.loader
            checks["loader"] = lambda: loader_verdict(loader.stats)
        probe = self._stream_probe()
        if probe is not None:
            checks["stream_job"] = probe
        return checks

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily("ablab_rollup_syncs", "Rollup maintenance steps that completed (after create/update, "
                                  "and the monitor's pass)", value=self.rollup_syncs)
        yield CounterMetricFamily("ablab_rollup_sync_failures", "Rollup maintenance steps that failed (the monitor's "
                                  "next pass retries; results read raw_events meanwhile)", value=self.rollup_sync_failures)
        if self.loader is None:
            return
        stats = self.loader.stats
        yield CounterMetricFamily("ablab_loader_consumed_records", "Records the loader read", value=stats.consumed)
        yield CounterMetricFamily("ablab_loader_batches", "Batches stored (committed at the next checkpoint)", value=stats.batches)
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
        yield CounterMetricFamily("ablab_loader_checkpoints", "Rollup recomputes with an offset commit (each covers one batch or several)",
                                  value=stats.checkpoints)
        yield CounterMetricFamily("ablab_loader_rollup_replays",
                                  "Stretches replayed batch by batch after a checkpoint's recompute failed on data",
                                  value=stats.rollup_replays)
        yield CounterMetricFamily("ablab_loader_heartbeats", "Heartbeat records read (the edge's clock; nothing stored)",
                                  value=stats.heartbeats)
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
        probe = self._probe
        if probe is not None and probe.lag is not None:
            yield GaugeMetricFamily("ablab_stream_job_lag", "Records on the inference topic the stream job has not "
                                    "checkpointed", value=probe.lag)
            if probe.last_progress_at is not None:
                # the probe keeps monotonic time; export wall-clock time of the last progress
                wall = time.time() - (time.monotonic() - probe.last_progress_at)
                yield GaugeMetricFamily("ablab_stream_job_last_progress_timestamp_seconds",
                                        "When the stream job's committed offsets last moved", value=wall)

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
        if self._loader_stop is not None:
            self._loader_stop.set()
        if self._loader_thread is not None:
            self._loader_thread.join(timeout=30)
        close = getattr(self._client, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log.debug("closing the ClickHouse client failed", exc_info=True)
