"""The integration tests close their last windows with events far ahead in time; each
partition's watermark moves only with its own records, so those events must reach every
partition, or the last window stays open and the test times out."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ablab_testing import flink_reference as ref


@pytest.mark.parametrize("partitions, count", [(1, 1), (2, 2), (3, 3), (3, 12), (6, 12)])
def test_closing_events_reach_every_partition_by_key(partitions, count):
    events = ref.closing_events(at=datetime(2026, 1, 1, tzinfo=UTC), experiment="flush", count=count,
                                partitions=partitions)
    assert [ref.kafka_partition(e["trace_id"], partitions) for e in events] == [i % partitions for i in range(count)]
    assert len({e["event_id"] for e in events}) == count

