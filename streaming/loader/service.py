"""The Kafka → ClickHouse loader.

Reads the typed raw-event topics and the Flink job's windows topic with
``isolation_level=read_committed`` (rows of an aborted Flink transaction are never seen),
batches the rows per table, inserts them, and only then commits the consumer offsets.
A crash between insert and commit redelivers the batch; the tables are
ReplacingMergeTrees keyed by ``event_id`` / the window key, so the second copy replaces
the first and queries (``FINAL``) count it once: at-least-once delivery, exactly-once
effect. Before the commit it also feeds the per-unit rollup (``unit_stats``) by
recomputing the units the batch touched (:mod:`ablab.streaming.store.rollup`), so a
replay rewrites the same values there too.

The recompute rewrites a unit from its whole history, so its cost is per touched unit and
per statement, not per event: recomputing after every batch paid it again for a unit seen
in each batch. A busy loader therefore stores several batches (rows, lookups, label
placements) and recomputes the union of their units once, at a *checkpoint*, every
``rollup_interval_s`` or as soon as a poll finds nothing new (caught up), and commits the
offsets only then. What a crash loses before a checkpoint is uncommitted and replayed, as
before. ``rollup_interval_s=0`` checkpoints after every batch.

Refused records (malformed JSON, wrong types, unknown experiment, oversized, values the
store cannot aggregate, event times beyond the bound) are written to the dead-letter topic
with their reason, stored in ``dead_letters`` and counted in :class:`LoaderStats`; the
loader keeps going.

One row never fails a batch. When an insert (or the rollup recompute) fails and the store
still answers ``SELECT 1``, the batch is split in halves and each half stored on its own,
down to single rows; a row that fails alone is removed again from ``raw_events`` and the
rollup's lookup tables (so the rollup of its unit is not poisoned), dead-lettered with
ClickHouse's message and counted, and the rest of the batch is stored and committed. A
checkpoint's recompute that fails on data cannot name its row, so the loader rewinds to its
last commit and replays that stretch one batch per checkpoint, where the split above finds
the row (``LoaderStats.rollup_replays``). When the store does not answer, the
failure is the store's: the same batch (never more) is retried with backoff, nothing new is
polled meanwhile, and ``LoaderStats.consecutive_failures`` makes ``/readyz`` fail.

chDB allows one process per data directory, so in embedded mode the API process runs
``Loader(client, bootstrap).run(stop_event)`` in a background thread; ``ablab loader`` runs
it as its own process against a ClickHouse server.

Several loaders in one consumer group give exactly the result of one. Every event topic is
keyed by ``trace_id`` with the same partition count, and the group uses the range assignor,
which hands a member the same partition numbers of every topic: a trace's request, labels,
RUM and bill are read by one loader, in order, so a label is placed at its unit by the loader
that also loads (or has loaded) its request. A rebalance moves a partition number of every
topic at once; what the old owner had not committed is replayed by the new one, and every
write is idempotent. Units are shared between loaders (one unit's traces hash to several
partitions): each recompute rewrites the unit's whole row from the stored events, and the
newest computation, which started last and so saw the most, wins.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ablab.platform.events import Rejection, dead_letter_record
from ablab.streaming.kafka.consumer import FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES
from ablab.streaming.kafka.topics import DEADLETTER_TOPIC, EVENT_TOPICS, WINDOWS_TOPIC
from ablab.streaming.loader.rows import DEFAULT_MAX_FUTURE_S, HEARTBEAT, RAW_COLUMNS, TABLE_COLUMNS, Routed, route

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)
_BOOTSTRAP_TIMEOUT_MS = 3_000
# A consumer that joined its group while its topics were still being created can keep an
# empty assignment ("No partition metadata for topic") although later metadata shows the
# partitions: seen in CI as loaders that read nothing for minutes. Until a consumer has had
# partitions once, it re-subscribes (a fresh group join) after this long, then backs off.
_REJOIN_AFTER_S = 10.0
_REJOIN_MAX_S = 300.0
DEFAULT_TOPICS = (*EVENT_TOPICS.values(), WINDOWS_TOPIC)
_LAG_REFRESH_S = 5.0  # end offsets are a broker round trip; the lag gauge need not be fresher
_RAW_TYPE = RAW_COLUMNS.index("type")
_RAW_EVENT_ID = RAW_COLUMNS.index("event_id")


@dataclass
class LoaderStats:
    """Counters since start (read by /metrics, /readyz and the CLI)."""

    consumed: int = 0
    batches: int = 0
    loaded: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    last_flush_at: float | None = None
    """Wall-clock time of the last checkpoint (the last commit)."""
    rollup_units: int = 0
    failures: int = 0
    """Batches that could not be stored (the store did not answer); each is retried as is."""
    consecutive_failures: int = 0
    last_error: str | None = None
    bisections: int = 0
    """Batches split because some row of them failed to store."""
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) → next offset committed (what tests and the lag gauge wait on)."""
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) → records between the committed offset and the partition's end."""
    restarts: int = 0
    """Times :meth:`Loader.supervise` reconnected after the consume loop failed."""
    checkpoints: int = 0
    """Recompute-and-commit points (each covers one batch or several)."""
    rollup_replays: int = 0
    """Times a checkpoint's recompute failed on data and the stretch was replayed batch by batch."""
    heartbeats: int = 0
    """Heartbeat records read (the edge's clock for the stream job; nothing stored)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "consumed": self.consumed,
            "batches": self.batches,
            "loaded": dict(self.loaded),
            "dead_lettered": dict(self.dead_lettered),
            "dead_lettered_total": sum(self.dead_lettered.values()),
            "rollup_units": self.rollup_units,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "restarts": self.restarts,
            "checkpoints": self.checkpoints,
            "rollup_replays": self.rollup_replays,
            "heartbeats": self.heartbeats,
            "last_error": self.last_error,
            "bisections": self.bisections,
            "last_flush_at": self.last_flush_at,
            "lag_total": sum(self.lag.values()),
        }


@dataclass(frozen=True)
class _DeadLetter:
    topic: str
    partition: int
    offset: int
    rejection: Rejection
    raw: bytes | None


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a pending row came from, to dead-letter it if it alone fails to store."""

    topic: str
    partition: int
    offset: int
    raw: bytes


