"""SIGKILL the Flink job mid-stream, restart it: it resumes from its last checkpoint and
the totals are exact, nothing double-counted (in ClickHouse, and in the windows topic as a
read_committed reader sees it)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from ablab.streaming.flink.job import latest_checkpoint
from ablab.streaming.loader.service import Loader
from ablab.streaming.store import queries
from ablab_testing import flink_reference as ref
from ablab_testing.loading import LoaderThread
from ablab_testing.pipeline import (
    FlinkProcess,
    PipelineTopics,
    RawProducer,
    group_caught_up,
    job_config,
    read_to_end,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
EXPERIMENT = "fault"


def _ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)


def _windows(store) -> dict:
    result = store.query("SELECT * FROM window_stats FINAL WHERE experiment = {e:String}", parameters={"e": EXPERIMENT})
    rows = [dict(zip(result.column_names, values)) for values in result.result_rows]
    return {(r["experiment"], r["variant"], _ms(r["window_start"])): r for r in rows}


def test_sigkill_and_restart_from_checkpoint_keeps_totals_exact(kafka_broker, store, tmp_path):
    topics = PipelineTopics.unique("fault")
    topics.create(bootstrap=kafka_broker)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    start -= timedelta(seconds=start.second % 10)
    first = ref.canned_stream(start=start, windows=6, per_window=40, experiment=EXPERIMENT, seed=21)
    second = ref.canned_stream(start=start + timedelta(seconds=60), windows=6, per_window=40,
                               experiment=EXPERIMENT, seed=22)
    closing_inf = ref.closing_events(at=start + timedelta(seconds=180), experiment="flush")
    config = job_config(topics, bootstrap=kafka_broker, checkpoint_dir=tmp_path / "ckpt")

    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.windows),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter)
    loader_thread = LoaderThread(loader).start()
    producer = RawProducer(kafka_broker)
    job = FlinkProcess(config, log_path=tmp_path / "flink-1.log").start()
    restarted = None
    try:
        producer.send(topics.inference, first.inference)
        wait_for(lambda: len(_windows(store)) >= 4, timeout_s=240, what="windows before the crash")
        wait_for(lambda: latest_checkpoint(tmp_path / "ckpt") is not None, timeout_s=30, what="a checkpoint")
        before = latest_checkpoint(tmp_path / "ckpt")
        producer.send(topics.inference, second.inference[: len(second.inference) // 2])
        # killed after a checkpoint that follows the send: the restart resumes inside the stream,
        # and what the job wrote since that checkpoint is in a Kafka transaction never committed
        wait_for(lambda: latest_checkpoint(tmp_path / "ckpt") not in (None, before), timeout_s=60,
                 what="a checkpoint after the second stream began")
        job.kill()
        assert not job.running
        producer.send(topics.inference, second.inference[len(second.inference) // 2:])
        restarted = FlinkProcess(config, log_path=tmp_path / "flink-2.log").start()
        producer.send(topics.inference, closing_inf)
        expected_keys = set(ref.inference_windows(first.inference + second.inference, late_ids=set()))
        wait_for(lambda: expected_keys <= set(_windows(store)), timeout_s=240, what="every window after the restart")
        wait_for(lambda: group_caught_up(kafka_broker, loader.group_id, (topics.inference, topics.windows)),
                 timeout_s=60, what="everything committed so far loaded", on_timeout=lambda: str(loader.stats.as_dict()))
    finally:
        producer.close()
        job.kill()
        if restarted is not None:
            restarted.stop()
        loader_thread.stop()

    arrivals = first.inference + second.inference + closing_inf
    late_ids = ref.late_ids(arrivals, out_of_orderness_ms=2000, partitions=3)
    expected = ref.inference_windows(first.inference + second.inference, late_ids=late_ids)
    ref.assert_window_rows(_windows(store), expected)
    balance = queries.reconciliation(store, experiment=EXPERIMENT)
    assert balance["balanced"] and balance["raw"] == len(ref.dedup(first.inference + second.inference)), balance

    # Exactly once in Kafka too: a read_committed reader sees each window row once.
    seen: Counter = Counter()
    for value in read_to_end(kafka_broker, topics.windows):
        row = json.loads(value)
        if row["kind"] == "inference" and row["experiment"] == EXPERIMENT:
            seen[(row["variant"], row["window_start"])] += 1
    assert len(seen) == len(expected)
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v > 1]
