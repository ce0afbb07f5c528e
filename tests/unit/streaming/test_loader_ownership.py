"""When the loader lets the rollup add a batch to unit rows (the incremental step) and when it
must recompute: only while it owns every partition of its event topics and has polled
recently. The consumer is a stand-in; tests/integration/streaming/test_many_loaders.py runs
the real group."""

from __future__ import annotations

import time
from collections import namedtuple

import pytest

from ablab.streaming.loader import service
from ablab.streaming.loader.service import Loader

TP = namedtuple("TP", "topic partition")
TOPICS = ("ev.inference", "ev.feedback", "ev.windows")


class _Consumer:
    def __init__(self, owned: set[tuple[str, int]], partitions: int = 3) -> None:
        self.owned, self.partitions = owned, partitions

    def assignment(self) -> set:
        return {TP(t, p) for t, p in self.owned}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.partitions))


def _loader(owned: set[tuple[str, int]], polled_s_ago: float = 0.0) -> Loader:
    loader = Loader(object(), "unused:9092", topics=TOPICS, windows_topic="ev.windows")
    loader._consumer = _Consumer(owned)
    loader._polled_at = time.monotonic() - polled_s_ago
    return loader


EVERY = {(t, p) for t in TOPICS[:2] for p in range(3)}


def test_a_loader_owning_every_event_partition_may_add():
    assert _loader(EVERY | {("ev.windows", p) for p in range(3)})._may_add()


@pytest.mark.parametrize("missing", [("ev.inference", 0), ("ev.feedback", 2)])
def test_a_loader_sharing_its_group_recomputes(missing):
    assert not _loader(EVERY - {missing})._may_add()


def test_the_windows_topic_does_not_count():
    assert _loader(EVERY)._may_add()  # none of ev.windows is owned: window rows feed no unit


def test_a_loader_that_has_not_polled_for_long_recomputes():
    assert not _loader(EVERY, polled_s_ago=service._ADD_WITHIN_S + 1)._may_add()


def test_an_unconnected_loader_recomputes():
    loader = _loader(EVERY)
    loader._consumer = None
    assert not loader._may_add()