class StoreUnavailable(RuntimeError):
    """The store did not answer: the batch is kept and retried, not split."""


class _RecomputeRefused(RuntimeError):
    """A checkpoint's recompute failed while the store answers: some row of the stretch."""


class Loader:
    """Consume, batch, insert, commit; see the module docstring."""

    def __init__(
        self,
        client: Client,
        bootstrap: str,
        *,
        group_id: str = "ablab-loader",
        topics: Iterable[str] = DEFAULT_TOPICS,
        windows_topic: str = WINDOWS_TOPIC,
        deadletter_topic: str = DEADLETTER_TOPIC,
        batch_max_records: int = 20_000,
        batch_max_s: float = 0.5,
        known_experiments: Callable[[], Collection[str]] | None = None,
        known_experiments_refresh_s: float = 10.0,
        rollup: bool = True,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
        retry_max_s: float = 30.0,
        batch_lock: AbstractContextManager[Any] | None = None,
        rollup_interval_s: float = 5.0,
        rollup_max_units: int = 200_000,
        fetch_min_bytes: int = FETCH_MIN_BYTES,
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
    ) -> None:
        self.client = client
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topics = tuple(topics)
        self.windows_topic = windows_topic
        self.deadletter_topic = deadletter_topic
        self.batch_max_records = batch_max_records
        self.batch_max_s = batch_max_s
        self.stats = LoaderStats()
        self.rollup = rollup
        self._known_experiments = known_experiments
        self._known_refresh_s = known_experiments_refresh_s
        self._known: Collection[str] | None = None
        self._known_at = 0.0
        self.max_future_s = max_future_s
        self.retry_max_s = retry_max_s
        self._pending: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self._origins: dict[str, list[_Origin]] = defaultdict(list)
        self._lag_at = 0.0
        self._dead: list[_DeadLetter] = []
        self._pending_count = 0
        self._consumer: Any = None
        self._producer: Any = None
        # Serializes this loader's batches with results reads in the same process (embedded
        # mode); loaders in other processes share nothing but the store.
        self._batch_lock = batch_lock
        self._checked_partitions = False
        self.rollup_interval_s = rollup_interval_s
        self.rollup_max_units = rollup_max_units
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        # units stored since the last checkpoint, still to recompute (see the module docstring)
        self._dirty: dict[str, set[str]] = defaultdict(set)
        self._uncommitted = False
        self._checkpoint_at = time.monotonic()
        # after a refused checkpoint recompute: positions until which every batch is its own checkpoint
        self._per_batch_until: dict[Any, int] = {}

    # --- lifecycle -------------------------------------------------------------------

    def _connect(self) -> None:
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        consumer = KafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=f"{self.group_id}-consumer",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=self.batch_max_records,
            fetch_max_bytes=32 * 1024 * 1024,
            fetch_min_bytes=self.fetch_min_bytes,  # fewer, fuller fetches (see FETCH_MIN_BYTES)
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            # Fail fast when the broker is away: the supervisor retries with backoff, and a
            # 30 s blocking bootstrap (the default) made the API's shutdown wait for it.
            bootstrap_timeout_ms=_BOOTSTRAP_TIMEOUT_MS,
            # A consumer that subscribes while its topics are still being created gets an
            # empty assignment ("No partition metadata") and, with the 5-minute default,
            # would not look again for minutes: refresh metadata every few seconds.
            metadata_max_age_ms=5_000,
            # the same partition numbers of every topic to one member (see the module docstring)
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, client_id=f"{self.group_id}-deadletter",
                                     acks="all", linger_ms=20, bootstrap_timeout_ms=_BOOTSTRAP_TIMEOUT_MS)
        except Exception:
            consumer.close()
            raise
        self._consumer, self._producer = consumer, producer

    def close(self) -> None:
        for handle in (self._consumer, self._producer):
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # closing after a broker loss must not mask the real error
                    log.exception("closing a Kafka handle failed")
        self._consumer = self._producer = None

    def run(self, stop_event: threading.Event, *, idle_exit_s: float | None = None) -> LoaderStats:
        """Load until ``stop_event`` is set (or, with ``idle_exit_s``, after that long with no records)."""
        if self._consumer is None:
            self._connect()
        # A fresh consumer re-reads from the committed offsets: what an earlier run had
        # pending (or stored since its last checkpoint) is delivered again.
        self._discard_uncommitted()
        last_record_at = time.monotonic()
        batch_started = time.monotonic()
        never_assigned, rejoin_at, rejoin_wait = True, time.monotonic() + _REJOIN_AFTER_S, _REJOIN_AFTER_S
        # longer than a fetch the broker may hold: an empty poll then means nothing had arrived
        # (caught up), not that the fetch was still on its way
        poll_ms = max(200, self.fetch_max_wait_ms + 100)
        try:
            while not stop_event.is_set():
                got = self.poll_once(timeout_ms=poll_ms)
                now = time.monotonic()
                if never_assigned:
                    if self._consumer.assignment():
                        never_assigned = False
                        self._check_partition_counts()
                    elif now >= rejoin_at:
                        self._rejoin()
                        rejoin_wait = min(2 * rejoin_wait, _REJOIN_MAX_S)
                        rejoin_at = now + rejoin_wait
                if got or not self._consumer.assignment():
                    # Idle means "assigned and nothing came": a group (re)join after a
                    # crashed predecessor can take seconds on a busy machine.
                    last_record_at = now
                if self._pending_count or self._dead:
                    if self._pending_count + len(self._dead) >= self.batch_max_records or now - batch_started >= self.batch_max_s:
                        self._flush_until_stored(stop_event, checkpoint=self._checkpoint_due(now, caught_up=not got))
                        batch_started = time.monotonic()
                else:
                    batch_started = now
                    if self._uncommitted and not got:  # caught up: make what is stored visible and committed
                        self._flush_until_stored(stop_event, checkpoint=True)
                        self._lag_at = now
                        self._update_lag()  # caught up and committed: the lag this moment is the true one
                if now - self._lag_at >= _LAG_REFRESH_S:  # idle too: lag grows while nothing is polled
                    self._lag_at = now
                    self._update_lag()
                if idle_exit_s is not None and now - last_record_at >= idle_exit_s:
                    break
            self._flush_until_stored(stop_event)
            self._update_lag()
        finally:
            self.close()
        return self.stats

    def supervise(self, stop_event: threading.Event, *, max_delay_s: float = 30.0) -> LoaderStats:
        """Run until ``stop_event`` is set, reconnecting with backoff when the loop fails.

        A broker that goes away, a rebalance that fails a commit, a coordinator that moves:
        each ends one :meth:`run` with an exception; the next run re-reads from the committed
        offsets, so nothing is lost and (idempotent writes) nothing is counted twice.
        """
        delay = 1.0
        while not stop_event.is_set():
            try:
                self.run(stop_event)
                delay = 1.0
            except Exception as exc:
                self.stats.restarts += 1
                self.stats.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                log.warning("loader stopped (%s); reconnecting in %.0f s", self.stats.last_error, delay)
                stop_event.wait(delay)
                delay = min(delay * 2, max_delay_s)
        return self.stats

    def _checkpoint_due(self, now: float, *, caught_up: bool) -> bool:
        """Whether the batch being flushed ends with a recompute and a commit."""
        if not self.rollup or self.rollup_interval_s <= 0 or caught_up or self._replaying():
            return True
        return (now - self._checkpoint_at >= self.rollup_interval_s
                or sum(map(len, self._dirty.values())) >= self.rollup_max_units)

    def _replaying(self) -> bool:
        if not self._per_batch_until:
            return False
        try:
            behind = any(self._consumer.position(tp) < end for tp, end in self._per_batch_until.items()
                         if tp in self._consumer.assignment())
        except Exception:
            behind = False
        if not behind:
            self._per_batch_until = {}
        return behind

    def _flush_until_stored(self, stop_event: threading.Event, *, checkpoint: bool = True) -> None:
        """Flush; while the store is away retry the same batch with backoff (nothing new is polled)."""
        wait = 0.5
        while True:
            try:
                self._flush(checkpoint=checkpoint)
                return
            except StoreUnavailable as exc:
                log.warning("loader: the store is unavailable (%s); retrying the same batch in %.1f s", exc, wait)
                if stop_event.wait(wait):
                    raise
                wait = min(2 * wait, self.retry_max_s)

    def _discard_pending(self) -> None:
        self._pending.clear()
        self._origins.clear()
        self._dead = []
        self._pending_count = 0

    def _discard_uncommitted(self) -> None:
        """Forget what was stored since the last commit (it is read and stored again)."""
        self._discard_pending()
        self._dirty.clear()
        self._uncommitted = False

    def _rejoin(self) -> None:
        """Re-subscribe when the topics have partitions but this consumer got none."""
        missing = [t for t in self.topics if not self._consumer.partitions_for_topic(t)]
        if missing:
            log.info("loader: topics %s have no partitions yet; waiting", missing)
            return
        log.warning("loader: no partitions assigned although %s exist; re-joining the group", ", ".join(self.topics))
        self._consumer.unsubscribe()
        self._consumer.subscribe(list(self.topics))

    # --- one step --------------------------------------------------------------------

    def poll_once(self, *, timeout_ms: int = 200) -> int:
        """Poll one set of records into the pending batch; return how many arrived."""
        if self._consumer is None:
            self._connect()
        polled = self._consumer.poll(timeout_ms=timeout_ms, max_records=self.batch_max_records)
        known = self._known_now()
        now = datetime.now(UTC)
        count = 0
        for partition, records in polled.items():
            for record in records:
                count += 1
                routed = route(topic=partition.topic, value=record.value, partition=partition.partition,
                               offset=record.offset, windows_topic=self.windows_topic, known_experiments=known,
                               now=now, max_future_s=self.max_future_s)
                if routed is HEARTBEAT:
                    # nothing to store, but its offset is consumed: the next checkpoint
                    # commits past it (else a quiet stream's lag grew by the heartbeats)
                    self.stats.heartbeats += 1
                    self._uncommitted = True
                elif isinstance(routed, Routed):
                    self._pending[routed.table].append(routed.row)
                    self._origins[routed.table].append(_Origin(partition.topic, partition.partition, record.offset,
                                                               record.value))
                    self._pending_count += 1
                else:
                    self._dead.append(_DeadLetter(partition.topic, partition.partition, record.offset, routed, record.value))
        self.stats.consumed += count
        return count

    def flush(self) -> None:
        """Store the pending rows (splitting around rows that fail alone), dead-letter the
        refused ones, recompute the rollup of every unit stored since the last checkpoint,
        then commit offsets. Raises :class:`StoreUnavailable` (batch kept)."""
        self._flush(checkpoint=True)

    def _flush(self, *, checkpoint: bool) -> None:
        if not self._pending_count and not self._dead and not (checkpoint and self._uncommitted):
            return
        from ablab.streaming.store import rollup

        refused: list[_DeadLetter] = []  # this attempt's only: a retried batch must not add them twice
        per_batch = checkpoint and not self._uncommitted  # this batch alone: the split can blame a row
        try:
            with self._batch_lock or rollup.batch_lock:  # a results read in this process sees whole batches only
                for table, rows in self._pending.items():
                    if rows:
                        self._store(table, rows, self._origins[table], refused, recompute=per_batch)
                if checkpoint and not per_batch:
                    self._recompute_dirty()
            if self._dead or refused:
                self._write_dead_letters([*self._dead, *refused])
            if checkpoint:
                self._commit()
        except _RecomputeRefused as exc:
            self._rewind(exc)
            return
        except Exception as exc:
            self._failed(exc)
            raise
        had = bool(self._pending_count or self._dead)
        if checkpoint:
            self._discard_uncommitted()
            self._checkpoint_at = time.monotonic()
            self.stats.checkpoints += 1
            self.stats.last_flush_at = time.time()
        else:
            self._discard_pending()
            self._uncommitted = True
        if had:
            self.stats.batches += 1
        self.stats.consecutive_failures = 0

    def _recompute_dirty(self) -> None:
        from ablab.streaming.store import rollup

        if not self._dirty:
            return
        try:
            recomputed = rollup.recompute_touched(self.client, self._dirty)
        except Exception as exc:
            self._check_store(exc)
            raise _RecomputeRefused(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc
        self.stats.rollup_units += sum(recomputed.values())

    def _rewind(self, exc: _RecomputeRefused) -> None:
        """Replay from the last commit, one checkpoint per batch, so the split finds the row."""
        consumer = self._consumer
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        for tp in positions:
            committed = consumer.committed(tp)
            if committed is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        self._per_batch_until = {tp: p for tp, p in positions.items() if p is not None}
        self._discard_uncommitted()
        self.stats.rollup_replays += 1
        log.warning("loader: a checkpoint's rollup recompute failed on data (%s); replaying from the last commit "
                    "batch by batch to find the row", exc)

    def _failed(self, exc: BaseException) -> None:
        self.stats.failures += 1
        self.stats.consecutive_failures += 1
        self.stats.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"

    def _store(self, table: str, rows: list[tuple[Any, ...]], origins: list[_Origin], refused: list[_DeadLetter],
               *, recompute: bool = True) -> None:
        """Insert ``rows`` (and feed the rollup for raw events); on a data error, bisect."""
        try:
            self._insert(table, rows, recompute=recompute)
            return
        except Exception as exc:
            error = exc
        self._check_store(error)
        if len(rows) == 1:
            refused.append(self._refuse_stored_row(table, rows[0], origins[0], error))
            return
        self.stats.bisections += 1
        middle = len(rows) // 2
        self._store(table, rows[:middle], origins[:middle], refused, recompute=recompute)
        self._store(table, rows[middle:], origins[middle:], refused, recompute=recompute)

    def _insert(self, table: str, rows: list[tuple[Any, ...]], *, recompute: bool = True) -> None:
        from ablab.streaming.store import rollup

        self.client.insert(table, rows, column_names=list(TABLE_COLUMNS[table]))
        if table == "raw_events" and self.rollup:
            # after the raw insert, before the commit: a replay recomputes the same unit rows
            touched = rollup.place(self.client, rows)
            if recompute:
                self.stats.rollup_units += sum(rollup.recompute_touched(self.client, touched).values())
            else:
                for exp, units in touched.items():
                    self._dirty[exp] |= units
        self.stats.loaded[table] += len(rows)

    def _check_store(self, error: BaseException) -> None:
        try:
            self.client.query("SELECT 1")
        except Exception as probe:
            raise StoreUnavailable(f"{type(error).__name__}: {str(error)[:200]} (and SELECT 1 failed: {probe})") from error

    def _refuse_stored_row(self, table: str, row: tuple[Any, ...], origin: _Origin, error: BaseException) -> _DeadLetter:
        """A row that failed on its own: take it out of raw_events again (its unit's rollup
        would fail on every later batch), then dead-letter it with the store's reason."""
        if table == "raw_events":
            params = {"type": row[_RAW_TYPE], "event_id": row[_RAW_EVENT_ID]}
            self.client.command("DELETE FROM raw_events WHERE type = {type:String} AND event_id = {event_id:String}",
                                parameters=params)
            if self.rollup:  # a copy placed before the recompute failed would fail every later one
                for lookup in ("rollup_events", "rollup_traces", "rollup_labels"):
                    self.client.command(f"DELETE FROM {lookup} WHERE event_id = {{event_id:String}}", parameters=params)
        message = f"{table}: {type(error).__name__}: {' '.join(str(error).split())[:400]}"
        return _DeadLetter(origin.topic, origin.partition, origin.offset, Rejection("$store", message), origin.raw)

    def _check_partition_counts(self) -> None:
        """Warn once when the event topics' partition counts differ: a trace's events could
        then reach different loaders of the group, and a label could miss its unit."""
        if self._checked_partitions:
            return
        self._checked_partitions = True
        counts = {t: len(self._consumer.partitions_for_topic(t) or ()) for t in self.topics if t != self.windows_topic}
        if len(set(counts.values())) > 1:
            log.warning("loader: event topics have different partition counts %s; run one loader per group, "
                        "or give every event topic the same count (ablab kafka topics)", counts)

    def _commit(self) -> None:
        self._consumer.commit()  # commits every assigned partition's consumed position
        for tp in self._consumer.assignment():
            position = self._consumer.position(tp)
            if position is not None:
                self.stats.committed[(tp.topic, tp.partition)] = position

    def _update_lag(self) -> None:
        """Records between each assigned partition's committed offset and its end (consumer lag)."""
        try:
            partitions = list(self._consumer.assignment())
            if not partitions:
                return
            ends = self._consumer.end_offsets(partitions)
        except Exception:
            log.debug("loader: end offsets unavailable", exc_info=True)
            return
        for tp, end in ends.items():
            key = (tp.topic, tp.partition)
            self.stats.lag[key] = max(0, int(end) - self.stats.committed.get(key, 0))

    def _write_dead_letters(self, dead: list[_DeadLetter]) -> None:
        rows = []
        for item in dead:
            self._producer.send(self.deadletter_topic, dead_letter_record(
                raw=item.raw if item.raw is not None else b"", rejection=item.rejection, source=f"loader:{item.topic}"))
            raw_text = (item.raw or b"")[:8192].decode("utf-8", errors="replace")
            rows.append((item.topic, item.partition, item.offset, item.rejection.field, item.rejection.message, raw_text))
            self.stats.dead_lettered[item.rejection.field] += 1
            log.warning("dead-lettered %s[%d]@%d: %s: %s", item.topic, item.partition, item.offset,
                        item.rejection.field, item.rejection.message)
        self._producer.flush(timeout=30)
        self.client.insert("dead_letters", rows,
                           column_names=["topic", "kafka_partition", "kafka_offset", "field", "message", "raw"])

    def _known_now(self) -> Collection[str] | None:
        if self._known_experiments is None:
            return None
        now = time.monotonic()
        if self._known is None or now - self._known_at >= self._known_refresh_s:
            self._known = frozenset(self._known_experiments())
            self._known_at = now
        return self._known
