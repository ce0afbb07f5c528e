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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablab.streaming.flink.job import JobConfig
from ablab.streaming.flink.local import FlinkProcess


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
    def unique(cls, label: str = "t") -> "PipelineTopics":
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


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str, on_timeout: Callable[[], str] | None = None,
             interval_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    detail = on_timeout() if on_timeout else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{detail}")


__all__ = ["FlinkProcess", "PipelineTopics", "RawProducer", "job_config", "wait_for"]
