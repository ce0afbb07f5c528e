"""The canned stream end to end: real broker, real Flink mini-cluster, real ClickHouse engine.

The stream has duplicates, disorder inside the watermark bound, RUM, feedback minutes
late, and (phase 2) inference events far behind the watermark. Every window row in
ClickHouse must equal the offline computation (ablab_testing.flink_reference) of the
same events: counts and sums exactly, percentiles as linear interpolation. The late-data
policy is checked too: the deliberately late events are in late_events, nothing on time
is, and raw = windowed + late.
"""

from __future__ import annotations

import json
import random
import threading
from datetime import UTC, datetime, timedelta

import pytest

from ablab.streaming.loader.service import Loader
from ablab.streaming.store import queries
from ablab_testing import flink_reference as ref
from ablab_testing.loading import LoaderThread
from ablab_testing.pipeline import FlinkProcess, PipelineTopics, RawProducer, group_caught_up, job_config, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

EXPERIMENT = "canned"
VARIANTS = ("control", "treatment")
OUT_OF_ORDERNESS_MS = 2000
WINDOWS = 6


def _ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000) if moment.tzinfo is None else int(moment.timestamp() * 1000)


def _window_table(client, table: str, experiment: str = EXPERIMENT) -> dict[tuple[str, str, int], dict]:
    result = client.query(f"SELECT * FROM {table} FINAL WHERE experiment = {{e:String}}", parameters={"e": experiment})
    rows = {}
    for values in result.result_rows:
        row = dict(zip(result.column_names, values))
        rows[(row["experiment"], row["variant"], _ms(row["window_start"]))] = row
    return rows


