"""The loader against a real broker and a real ClickHouse engine (chDB): crash mid-batch,
and bad records (malformed JSON, wrong types, unknown experiment, oversized)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.streaming.loader.service import Loader
from ablab.streaming.store import queries
from ablab_testing import flink_reference as ref
from ablab_testing.loading import LoaderThread, run_until_idle
from ablab_testing.pipeline import PipelineTopics, RawProducer, group_members, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class _CrashAfterInsert(Loader):
    """Dies between the ClickHouse insert and the offset commit: the worst moment."""

    def _commit(self) -> None:
        raise RuntimeError("simulated crash after insert, before commit")


def test_a_loader_killed_between_insert_and_commit_loads_everything_once(kafka_broker, store):
    topics = PipelineTopics.unique("ldr")
    topics.create(bootstrap=kafka_broker)
    stream = ref.canned_stream(start=datetime(2026, 3, 1, tzinfo=UTC), windows=3, per_window=100, experiment="ldr")
    producer = RawProducer(kafka_broker)
    producer.send(topics.inference, stream.inference)  # includes producer-retry duplicates
    producer.send(topics.feedback, stream.feedback)
    producer.close()
    common = dict(group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.feedback),
                  windows_topic=topics.windows, deadletter_topic=topics.deadletter, batch_max_records=150)

    crashed = _CrashAfterInsert(store, kafka_broker, **common)
    failure = run_until_idle(crashed)
    assert isinstance(failure, RuntimeError)
    assert sum(crashed.stats.loaded.values()) > 0  # rows reached ClickHouse, offsets did not

    restarted = Loader(store, kafka_broker, **common)
    assert run_until_idle(restarted) is None
    # The first batch was delivered twice ...
    assert restarted.stats.consumed == len(stream.inference) + len(stream.feedback)
    # ... and counted once: one row per event_id.
    distinct = len(ref.dedup(stream.inference))
    assert store.query("SELECT count() FROM raw_events FINAL WHERE type = 'inference'").result_rows[0][0] == distinct
    n, e2e_sum = store.query("SELECT count(), sum(e2e_ms) FROM raw_events FINAL "
                             "WHERE type = 'inference' AND experiment = 'ldr'").result_rows[0]
    assert n == distinct and e2e_sum == pytest.approx(sum(e["e2e_ms"] for e in ref.dedup(stream.inference)), rel=1e-12)
    labeled = store.query("SELECT uniqExact(trace_id) FROM raw_events FINAL WHERE type = 'feedback'").result_rows[0][0]
    assert labeled == len({f["trace_id"] for f in stream.feedback})
    # the per-unit rollup the loader maintains agrees: the replayed batch was recomputed, not added
    requests, labeled, e2e = store.query(
        "SELECT sum(requests), sum(labeled), sum(e2e_ms_sum) FROM unit_stats FINAL WHERE experiment = 'ldr'").result_rows[0]
    assert (requests, labeled) == (distinct, len({f["trace_id"] for f in stream.feedback}))
    assert e2e == pytest.approx(sum(e["e2e_ms"] for e in ref.dedup(stream.inference)), rel=1e-12)


def test_bad_records_are_dead_lettered_counted_and_the_loader_keeps_going(kafka_broker, store):
    topics = PipelineTopics.unique("bad")
    topics.create(bootstrap=kafka_broker)
    good = ref.canned_stream(start=datetime(2026, 3, 2, tzinfo=UTC), windows=1, per_window=20, experiment="known",
                             duplicate_rate=0.0).inference
    template = dict(good[0], event_id="x1", trace_id="x1")
    bad = [
        b'{"type": "inference", "event_id": ',                                      # malformed JSON
        json.dumps(dict(template, event_id="x2", e2e_ms="fast")).encode(),          # wrong type
        json.dumps(dict(template, event_id="x3", experiment="ghost")).encode(),     # unknown experiment
        json.dumps(dict(template, event_id="x4", strategy="s" * 100_000)).encode(),  # oversized
    ]
    producer = RawProducer(kafka_broker)
    producer.send(topics.inference, good[:10])
    producer.send(topics.inference, bad, key=b"bad")
    producer.send(topics.inference, good[10:])
    producer.close()

    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference,),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter,
                    known_experiments=lambda: {"known"})
    assert run_until_idle(loader) is None
    assert loader.stats.dead_lettered == {"$": 2, "e2e_ms": 1, "experiment": 1}
    assert queries.dead_letter_counts(store) == {"$": 2, "e2e_ms": 1, "experiment": 1}
    assert store.query("SELECT count() FROM raw_events FINAL").result_rows[0][0] == len(good)  # all good ones, after the bad

    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topics.deadletter, bootstrap_servers=kafka_broker, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    letters = [json.loads(record.value) for record in consumer]
    consumer.close()
    assert sorted(letter["field"] for letter in letters) == ["$", "$", "e2e_ms", "experiment"]
    assert any("malformed JSON" in letter["message"] for letter in letters)
    assert any("limit" in letter["message"] for letter in letters)
    assert all(letter["source"] == f"loader:{topics.inference}" for letter in letters)


def _load_until(loader: Loader, n: int, *, meanwhile=None, timeout_s: float = 90.0) -> None:
    """Run `loader` in a thread (doing `meanwhile()` first) until it has loaded `n` raw events or times out."""
    with LoaderThread(loader):
        if meanwhile is not None:
            meanwhile()
        wait_for(lambda: loader.stats.loaded["raw_events"] >= n, timeout_s=timeout_s, what=f"{n} raw events loaded",
                 on_timeout=lambda: str(loader.stats.as_dict()))


def test_a_loader_started_before_its_topics_exist_loads_them_once_they_do(kafka_broker, store):
    """A consumer that joins its group while its topics are being created can keep an empty
    assignment for minutes. The loader must get partitions and load within seconds."""
    topics = PipelineTopics.unique("late")
    stream = ref.canned_stream(start=datetime(2026, 3, 3, tzinfo=UTC), windows=1, per_window=30, experiment="late",
                               duplicate_rate=0.0).inference
    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference,),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter)

    def create_and_send() -> None:
        # the group join happens while the topic does not exist
        wait_for(lambda: group_members(kafka_broker, loader.group_id) > 0, timeout_s=60,
                 what="the loader in its consumer group")
        topics.create(bootstrap=kafka_broker)
        producer = RawProducer(kafka_broker)
        producer.send(topics.inference, stream)
        producer.close()

    _load_until(loader, len(stream), meanwhile=create_and_send)
    assert loader.stats.loaded["raw_events"] == len(stream), loader.stats.as_dict()
    stored = store.query("SELECT count() FROM raw_events FINAL WHERE experiment = 'late'").result_rows[0][0]
    assert stored == len(stream)


class _JoinedWithoutPartitions(Loader):
    """Its first group join yields no partitions (what kafka-python sometimes kept after joining
    while the topics were being created): here by a first subscription to a topic that never
    exists. The loader must notice, re-join, and load."""

    def _connect(self) -> None:
        super()._connect()
        self._consumer.subscribe([f"never-created-{self.group_id}"])


def test_a_loader_whose_join_gave_no_partitions_rejoins_and_loads(kafka_broker, store):
    topics = PipelineTopics.unique("stuck")
    topics.create(bootstrap=kafka_broker)
    stream = ref.canned_stream(start=datetime(2026, 3, 4, tzinfo=UTC), windows=1, per_window=30, experiment="stuck",
                               duplicate_rate=0.0).inference
    producer = RawProducer(kafka_broker)
    producer.send(topics.inference, stream)
    producer.close()
    loader = _JoinedWithoutPartitions(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference,),
                                      windows_topic=topics.windows, deadletter_topic=topics.deadletter)
    _load_until(loader, len(stream))
    assert loader.stats.loaded["raw_events"] == len(stream), loader.stats.as_dict()


def test_a_row_the_store_refuses_is_dead_lettered_alone_and_the_batch_is_stored(kafka_broker, store):
    """issue 19: a value ClickHouse cannot take (here a CHECK constraint the store enforces,
    beside a 1.7e308 latency and a year-9999 timestamp that the loader itself refuses) must
    not fail every batch forever. The batch is split around the failing rows: every
    ordinary event is stored, each poison row is dead-lettered with the store's reason and
    counted, offsets are committed to the end, and nothing is read twice."""
    topics = PipelineTopics.unique("poison")
    topics.create(bootstrap=kafka_broker)
    good = ref.canned_stream(start=datetime(2026, 3, 5, tzinfo=UTC), windows=2, per_window=100, experiment="poison",
                             duplicate_rate=0.0).inference
    store.command("ALTER TABLE raw_events ADD CONSTRAINT test_poison CHECK e2e_ms IS NULL OR e2e_ms != 4242.0")
    refused_by_store = [dict(good[i], event_id=f"p{i}", trace_id=f"p{i}", e2e_ms=4242.0) for i in (3, 77, 150)]
    huge = dict(good[5], event_id="huge", trace_id="huge", e2e_ms=1.7e308)
    future = dict(good[6], event_id="future", trace_id="future", ts="9999-12-31T00:00:00Z")
    producer = RawProducer(kafka_broker)
    sent = producer.send(topics.inference, [*good[:50], refused_by_store[0], huge, *good[50:120], refused_by_store[1],
                                            future, *good[120:], refused_by_store[2]])
    producer.close()

    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference,),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter, batch_max_records=120)
    assert run_until_idle(loader) is None
    assert loader.stats.consumed == sent  # nothing re-read: no batch was retried or grew
    assert loader.stats.dead_lettered == {"$store": 3, "e2e_ms": 1, "ts": 1}
    assert loader.stats.bisections > 0 and loader.stats.failures == 0
    assert queries.dead_letter_counts(store) == {"$store": 3, "e2e_ms": 1, "ts": 1}
    stored = store.query("SELECT event_id FROM raw_events FINAL WHERE experiment = 'poison'").result_rows
    assert {r[0] for r in stored} == {e["event_id"] for e in good}
    # the rollup is not poisoned: every unit's figures equal the good events'
    requests, e2e = store.query(
        "SELECT sum(requests), sum(e2e_ms_sum) FROM unit_stats FINAL WHERE experiment = 'poison'").result_rows[0]
    assert requests == len(good) and e2e == pytest.approx(sum(e["e2e_ms"] for e in good), rel=1e-12)
    assert sum(loader.stats.committed.values()) == sent and sum(loader.stats.lag.values()) == 0
    messages = [r[0] for r in store.query("SELECT message FROM dead_letters FINAL WHERE field = '$store'").result_rows]
    assert all("raw_events" in m and "test_poison" in m for m in messages), messages


def test_a_checkpoint_recompute_that_fails_on_data_is_replayed_batch_by_batch_and_the_row_refused(kafka_broker, store):
    """A busy loader recomputes the units of several batches at one checkpoint. When that
    recompute fails on data (here a CHECK constraint on ``unit_stats`` that one request's unit
    breaks), no single row can be blamed: the loader rewinds to its last commit, replays the
    stretch one checkpoint per batch, where the split isolates the request, dead-letters it
    and keeps the rollup exact for every other unit."""
    topics = PipelineTopics.unique("recompute-poison")
    topics.create(bootstrap=kafka_broker)
    good = ref.canned_stream(start=datetime(2026, 3, 5, tzinfo=UTC), windows=2, per_window=120, experiment="rpoison",
                             duplicate_rate=0.0).inference
    store.command("ALTER TABLE unit_stats ADD CONSTRAINT test_poison CHECK e2e_ms_sum != 4242.0")
    poison = dict(good[7], event_id="poison", trace_id="poison", unit_id="poisoned-unit", e2e_ms=4242.0)
    producer = RawProducer(kafka_broker)
    sent = producer.send(topics.inference, [*good[:150], poison, *good[150:]])
    producer.close()

    # a long interval and a full topic: only catching up (or stopping) checkpoints
    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference,),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter, batch_max_records=40,
                    rollup_interval_s=600.0)
    assert run_until_idle(loader) is None
    assert loader.stats.rollup_replays >= 1, loader.stats.as_dict()
    assert loader.stats.dead_lettered == {"$store": 1} and loader.stats.failures == 0
    stored = store.query("SELECT event_id FROM raw_events FINAL WHERE experiment = 'rpoison'").result_rows
    assert {r[0] for r in stored} == {e["event_id"] for e in good}
    assert store.query("SELECT count() FROM rollup_events FINAL WHERE event_id = 'poison'").result_rows[0][0] == 0
    requests, e2e = store.query(
        "SELECT sum(requests), sum(e2e_ms_sum) FROM unit_stats FINAL WHERE experiment = 'rpoison'").result_rows[0]
    assert requests == len(good) and e2e == pytest.approx(sum(e["e2e_ms"] for e in good), rel=1e-12)
    assert sum(loader.stats.committed.values()) == sent and sum(loader.stats.lag.values()) == 0
    message = store.query("SELECT message FROM dead_letters FINAL WHERE field = '$store'").result_rows[0][0]
    assert "unit_stats" in message and "test_poison" in message, message
