"""A whole pipeline on one machine, for the integration tests and the benchmarks.

Real components only: the caller's Kafka broker, the job in a local mini-cluster child
process (:class:`~ablab.streaming.flink.local.FlinkProcess`), the loader in a thread of
this process writing to a chDB store. Topics get a unique prefix so runs sharing one
broker do not see each other's records.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablab.streaming.flink.job import JobConfig
from ablab.streaming.flink.local import FlinkProcess
from ablab_testing import wait_for


@dataclass(frozen=True)
class PipelineTopics:
    prefix: str

    @property
    def inference(self) -> str:
        return f"{self.prefix}.inference"

    @property
    def rum(self) -> str:
        return f"{self.prefix}.rum"

    @property
    def feedback(self) -> str:
        return f"{self.prefix}.feedback"

    @property
    def windows(self) -> str:
        return f"{self.prefix}.windows"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"

    @property
    def raw(self) -> tuple[str, str, str]:
        return (self.inference, self.rum, self.feedback)

    def create(self, *, bootstrap: str, partitions: int = 3) -> None:
        from ablab.streaming.kafka.topics import TopicSpec, create_topics

        create_topics(bootstrap=bootstrap, specs=tuple(
            [TopicSpec(name, partitions) for name in (*self.raw, self.windows)] + [TopicSpec(self.deadletter, 1)]
        ))

    @classmethod
    def unique(cls, label: str = "t") -> PipelineTopics:
        return cls(f"{label}-{uuid.uuid4().hex[:8]}")


def job_config(topics: PipelineTopics, *, bootstrap: str, checkpoint_dir: Path, **overrides: Any) -> JobConfig:
    values: dict[str, Any] = dict(
        bootstrap=bootstrap, inference_topic=topics.inference,
        windows_topic=topics.windows, group_id=f"{topics.prefix}-flink", checkpoint_dir=checkpoint_dir,
        transactional_id_prefix=f"{topics.prefix}-tx", checkpoint_interval_s=2.0,
    )
    values.update(overrides)
    return JobConfig(**values)


@dataclass
class RawProducer:
    """Writes JSON (or raw bytes) keyed by trace_id, as the ablab producers do."""

    bootstrap: str
    _producer: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                                       compression_type="lz4", max_request_size=2 * 1024 * 1024)

    def send(self, topic: str, events: Iterable[dict[str, Any] | bytes], *, key: bytes | None = None) -> int:
        count = 0
        for event in events:
            if isinstance(event, bytes):
                value, event_key = event, key
            else:
                value = json.dumps(event, separators=(",", ":")).encode()
                event_key = (event.get("trace_id") or event["event_id"]).encode()
            self._producer.send(topic, value=value, key=event_key)
            count += 1
        self._producer.flush(timeout=60)
        return count

    def close(self) -> None:
        self._producer.close()


def group_members(bootstrap: str, group: str) -> int:
    """How many consumers the broker counts in ``group`` now (0 before anyone joined)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return len((admin.describe_groups([group]).get(group) or {}).get("members") or ())
    finally:
        admin.close()


def group_caught_up(bootstrap: str, group: str, topics: Iterable[str]) -> bool:
    """Every partition of ``topics`` has ``group``'s committed offset at its end: all
    records are stored and committed. The end is the last stable offset (what a
    read_committed consumer can see): a transaction still open is not waited for."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    probe = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        committed = admin.list_group_offsets({group: None}).get(group) or {}
        partitions = [TopicPartition(t, p) for t in topics for p in (probe.partitions_for_topic(t) or ())]
        ends = probe.end_offsets(partitions)
        # an empty partition has nothing to commit
        return bool(ends) and all(end == 0 or (committed.get(tp) is not None and committed[tp].offset >= end)
                                  for tp, end in ends.items())
    finally:
        probe.close()
        admin.close()


def read_to_end(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (read_committed), up to the partitions' ends as
    they are now."""
    return [record.value for record in read_records_to_end(bootstrap, topic)]


def read_records_to_end(bootstrap: str, topic: str, *, isolation_level: str = "read_committed") -> list[Any]:
    """Every record of ``topic`` a consumer at ``isolation_level`` sees (read_uncommitted:
    those of open and aborted transactions too), with partition and offset, up to the
    partitions' ends as they are now."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: list[Any] = []
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} to {ends} stopped at {[consumer.position(tp) for tp in ends]}")
            for batch in consumer.poll(timeout_ms=1000).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, *, isolation_level: str) -> dict[int, int]:
    """Partition → end offset of ``topic``: the high watermark for read_uncommitted, the last
    stable offset (held at the first open transaction) for read_committed."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


__all__ = ["FlinkProcess", "PipelineTopics", "RawProducer", "group_caught_up", "group_members", "end_offsets", "job_config",
           "read_records_to_end", "read_to_end", "wait_for"]