def test_canned_stream_matches_offline_computation(kafka_broker, store, tmp_path):
    topics = PipelineTopics.unique("canned")
    topics.create(bootstrap=kafka_broker)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    start = start - timedelta(seconds=start.second % 10)
    stream = ref.canned_stream(start=start, windows=WINDOWS, per_window=40, experiment=EXPERIMENT, variants=VARIANTS)
    late = ref.late_inference(start=start, count=6, experiment=EXPERIMENT, variants=VARIANTS)
    # RUM long after its request (far past any join horizon) and a redelivered copy: both
    # attributed by trace_id in ClickHouse, the copy once.
    late_rum = [{"v": 1, "type": "rum", "event_id": "late-rum-1", "ts": ref.iso(start + timedelta(minutes=5)),
                 "trace_id": stream.inference[0]["trace_id"], "e2e_ms": 5.0}, dict(stream.rum[0])]
    closing_inf = ref.closing_events(at=start + timedelta(seconds=WINDOWS * 10 + 60), experiment="flush")

    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(*topics.raw, topics.windows),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter,
                    known_experiments=lambda: {EXPERIMENT, "flush"})
    loader_thread = LoaderThread(loader).start()
    flink = FlinkProcess(job_config(topics, bootstrap=kafka_broker, checkpoint_dir=tmp_path / "ckpt",
                                    out_of_orderness_s=OUT_OF_ORDERNESS_MS / 1000),
                         log_path=tmp_path / "flink.log").start()
    producer = RawProducer(kafka_broker)
    try:
        producer.send(topics.inference, stream.inference)
        producer.send(topics.rum, stream.rum)
        producer.send(topics.feedback, stream.feedback)
        first_windows = {(EXPERIMENT, v, _ms(start) + w * ref.WINDOW_MS) for v in VARIANTS for w in range(3)}
        wait_for(lambda: first_windows <= set(_window_table(store, "window_stats")), timeout_s=240,
                 what="the first windows in ClickHouse", on_timeout=flink.log_tail)
        # Phase 2: the watermark is past the first windows now, so these are late.
        producer.send(topics.inference, late)
        producer.send(topics.rum, late_rum)
        producer.send(topics.inference, closing_inf)

        expected_late = {e["event_id"] for e in late}
        expected_keys = set(ref.inference_windows(stream.inference, late_ids=set()))
        reference_late = ref.late_ids(stream.inference + late + closing_inf, out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
                                      partitions=3)

        def complete() -> bool:
            late_ids = {r[0] for r in store.query("SELECT event_id FROM late_events FINAL").result_rows}
            return (expected_late | reference_late) <= late_ids and expected_keys <= set(_window_table(store, "window_stats"))

        wait_for(complete, timeout_s=120, what="all windows and late events", on_timeout=flink.log_tail)
        # every raw event (RUM and labels too) stored: the loader committed the raw topics to their ends
        wait_for(lambda: group_caught_up(kafka_broker, loader.group_id, topics.raw), timeout_s=60,
                 what="the raw topics loaded and committed", on_timeout=lambda: str(loader.stats.as_dict()))
    finally:
        producer.close()
        flink.stop()
        loader_thread.stop()

    late_ids = {r[0] for r in store.query("SELECT event_id FROM late_events FINAL").result_rows}
    # Late-data policy: exactly the events the rule calls late are kept as late, the
    # deliberately late ones among them, and nothing on time.
    assert expected_late <= reference_late
    assert late_ids == reference_late, store.query(
        "SELECT type, experiment, ts, watermark FROM late_events FINAL WHERE has({ids:Array(String)}, event_id)",
        parameters={"ids": sorted(late_ids ^ reference_late)}).result_rows[:20]

    windows = _window_table(store, "window_stats")
    expected = ref.inference_windows(stream.inference + late, late_ids=late_ids)
    ref.assert_window_rows(windows, expected)

    # RUM in its request's window and variant (the store's query-time attribution).
    rum = {(EXPERIMENT, r["variant"], _ms(r["window_start"])): r for r in queries.window_rows(store, experiment=EXPERIMENT)
           if r["rum_n"] is not None}
    expected_rum = ref.rum_windows(stream.rum + late_rum, stream.inference + late)
    assert set(rum) == set(expected_rum)
    for key, row in expected_rum.items():
        ref.assert_window_row({name.removeprefix("rum_"): value for name, value in rum[key].items() if name.startswith("rum_")},
                    row, key)
    first = stream.inference[0]
    first_key = (EXPERIMENT, first["variant"], ref.window_start_ms(ref.parse_ms(first["ts"])))
    on_time_rum = ref.rum_windows(stream.rum, stream.inference + late)
    assert rum[first_key]["rum_n"] == on_time_rum.get(first_key, {"n": 0})["n"] + 1  # the late RUM counts, the copy not

    # Feedback minutes late lands in its request's window and variant.
    labels = {(EXPERIMENT, r["variant"], _ms(r["window_start"])): {"labeled": r["labeled"], "correct": r["correct"]}
              for r in queries.feedback_by_window(store, experiment=EXPERIMENT)}
    assert labels == ref.label_windows(stream.feedback, stream.inference + late)
    assert sum(v["labeled"] for v in labels.values()) == len({f["trace_id"] for f in stream.feedback})

    # Reconciliation: raw = windowed + late, exactly.
    balance = queries.reconciliation(store, experiment=EXPERIMENT)
    assert balance["raw"] == len(ref.dedup(stream.inference + late))
    assert balance["late"] == len({e["event_id"] for e in late} & late_ids)
    assert balance["balanced"], balance
    assert loader.stats.dead_lettered == {}


