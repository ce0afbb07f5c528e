"""Several loaders in one consumer group give exactly the result of one.

A canned stream (duplicates, labels that arrive before and after their request) goes
through 1 or 3 loaders sharing a group, on a real broker and the real ClickHouse engine
(chDB). One loader dies between its insert and its offset commit mid-stream, a new one
joins, and the group rebalances around both. Each loader runs its batches under its own
lock, as loaders in separate processes would (in-process loaders otherwise serialize on
the embedded store's lock). Afterwards every unit's rollup row equals the computation from
the events themselves: no event lost, none counted twice, every label at its unit.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import UTC, datetime

import pytest

from ablab.streaming.loader.service import Loader
from ablab_testing import flink_reference as ref
from ablab_testing.loading import LoaderThread, stop_all
from ablab_testing.pipeline import PipelineTopics, RawProducer, group_caught_up, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXPERIMENT = "many"


class _DiesOnCommit(Loader):
    """Dies between the store writes and the offset commit, at its first commit once it has
    stored ``n`` batches (a checkpoint may cover several)."""

    def __init__(self, *args, n: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._n = n

    def _commit(self) -> None:
        if self.stats.batches + 1 >= self._n:  # this batch is counted after its commit
            raise RuntimeError("simulated crash after insert, before commit")
        super()._commit()


def _expected_units(stream: ref.CannedStream) -> dict[tuple[str, str], tuple[float, float, float, float]]:
    """(variant, unit) → (requests, e2e_ms_sum, labeled, correct) from the events alone."""
    inference = ref.dedup(stream.inference)
    latest: dict[str, dict] = {}
    for label in sorted(stream.feedback, key=lambda f: f["ts"]):
        latest[label["trace_id"]] = label
    units: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for event in inference:
        row = units[(event["variant"], event["unit_id"])]
        row[0] += 1
        row[1] += event["e2e_ms"]
        if event["trace_id"] in latest:
            row[2] += 1
            row[3] += float(latest[event["trace_id"]]["correct"])
    return {key: tuple(values) for key, values in units.items()}


def _stored_units(store) -> dict[tuple[str, str], tuple[float, float, float, float]]:
    rows = store.query(
        "SELECT toString(variant), unit_id, requests, e2e_ms_sum, labeled, correct FROM unit_stats FINAL "
        "WHERE experiment = {e:String}", parameters={"e": EXPERIMENT}).result_rows
    return {(v, u): (req, e2e, labeled, correct) for v, u, req, e2e, labeled, correct in rows}


@pytest.mark.parametrize("loaders", [1, 3])
def test_loaders_in_one_group_under_a_kill_and_rebalances_load_exactly_once(kafka_broker, store, loaders):
    topics = PipelineTopics.unique(f"many{loaders}")
    topics.create(bootstrap=kafka_broker)
    stream = ref.canned_stream(start=datetime(2026, 3, 1, tzinfo=UTC), windows=4, per_window=120,
                               experiment=EXPERIMENT, label_rate=0.6, seed=loaders)
    # Labels of the first half of the traces are sent before any request: their loader must
    # place them when the request arrives (possibly in a later batch, after a rebalance).
    first_half = {e["trace_id"] for e in stream.inference[: len(stream.inference) // 2]}
    early = [f for f in stream.feedback if f["trace_id"] in first_half]
    late = [f for f in stream.feedback if f["trace_id"] not in first_half]
    producer = RawProducer(kafka_broker)
    producer.send(topics.feedback, early)
    producer.send(topics.inference, stream.inference)
    producer.send(topics.feedback, late)
    producer.close()

    group = f"{topics.prefix}-loader"
    consumed = (topics.inference, topics.feedback)
    common = dict(group_id=group, topics=consumed, windows_topic=topics.windows, deadletter_topic=topics.deadletter,
                  batch_max_records=60)
    running: list[LoaderThread] = []

    def start(loader: Loader, *, supervised: bool = True) -> None:
        running.append(LoaderThread(loader, supervised=supervised).start())

    # The survivors run supervised, as `ablab loader` does: a commit refused by one of the
    # rebalances this test causes reconnects instead of ending the loader.
    dying = _DiesOnCommit(store, kafka_broker, n=3, batch_lock=threading.RLock(), **common)
    start(dying, supervised=False)
    for _ in range(loaders - 1):
        start(Loader(store, kafka_broker, batch_lock=threading.RLock(), **common))
    try:
        wait_for(lambda: running[0].failure is not None, timeout_s=180, what="the dying loader's crash")
        assert isinstance(running[0].failure, RuntimeError) and sum(dying.stats.loaded.values()) > 0
        start(Loader(store, kafka_broker, batch_lock=threading.RLock(), **common))  # its replacement joins
        wait_for(lambda: group_caught_up(kafka_broker, group, consumed), timeout_s=180,
                 what="committed offsets at the end of every partition")
    finally:
        stop_all(running)
    failures = [t.failure for t in running if t.failure is not None]
    assert len(failures) == 1, failures

    distinct = len(ref.dedup(stream.inference))
    assert store.query("SELECT count() FROM raw_events FINAL WHERE type = 'inference'").result_rows[0][0] == distinct
    expected, stored = _expected_units(stream), _stored_units(store)
    assert set(stored) == set(expected)
    for key, (requests, e2e, labeled, correct) in expected.items():
        got = stored[key]
        assert (got[0], got[2], got[3]) == (requests, labeled, correct), (key, got, expected[key])
        assert got[1] == pytest.approx(e2e, rel=1e-12), key
    assert sum(v[2] for v in stored.values()) == len({f["trace_id"] for f in stream.feedback})
