"""Topic names and layout: the one place that names them.

Layout: one typed topic per event type (``ablab.<type>``), keyed by ``trace_id``. Typed
topics give the Flink job one source table per type with a fixed schema (no filtering by
``type`` in SQL, no sparse columns) and let the loader write each table from its own
topic. Keying by ``trace_id`` with the same partition count everywhere puts all records
of one request in the same partition number of every topic, which keeps the trace_id
joins local if the job ever runs with parallelism equal to the partitions.

- ``ablab.exposure|inference|rum|feedback|cost``: validated events (JSON, schema in
  ``ablab.platform.events``), 3 partitions each.
- ``ablab.windows``: the Flink job's 10 s window rows (written transactionally).
- ``ablab.deadletter``: refused inputs with their reason
  (:func:`ablab.platform.events.dead_letter_record`).

Replication follows the cluster: on three or more brokers every topic gets replication
factor 3 and ``min.insync.replicas`` 2 (one broker may die without losing an acknowledged
write or refusing ``acks=all`` producers); on fewer, as many replicas as brokers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ablab.platform.events import EVENT_TYPES

PREFIX = "ablab."
WINDOWS_TOPIC = "ablab.windows"
DEADLETTER_TOPIC = "ablab.deadletter"
RAW_PARTITIONS = 3


def event_topic(event_type: str) -> str:
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}; one of {list(EVENT_TYPES)}")
    return PREFIX + event_type


EVENT_TOPICS: dict[str, str] = {t: PREFIX + t for t in EVENT_TYPES}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: tuple[tuple[str, str], ...] = ()


TOPICS: tuple[TopicSpec, ...] = (
    *(TopicSpec(name, RAW_PARTITIONS) for name in EVENT_TOPICS.values()),
    TopicSpec(WINDOWS_TOPIC, RAW_PARTITIONS),
    # Dead letters are for people to read: keep them a week, one partition keeps order.
    TopicSpec(DEADLETTER_TOPIC, 1, (("retention.ms", str(7 * 24 * 3600 * 1000)),)),
)


def replication_for(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a cluster of ``brokers``."""
    replication = max(1, min(3, brokers))
    return replication, 2 if replication >= 3 else 1


def create_topics(*, bootstrap: str, specs: tuple[TopicSpec, ...] = TOPICS, timeout_s: float = 30.0,
                  replication: int | None = None) -> list[str]:
    """Create the topics that do not exist yet; return the names created. Idempotent.

    ``replication`` defaults to :func:`replication_for` the brokers the cluster reports."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="ablab-admin",
                             request_timeout_ms=int(timeout_s * 1000))
    try:
        existing = set(admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            brokers = len(admin.describe_cluster()["brokers"]) if replication is None else replication
            factor, min_isr = replication_for(brokers)
            base = {"min.insync.replicas": str(min_isr)} if factor > 1 else {}
            try:
                admin.create_topics(
                    [NewTopic(s.name, s.partitions, factor, topic_configs={**base, **dict(s.config)}) for s in missing],
                    timeout_ms=int(timeout_s * 1000),
                )
            except TopicAlreadyExistsError:  # a concurrent creator won the race
                pass
        _wait_for_leaders(admin, [s.name for s in specs], deadline=time.monotonic() + timeout_s)
        return [s.name for s in missing]
    finally:
        admin.close()


def _wait_for_leaders(admin, names: list[str], *, deadline: float) -> None:
    """Wait until every partition of the topics has a leader, so the first send succeeds."""
    while True:
        described = admin.describe_topics(names)
        ready = all(
            t.get("error_code", 0) == 0 and t["partitions"] and all(p.get("leader_id", p.get("leader", -1)) >= 0 for p in t["partitions"])
            for t in described
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics without partition leaders: {names}")
        time.sleep(0.2)
