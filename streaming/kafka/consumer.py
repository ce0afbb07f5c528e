"""Consumer helpers: read committed records of ablab topics (tests, tools, the loader)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


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
