"""The event emitter: never blocks the caller, never loses an event.

``emit(event)`` serializes the event and puts it on a bounded in-memory queue; a
background worker hands records to an idempotent kafka-python producer (``acks=all``,
lz4, batching by ``linger_ms``/``batch_size``). When the broker is unreachable — the
producer cannot bootstrap, a send times out, or a record's delivery fails — records go to
an append-only disk :class:`~ablab.streaming.kafka.spool.Spool` instead, and so does
everything emitted after them, so order is kept. The worker then probes the broker with
back-off; once it answers, the spool is replayed oldest segment first with a fresh
producer, each segment deleted only when all its records are acknowledged, and the emitter
goes back to sending directly when the spool is empty. A full queue spills to the spool
too, so ``emit`` never waits for the network.

Guarantees and their limits (measured by tests/integration/streaming/test_emitter*.py):

- Nothing accepted by ``emit`` is lost while the process lives, nor on ``close()``
  (unsent records are spooled and replayed by the next emitter on the same spool).
- A process *killed* loses what was only in memory (the queue and the producer's
  buffer, at most ``linger_ms`` plus one delivery timeout of events); what reached the
  spool survives.
- Duplicates: the idempotent producer removes retry duplicates within one producer
  session. A record whose write reached the broker but whose acknowledgement was lost
  (broker killed at that instant) is spooled and replayed, so it may arrive twice; so may
  the records of one segment if the process dies mid-replay. Every event has an
  ``event_id`` and the loader deduplicates on it, so none is counted twice.
- The one counted loss: a record the broker can never accept (larger than
  ``max_request_size``; validated events are a few KiB at most) is dropped at replay and
  counted in ``dropped``, so it cannot wedge the spool. A disk-full spool write is
  counted there too.
- Records that were in flight when the broker failed may be spooled after a few newer
  ones (their failures arrive after the switch to spooling). Per-key order is therefore
  not strict across an outage; the pipeline orders by event time (watermarks).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ablab.platform.events import Rejection, dead_letter_record, heartbeat_record, topic_key
from ablab.streaming.kafka.spool import FsyncPolicy, Spool, SpoolRecord
from ablab.streaming.kafka.topics import DEADLETTER_TOPIC, event_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmitterConfig:
    bootstrap: str
    spool_dir: Path
    client_id: str = "ablab-emitter"
    queue_size: int = 100_000
    linger_ms: int = 20
    batch_size: int = 256 * 1024
    compression: str = "lz4"
    delivery_timeout_ms: int = 15_000
    request_timeout_ms: int = 5_000
    max_block_ms: int = 3_000
    bootstrap_timeout_ms: int = 3_000
    fsync: FsyncPolicy = "always"
    probe_backoff_s: tuple[float, float] = (0.5, 5.0)
    heartbeat_s: float = 0.0
    """Every this many seconds (0: never), while the broker is up and nothing is spooled,
    write a heartbeat record (:func:`ablab.platform.events.heartbeat_record`) to every
    partition of ``heartbeat_topic``, after the records already handed over. The stream
    job's watermark then follows this clock when requests stop, so the last windows close
    instead of waiting for the next request. Not spooled: a heartbeat is only worth
    anything now, and one sent behind spooled events would make them late."""
    heartbeat_topic: str = event_topic("inference")


class Emitter:
    """Usage: ``with Emitter(config=...) as emitter: emitter.emit(event)``."""

    def __init__(self, *, config: EmitterConfig) -> None:
        self.config = config
        self._queue: queue.Queue[SpoolRecord] = queue.Queue(maxsize=config.queue_size)
        self._spool = Spool(config.spool_dir, fsync=config.fsync)
        self._counts = {"emitted": 0, "sent": 0, "spooled": 0, "replayed": 0, "dropped": 0,
                        "rejected": 0, "send_failures": 0, "overflow_spooled": 0, "late_acks": 0, "heartbeats": 0}
        self._count_lock = threading.Lock()
        # Records handed to the producer and not yet acknowledged, by a local sequence number.
        # Whoever pops a record (ack callback, failure callback, or the worker reclaiming
        # after dropping a producer) owns it, so each is either acked or spooled, once.
        self._inflight: dict[int, SpoolRecord] = {}
        self._inflight_seq = itertools.count()
        self._producer: Any = None
        self._producer_failed = False
        self._healthy = False  # until a producer exists and the spool is empty
        self._stopping = threading.Event()
        self._next_probe = 0.0
        self._backoff = config.probe_backoff_s[0]
        self._acked_in_segment: dict[Path, set[int]] = {}
        self._next_heartbeat = 0.0
        self._worker = threading.Thread(target=self._run, name="ablab-emitter", daemon=True)
        self._worker.start()

    # -- the request path: cheap and non-blocking -----------------------------------------

    def emit(self, event: Any) -> None:
        """Queue a validated event (an ``ablab.platform.events`` model) for its topic."""
        self.emit_record(SpoolRecord(event_topic(event.type), topic_key(event), event.to_json_bytes()))

    def emit_record(self, record: SpoolRecord) -> None:
        if self._stopping.is_set():
            raise RuntimeError("emitter is closed")
        self._count("emitted")
        try:
            self._queue.put_nowait(record)
        except queue.Full:  # never block the caller: the disk takes the overflow
            self._to_spool([record])
            self._count("overflow_spooled")

    def dead_letter(self, *, raw: Any, rejection: Rejection, source: str) -> None:
        """Send a refused input with its reason to the dead-letter topic (and count it)."""
        self._count("rejected")
        self.emit_record(SpoolRecord(DEADLETTER_TOPIC, source.encode(), dead_letter_record(
            raw=raw, rejection=rejection, source=source)))

    def counters(self) -> dict[str, int | bool]:
        with self._count_lock:
            counts: dict[str, int | bool] = dict(self._counts)
        counts.update(queued=self._queue.qsize(), inflight=len(self._inflight), spool_pending=self._spool.pending,
                      corrupt_spool_lines=self._spool.corrupt_lines, broker_up=self._healthy)
        return counts

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every emitted record is acknowledged (queue, in-flight and spool empty)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queue.unfinished_tasks and not self._inflight and self._spool.empty() and self._healthy:
                return True
            time.sleep(0.05)
        return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop; whatever the broker has not acknowledged by ``timeout_s`` is left spooled."""
        if self._stopping.is_set():
            return
        self.flush(timeout_s)
        self._stopping.set()
        self._worker.join(timeout=timeout_s + 5)
        self._drop_producer()  # fails what is still buffered → spooled
        self._spool_queued(block=False)
        self._spool.close()

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker -----------------------------------------------------------------------

    def _run(self) -> None:
        if self._spool.empty() and self._connect():
            self._healthy = True  # nothing left from a previous run: send directly from the start
        while not self._stopping.is_set():
            try:
                self._step()
            except Exception:  # the worker must survive anything; records are never dropped here
                log.exception("emitter worker step failed; retrying")
                self._mark_down()
                time.sleep(0.2)

    def _step(self) -> None:
        if self._healthy and self._spool.empty():
            batch = self._drain_queue(block=True, limit=2000)
            try:
                for index, record in enumerate(batch):
                    if not self._send_direct(record):
                        self._to_spool(batch[index + 1:])  # keep order behind the failed one
                        return
            finally:
                self._queue_items_done(len(batch))
            self._heartbeat()
            return
        # Degraded: keep order by putting new records behind the spooled ones.
        self._spool_queued(block=True)
        if self._inflight and self._producer is not None:
            # kafka-python does not always expire batches of a dead broker; abort them so
            # they join the spool now rather than whenever (or never).
            self._drop_producer()
        if time.monotonic() >= self._next_probe and not self._inflight:
            self._replay()

    def _send_direct(self, record: SpoolRecord) -> bool:

        seq = next(self._inflight_seq)
        with self._count_lock:
            self._inflight[seq] = record
        try:
            future = self._producer.send(record.topic, key=record.key, value=record.value,
                                         timestamp_ms=record.timestamp_ms)
        except Exception:  # metadata unavailable within max_block_ms, or anything else: keep it
            with self._count_lock:
                self._inflight.pop(seq, None)
            self._to_spool([record])
            self._mark_down()
            return False
        future.add_callback(self._on_sent, seq)
        future.add_errback(self._on_send_failed, seq)
        return True

    def _heartbeat(self) -> None:
        """One heartbeat per partition when due: behind every record sent before it, since
        a partition's records keep the producer's order."""
        now = time.monotonic()
        if self.config.heartbeat_s <= 0 or now < self._next_heartbeat or not self._healthy or self._producer is None:
            return
        self._next_heartbeat = now + self.config.heartbeat_s
        topic = self.config.heartbeat_topic
        try:
            partitions = self._producer.partitions_for(topic)
            moment = datetime.now(UTC)
            value = heartbeat_record(moment)
            stamp = int(moment.timestamp() * 1000)
            for partition in sorted(partitions or ()):
                self._producer.send(topic, value=value, partition=partition, timestamp_ms=stamp)
        except Exception:  # a missed heartbeat delays a window by one interval; never fail the worker
            log.debug("heartbeat to %s failed", topic, exc_info=True)
            return
        self._count("heartbeats")

    # kafka-python calls callbacks as f(*args, result): our seq comes first.
    def _on_sent(self, seq: int, _metadata: Any) -> None:
        with self._count_lock:
            owned = self._inflight.pop(seq, None) is not None
            # not owned: reclaimed into the spool already, so it will arrive twice
            self._counts["sent" if owned else "late_acks"] += 1

    def _on_send_failed(self, seq: int, error: Exception) -> None:
        # Runs on the producer's I/O thread. Unhealthy first, so flush() cannot see an empty
        # in-flight set and spool while this record moves from one to the other.
        was_healthy, self._healthy = self._healthy, False
        self._producer_failed = True
        with self._count_lock:
            record = self._inflight.pop(seq, None)
            self._counts["send_failures"] += 1
        if record is not None:
            self._to_spool([record])
        if was_healthy:  # once per outage, not once per record
            log.warning("delivery failed (%s); spooling until the broker returns", error)

    def _replay(self) -> None:
        """Drain the spool oldest-first with a fresh producer; go healthy when it is empty."""
        from kafka.errors import KafkaError

        if self._producer_failed:
            self._drop_producer()  # a fresh producer session after delivery failures
        if self._producer is None and not self._connect():
            return
        self._spool.seal()
        for path in self._spool.sealed_segments():
            records = self._spool.read_segment(path)
            acked = self._acked_in_segment.setdefault(path, set())
            futures = []
            try:
                for index, record in enumerate(records):
                    if index in acked:
                        continue
                    try:
                        futures.append((index, self._producer.send(
                            record.topic, key=record.key, value=record.value, timestamp_ms=record.timestamp_ms)))
                    except KafkaError as exc:
                        if not _is_poison(exc):
                            raise
                        log.error("dropping spooled record for %s: %s", record.topic, exc)
                        acked.add(index)
                        self._count("dropped")
                self._producer.flush(timeout=self.config.delivery_timeout_ms / 1000 + 5)
            except KafkaError as exc:
                log.warning("replay interrupted (%s); will retry", exc)
            for index, future in futures:
                if future.is_done and future.succeeded():
                    acked.add(index)
                elif future.is_done and _is_poison(future.exception):
                    # the broker will never take it (e.g. too large): retrying would wedge the spool
                    log.error("dropping spooled record for %s: %s", records[index].topic, future.exception)
                    acked.add(index)
                    self._count("dropped")
            if len(acked) < len(records):
                self._mark_down()
                return
            self._spool.delete_segment(path, records=len(records))
            self._acked_in_segment.pop(path, None)
            self._count("replayed", len(records))
            if self._stopping.is_set():
                return
            self._spool_queued(block=False)  # keep new arrivals behind
        if self._spool.empty():
            self._healthy = True
            self._backoff = self.config.probe_backoff_s[0]
        else:
            self._next_probe = 0.0  # more arrived while replaying: seal and continue next step

    def _connect(self) -> bool:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        try:
            self._producer = KafkaProducer(
                bootstrap_servers=self.config.bootstrap,
                client_id=self.config.client_id,
                acks="all",
                enable_idempotence=True,
                compression_type=self.config.compression,
                linger_ms=self.config.linger_ms,
                batch_size=self.config.batch_size,
                delivery_timeout_ms=self.config.delivery_timeout_ms,
                request_timeout_ms=self.config.request_timeout_ms,
                max_block_ms=self.config.max_block_ms,
                bootstrap_timeout_ms=self.config.bootstrap_timeout_ms,
                allow_auto_create_topics=False,
                reconnect_backoff_max_ms=1000,
            )
        except (KafkaError, OSError) as exc:
            log.info("broker %s unreachable (%s); events are spooled", self.config.bootstrap, exc)
            self._producer = None
            self._schedule_probe()
            return False
        return True

    def _mark_down(self) -> None:
        """A failure: drop the producer (its unacked records fail into the spool), back off."""
        self._healthy = False
        self._drop_producer()
        self._schedule_probe()

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        self._producer_failed = False
        if producer is not None:
            _force_close(producer)
        with self._count_lock:  # whatever the producer did not resolve is ours to spool
            leftovers = [self._inflight.pop(seq) for seq in sorted(self._inflight)]
        self._to_spool(leftovers)

    def _schedule_probe(self) -> None:
        self._next_probe = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.probe_backoff_s[1])

    def _spool_queued(self, *, block: bool) -> None:
        batch = self._drain_queue(block=block, limit=None)
        try:
            self._to_spool(batch)
        finally:
            self._queue_items_done(len(batch))

    def _queue_items_done(self, n: int) -> None:
        """Items taken off the queue are now in flight or on disk; flush() counts on this."""
        for _ in range(n):
            self._queue.task_done()

    def _drain_queue(self, *, block: bool, limit: int | None, wait_s: float = 0.05) -> list[SpoolRecord]:
        items: list[SpoolRecord] = []
        if block:
            try:
                items.append(self._queue.get(timeout=wait_s))
            except queue.Empty:
                return items
        while limit is None or len(items) < limit:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _to_spool(self, records: list[SpoolRecord]) -> None:
        if not records:
            return
        try:
            self._spool.append_many(records)
        except OSError:  # disk full or gone: the one way to lose data; count it loudly
            log.exception("could not spool %d records", len(records))
            self._count("dropped", len(records))
            return
        self._count("spooled", len(records))

    def _count(self, name: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[name] += n


def _is_poison(error: BaseException | None) -> bool:
    """Errors that no retry can fix; connection trouble and timeouts are not among them."""
    from kafka import errors

    too_large = tuple(getattr(errors, name) for name in ("MessageSizeTooLargeError", "RecordTooLargeError",
                                                         "RecordListTooLargeError") if hasattr(errors, name))
    return error is not None and isinstance(error, too_large)


def _force_close(producer: Any) -> None:
    """Close now; records still buffered fail (their errbacks spool them).

    kafka-python's ``close(timeout=0)`` flushes first and raises when records are pending,
    leaving the producer open; its sender's ``force_close`` is the documented-in-code way
    to abort the pending batches.
    """
    from kafka.errors import KafkaTimeoutError

    try:
        producer.close(timeout=0)
        return
    except KafkaTimeoutError:
        pass
    except Exception:  # a producer whose broker is gone may raise anything on close
        log.debug("closing the producer failed", exc_info=True)
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(10)
    try:
        producer.close(timeout=0)
    except Exception:
        log.debug("closing the producer after force_close failed", exc_info=True)


def emitter_from_settings(*, name: str = "default", settings: Any = None, **overrides: Any) -> Emitter:
    """An emitter on ``ABLAB_KAFKA_BOOTSTRAP`` spooling to ``ABLAB_HOME/spool/<name>``."""
    from ablab.platform.config import get_settings

    settings = settings or get_settings()
    return Emitter(config=EmitterConfig(bootstrap=settings.kafka_bootstrap, spool_dir=settings.home / "spool" / name,
                                        client_id=f"ablab-{name}", **overrides))