def test_event_on_a_reawakened_partition_behind_the_watermark_becomes_a_late_row(kafka_broker, store, tmp_path):
    """Live mode (idle timeout on): partitions 1 and 2 stay silent, so after the idle timeout
    the watermark moves on with partition 0 alone and closes the first windows. Then an
    event for the first window arrives on partition 2. The per-partition rule cannot call
    it late (it is the largest ts that partition has seen); the watermark rule must, or the
    closed window would drop it. It must end up in late_events, and raw = windowed + late."""
    from kafka import KafkaProducer

    experiment = "idle"
    topics = PipelineTopics.unique("idle")
    topics.create(bootstrap=kafka_broker, partitions=3)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    start = start - timedelta(seconds=start.second % 10)
    rng = random.Random(5)
    # 4 windows of on-time traffic, in ts order, on partition 0 only (one partition: its
    # own order is the only order, so nothing of it can be behind the watermark).
    on_time = [ref.inference_event(rng=rng, ts=start + timedelta(milliseconds=i * 250), experiment=experiment,
                                   variant=VARIANTS[i % 2]) for i in range(160)]
    reawakened = ref.inference_event(rng=rng, ts=start + timedelta(seconds=5), experiment=experiment, variant="control")
    closing_inf = ref.closing_events(at=start + timedelta(seconds=120), experiment="flush", count=3)

    loader = Loader(store, kafka_broker, group_id=f"{topics.prefix}-loader", topics=(*topics.raw, topics.windows),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter,
                    known_experiments=lambda: {experiment, "flush"})
    loader_thread = LoaderThread(loader).start()
    flink = FlinkProcess(job_config(topics, bootstrap=kafka_broker, checkpoint_dir=tmp_path / "ckpt",
                                    out_of_orderness_s=OUT_OF_ORDERNESS_MS / 1000, idle_timeout_s=1.0),
                         log_path=tmp_path / "flink.log").start()
    producer = KafkaProducer(bootstrap_servers=kafka_broker, acks="all", linger_ms=5)

    def send(events, partition: int | None = None) -> None:
        for i, event in enumerate(events):
            producer.send(topics.inference, value=json.dumps(event).encode(), key=event["trace_id"].encode(),
                          partition=i % 2 if partition is None else partition)
        producer.flush(timeout=60)

    # Partition 0 stays busy (as live traffic does; a partition without records for the
    # idle timeout is idle too, and when all are idle the watermark stands still).
    # The heartbeats' ts (38 s) holds the watermark at 36 s: windows 0-2 close, 3 stays open.
    beating = threading.Event()

    def heartbeat() -> None:
        while not beating.is_set():
            send(ref.closing_events(at=start + timedelta(seconds=38), experiment="flush", count=2), partition=0)
            beating.wait(0.3)  # the pace of live traffic

    beat = threading.Thread(target=heartbeat, daemon=True)
    try:
        send(on_time, partition=0)
        beat.start()
        # Partitions 1, 2 (and the whole RUM topic) are silent: only the idle timeout lets these close.
        first_windows = {(experiment, v, _ms(start) + w * ref.WINDOW_MS) for v in VARIANTS for w in range(3)}
        def diagnosis() -> str:
            return (f"window rows: {store.query('SELECT experiment, window_start, n FROM window_stats FINAL').result_rows}\n"
                    f"late rows: {store.query('SELECT experiment, count() FROM late_events GROUP BY experiment').result_rows}\n"
                    f"raw: {store.query('SELECT experiment, count() FROM raw_events GROUP BY experiment').result_rows}\n"
                    f"loader: {loader.stats}\n" + flink.log_tail(10))

        wait_for(lambda: first_windows <= set(_window_table(store, "window_stats", experiment)), timeout_s=180,
                 what="windows closed while partition 2 is idle", on_timeout=diagnosis)

        def late_ids() -> set[str]:
            return {r[0] for r in store.query("SELECT event_id FROM late_events FINAL WHERE experiment = {e:String}",
                                               parameters={"e": experiment}).result_rows}

        send([reawakened], partition=2)  # behind the watermark, on the partition that woke up
        # the job judged it while the heartbeats still hold the watermark where it is
        wait_for(lambda: reawakened["event_id"] in late_ids(), timeout_s=120, what="the reawakened event as a late row",
                 on_timeout=diagnosis)
        beating.set()
        beat.join(timeout=10)
        send(closing_inf, partition=None)
        send(closing_inf[:1], partition=2)  # a copy (same event_id): counted once, not late

        expected = ref.inference_windows(on_time, late_ids=set())
        wait_for(lambda: reawakened["event_id"] in late_ids() and set(expected) <= set(
            _window_table(store, "window_stats", experiment)), timeout_s=120, what="the late row and every window",
            on_timeout=flink.log_tail)
        wait_for(lambda: group_caught_up(kafka_broker, loader.group_id, topics.raw), timeout_s=60,
                 what="the raw topics loaded and committed", on_timeout=lambda: str(loader.stats.as_dict()))
    finally:
        beating.set()
        producer.close()
        flink.stop()
        loader_thread.stop()

    assert late_ids() == {reawakened["event_id"]}
    windows = _window_table(store, "window_stats", experiment)
    ref.assert_window_rows(windows, expected)
    balance = queries.reconciliation(store, experiment=experiment)
    assert balance == {"raw": len(on_time) + 1, "windowed": len(on_time), "late": 1, "balanced": True}
