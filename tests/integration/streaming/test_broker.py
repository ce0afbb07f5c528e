"""The broker runner against a real Kafka broker: topics, round-trip, restart."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


def test_topics_exist_with_their_partitions(kafka_broker: str) -> None:
    from kafka import KafkaAdminClient

    from ablab.streaming.kafka.topics import TOPICS

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker)
    try:
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics([s.name for s in TOPICS])}
    finally:
        admin.close()
    assert described == {s.name: s.partitions for s in TOPICS}


def test_create_topics_is_idempotent(kafka_broker: str) -> None:
    from ablab.streaming.kafka.topics import create_topics

    assert create_topics(bootstrap=kafka_broker) == []


def test_idempotent_producer_round_trip_read_committed(kafka_broker: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from ablab.streaming.kafka.topics import TopicSpec, create_topics

    topic = f"test.roundtrip.{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap=kafka_broker, specs=(TopicSpec(topic, 3),))
    producer = KafkaProducer(bootstrap_servers=kafka_broker, acks="all", enable_idempotence=True,
                             compression_type="lz4")
    sent = [f"m{i}".encode() for i in range(500)]
    for value in sent:
        producer.send(topic, key=value[-1:], value=value)
    producer.flush(timeout=30)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker, isolation_level="read_committed",
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=5000)
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    received = [record.value for record in consumer]
    consumer.close()
    assert sorted(received) == sorted(sent)
    assert len(received) == len(set(received))
