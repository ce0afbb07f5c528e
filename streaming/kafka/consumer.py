"""Consumer helpers: read committed records of ablab topics (tests, tools, the loader)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

FETCH_MIN_BYTES = 256 * 1024
FETCH_MAX_WAIT_MS = 200
"""How the pipeline's consumers (the Flink job's source, the loader) fetch: the broker answers
once it holds ``FETCH_MIN_BYTES`` for the consumer, or after ``FETCH_MAX_WAIT_MS``. Kafka's
default (1 byte) answers at once, so a consumer that keeps up fetches a few records at a time
and pays a request per few records. At 10,000 events/s on the 2-core box this cut the job's
CPU per event by about 15 µs and the broker's by about 10 µs, and a loader that keeps up with
slack (one that only validates) from 64 to 34 µs (docs/benchmarks/pipeline.md). It adds at
most 200 ms to a record's path; windows are 10 s and the loader's batches 0.5 s."""


def make_consumer(*, bootstrap: str, group_id: str | None = None, client_id: str = "ablab-consumer", **overrides: Any):
    """A ``read_committed`` consumer with manual commits (the caller commits after it stores)."""
    from kafka import KafkaConsumer

    config: dict[str, Any] = dict(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        client_id=client_id,
        isolation_level="read_committed",  # never see aborted transactional writes (Flink's sink)
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=5000,
    )
    config.update(overrides)
    return KafkaConsumer(**config)


def read_topics(
    *, bootstrap: str, topics: Iterable[str], expected: int | None = None, timeout_s: float = 30.0,
    idle_s: float = 3.0,
) -> list[Any]:
    """Every committed record of ``topics`` from the beginning (no consumer group).

    Stops when ``expected`` records arrived, or after ``idle_s`` without a new record, or
    at ``timeout_s``.
    """
    from kafka import TopicPartition

    consumer = make_consumer(bootstrap=bootstrap)
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline, last_new = time.monotonic() + timeout_s, time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500)
            for part in batch.values():
                records.extend(part)
            if batch:
                last_new = time.monotonic()
            if expected is not None and len(records) >= expected:
                # keep polling briefly so duplicates beyond `expected` are seen too
                if time.monotonic() - last_new > 1.0:
                    break
            elif expected is None and time.monotonic() - last_new > idle_s:
                break
        return records
    finally:
        consumer.close()
