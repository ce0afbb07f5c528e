"""The stream job's readiness probe against a real broker: a consumer group with records to
read and no committed progress is reported down; once it commits to the end it is ready."""

from __future__ import annotations

import pytest

from ablab.streaming.kafka.health import StreamJobProbe
from ablab_testing.pipeline import PipelineTopics, RawProducer

pytestmark = pytest.mark.integration


def test_a_group_that_does_not_consume_is_reported_down_until_it_commits(kafka_broker):
    topics = PipelineTopics.unique("probe")
    topics.create(bootstrap=kafka_broker)
    producer = RawProducer(kafka_broker)
    producer.send(topics.inference, [{"event_id": f"e{i}", "trace_id": f"t{i}"} for i in range(30)])
    producer.close()
    group = f"{topics.prefix}-flink"
    # stall_s = 0: no progress between two looks is a stall (no waiting on time in the test)
    probe = StreamJobProbe(bootstrap=kafka_broker, group_id=group, topic=topics.inference, stall_s=0.0, cache_s=0.0)
    try:
        assert probe().startswith("ok") and probe.lag == 30  # first look: nothing to compare with yet
        verdict = probe()
        assert verdict.startswith("failed") and "30 records" in verdict and group in verdict

        from ablab.streaming.kafka.consumer import make_consumer

        consumer = make_consumer(bootstrap=kafka_broker, group_id=group)
        consumer.subscribe([topics.inference])
        read = 0
        while read < 30:
            read += sum(len(records) for records in consumer.poll(timeout_ms=1000).values())
        consumer.commit()
        consumer.close()
        assert probe() == "ok (lag 0)" and probe.lag == 0
    finally:
        probe.close()
