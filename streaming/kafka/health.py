"""Readiness of the streaming components, as one-line verdicts for ``/readyz``.

Each check returns ``"ok …"`` or ``"failed: …"`` (the prefix ``/readyz`` looks for) with
what to do next, and never raises on a component's failure:

- :func:`loader_verdict`: the loader is failing while it cannot store its batch (the store
  does not answer; the same batch is being retried), and stalled when records wait in Kafka
  but nothing was committed for ``stall_s``.
- :func:`emitter_verdict`: the emitter's spool is failing (records dropped) or backlogged
  beyond a bound (the broker has been away long enough to pile up that much).
- :class:`StreamJobProbe`: the Flink job is down when its consumer group has records to
  read on the inference topic and its committed offsets (moved by every completed
  checkpoint) have not moved for ``stall_s``. It asks the broker, so it works whether the
  job runs in a local mini-cluster or on a cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_STALL_S = 60.0
DEFAULT_MAX_SPOOL = 100_000


def loader_verdict(stats: Any, *, stall_s: float = DEFAULT_STALL_S, now: float | None = None) -> str:
    """``stats`` is a :class:`ablab.streaming.loader.service.LoaderStats`."""
    now = time.time() if now is None else now
    if stats.consecutive_failures:
        return (f"failed: the loader cannot store its batch ({stats.consecutive_failures} attempts; last error "
                f"{stats.last_error}); check ClickHouse (`ablab status`)")
    lag = sum(stats.lag.values())
    last = stats.last_flush_at
    if lag and last is not None and now - last > stall_s:
        return f"failed: the loader has {lag} records waiting and committed nothing for {now - last:.0f} s"
    when = "never" if last is None else f"{now - last:.1f} s ago"
    return f"ok (last batch {when}, lag {lag})"


def emitter_verdict(counters: Mapping[str, int | bool], *, max_spool: int = DEFAULT_MAX_SPOOL) -> str:
    """``counters`` from :meth:`ablab.streaming.kafka.emitter.Emitter.counters`."""
    pending = int(counters.get("spool_pending", 0))
    if int(counters.get("dropped", 0)):
        return (f"failed: the emitter dropped {counters['dropped']} records (spool full or unwritable); "
                "free disk space under ABLAB_HOME and check the broker")
    if pending > max_spool:
        return f"failed: {pending} records spooled while the broker is away (bound {max_spool}); start Kafka"
    state = "broker up" if counters.get("broker_up") else "broker away, spooling"
    return f"ok ({state}, {pending} spooled)"


@dataclass
class StreamJobProbe:
    """Progress of the stream job's consumer group on its input topic (see the module docstring)."""

    bootstrap: str
    group_id: str = "ablab-flink"
    topic: str = "ablab.inference"
    stall_s: float = DEFAULT_STALL_S
    cache_s: float = 5.0
    lag: int | None = None
    last_progress_at: float | None = None
    _committed: dict[int, int] = field(default_factory=dict)
    _checked_at: float = 0.0
    _verdict: str = "ok (not checked yet)"
    _clients: tuple[Any, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= self.cache_s:
                self._checked_at = now
                self._verdict = self._check(now)
            return self._verdict

    def _check(self, now: float) -> str:
        try:
            committed, ends = self._offsets()
        except Exception as exc:
            self._close()
            return f"failed: cannot read the stream job's offsets ({type(exc).__name__}: {exc}); is Kafka up?"
        self.lag = sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())
        if self.last_progress_at is None or committed != self._committed or self.lag == 0:
            self.last_progress_at = now
        self._committed = committed
        idle = now - self.last_progress_at
        if self.lag and idle > self.stall_s:
            return (f"failed: the stream job (group {self.group_id}) has {self.lag} records to read on {self.topic} "
                    f"and has committed no checkpoint for {idle:.0f} s; start it with `ablab stream submit`")
        return f"ok (lag {self.lag})"

    def _offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

        if self._clients is None:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="ablab-readiness",
                                     request_timeout_ms=3000)
            consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="ablab-readiness",
                                     enable_auto_commit=False, bootstrap_timeout_ms=3000)
            self._clients = (admin, consumer)
        admin, consumer = self._clients
        partitions = consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        ends = {tp.partition: int(offset) for tp, offset in consumer.end_offsets(tps).items()} if tps else {}
        from kafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError, GroupIdNotFoundError

        try:
            offsets = admin.list_group_offsets({self.group_id: None}).get(self.group_id) or {}
        except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, GroupIdNotFoundError):
            offsets = {}  # no group has committed on this broker yet: the job has not checkpointed
        committed = {tp.partition: int(meta.offset) for tp, meta in offsets.items()
                     if tp.topic == self.topic and meta.offset is not None and meta.offset >= 0}
        return committed, ends

    def _close(self) -> None:
        if self._clients is not None:
            for client in self._clients:
                try:
                    client.close()
                except Exception:
                    log.debug("closing a readiness client failed", exc_info=True)
            self._clients = None

    def close(self) -> None:
        with self._lock:
            self._close()
