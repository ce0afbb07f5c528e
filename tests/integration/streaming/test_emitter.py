"""The emitter against a real broker: delivery, spooling while the broker is away, crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ablab.platform.events import EVENT_TYPES, is_heartbeat, validate_event
from ablab.streaming.kafka.consumer import read_topics
from ablab.streaming.kafka.emitter import Emitter, EmitterConfig
from ablab.streaming.kafka.topics import EVENT_TOPICS

pytestmark = pytest.mark.integration
TS = "2026-03-01T12:00:00Z"


def numbered_event(run: str, i: int):
    """One of each type in turn, with an event_id that names the run and the number."""
    kind = EVENT_TYPES[i % len(EVENT_TYPES)]
    common = {"type": kind, "ts": TS, "trace_id": f"{run}-t{i}", "event_id": f"{run}-{i}"}
    body = {
        "exposure": {"experiment": "exp", "variant": "a", "unit_id": f"u{i}"},
        "inference": {"experiment": "exp", "variant": "a", "unit_id": f"u{i}", "ttft_ms": 5.0, "e2e_ms": 9.0,
                      "prompt_tokens": 3, "output_tokens": 2, "device_s": 0.01, "cost_usd": 0.0,
                      "price_version": "p1", "strategy": "s1"},
        "rum": {"e2e_ms": 11.0},
        "feedback": {"correct": i % 2, "source": "auto"},
        "cost": {"cost_usd": 0.001},
    }[kind]
    event = validate_event({**common, **body})
    assert not hasattr(event, "field"), event
    return event


def ids_of_run(bootstrap: str, run: str, expected: int, timeout_s: float = 60.0) -> Counter:
    records = read_topics(bootstrap=bootstrap, topics=EVENT_TOPICS.values(), expected=None, timeout_s=timeout_s,
                          idle_s=3.0)
    # other tests' API processes share the broker: their heartbeats are on the inference topic too
    ids = (json.loads(r.value)["event_id"] for r in records if not is_heartbeat(r.value))
    return Counter(i for i in ids if i.startswith(f"{run}-"))


def test_emitted_events_arrive_once_on_their_typed_topics(kafka_broker: str, tmp_path: Path) -> None:
    run = f"rt{time.time_ns()}"
    with Emitter(config=EmitterConfig(bootstrap=kafka_broker, spool_dir=tmp_path / "spool")) as emitter:
        for i in range(2000):
            emitter.emit(numbered_event(run, i))
        assert emitter.flush(60), emitter.counters()
        counters = emitter.counters()
    assert counters["sent"] == 2000 and counters["dropped"] == 0 and counters["spool_pending"] == 0
    ids = ids_of_run(kafka_broker, run, 2000)
    assert set(ids) == {f"{run}-{i}" for i in range(2000)}
    assert max(ids.values()) == 1


def test_dead_letters_carry_the_reason(kafka_broker: str, tmp_path: Path) -> None:
    from ablab.platform.events import Rejection
    from ablab.streaming.kafka.topics import DEADLETTER_TOPIC

    marker = f"dl{time.time_ns()}"
    with Emitter(config=EmitterConfig(bootstrap=kafka_broker, spool_dir=tmp_path / "spool")) as emitter:
        emitter.dead_letter(raw=f'{{"oops": "{marker}"', rejection=Rejection("$", "malformed JSON"), source="test")
        assert emitter.flush(30)
        assert emitter.counters()["rejected"] == 1
    letters = [json.loads(r.value) for r in read_topics(bootstrap=kafka_broker, topics=[DEADLETTER_TOPIC])]
    mine = [d for d in letters if marker in d["raw"]]
    assert len(mine) == 1 and mine[0]["message"] == "malformed JSON" and mine[0]["source"] == "test"


def test_broker_absent_at_start_spools_then_replays_in_order(tmp_path: Path) -> None:
    from ablab.streaming.kafka.broker import BrokerConfig, start_broker, stop_broker
    from ablab_testing import server_ports

    broker = BrokerConfig(directory=tmp_path / "kafka", port=server_ports(2), heap_mb=384)
    run = f"late{time.time_ns()}"
    # max_block_ms 30 s: one emit that waited for the absent broker would take that long, far
    # above what a loaded machine's scheduling adds to 500 emits
    config = EmitterConfig(bootstrap=broker.bootstrap, spool_dir=tmp_path / "spool", probe_backoff_s=(0.5, 2.0),
                           max_block_ms=30_000)
    emitter = Emitter(config=config)
    try:
        started = time.perf_counter()
        for i in range(500):
            emitter.emit(numbered_event(run, i))
        assert time.perf_counter() - started < 15.0  # emit never waits for the absent broker
        deadline = time.monotonic() + 20
        while emitter.counters()["spool_pending"] < 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert emitter.counters()["spool_pending"] == 500 and not emitter.counters()["broker_up"]
        broker_started_ms = time.time() * 1000
        start_broker(config=broker)
        assert emitter.flush(90), emitter.counters()
        assert emitter.counters()["replayed"] == 500
        records = read_topics(bootstrap=broker.bootstrap, topics=EVENT_TOPICS.values(), expected=500)
        # each record's timestamp is when it was emitted (the edge received it), kept through
        # the spool: the stream job bounds event times by it (issue 37)
        assert all(r.timestamp <= broker_started_ms for r in records)
        numbers = [int(json.loads(r.value)["event_id"].rsplit("-", 1)[1]) for r in records]
        assert sorted(numbers) == list(range(500))
        # replay kept emit order within each partition
        by_partition: dict[tuple[str, int], list[int]] = {}
        for record, number in zip(records, numbers):
            by_partition.setdefault((record.topic, record.partition), []).append(number)
        assert all(seq == sorted(seq) for seq in by_partition.values())
    finally:
        emitter.close(timeout_s=5)
        stop_broker(directory=broker.directory)


def test_process_killed_after_spooling_loses_nothing(kafka_broker: str, tmp_path: Path) -> None:
    """A process spools (broker unreachable), is SIGKILLed; the next emitter on its spool replays."""
    from ablab.streaming.kafka.broker import free_port

    run = f"kill{time.time_ns()}"
    spool = tmp_path / "spool"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_emitter import numbered_event
        from ablab.streaming.kafka.emitter import Emitter, EmitterConfig
        emitter = Emitter(config=EmitterConfig(bootstrap="127.0.0.1:{free_port()}", spool_dir={str(spool)!r}))
        for i in range(300):
            emitter.emit(numbered_event({run!r}, i))
        while emitter.counters()["spool_pending"] < 300:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    with Emitter(config=EmitterConfig(bootstrap=kafka_broker, spool_dir=spool)) as emitter:
        assert emitter.flush(60), emitter.counters()
        assert emitter.counters()["replayed"] == 300
    ids = ids_of_run(kafka_broker, run, 300)
    assert set(ids) == {f"{run}-{i}" for i in range(300)} and max(ids.values()) == 1


def test_http_ingestion_through_a_real_emitter(kafka_broker: str, tmp_path: Path) -> None:
    from ablab.streaming.ingest import IngestStats, ingest_events
    from ablab.streaming.kafka.topics import DEADLETTER_TOPIC

    run = f"ing{time.time_ns()}"
    good = [json.loads(numbered_event(run, i).to_json_bytes()) for i in range(20)]
    bad = {**good[0], "event_id": f"{run}-bad", "ttft_ms": "fast"}
    body = json.dumps([*good, bad]).encode()
    stats = IngestStats()
    with Emitter(config=EmitterConfig(bootstrap=kafka_broker, spool_dir=tmp_path / "spool")) as emitter:
        # Received a minute after the events' fixed TS, so the edge's event-time bounds accept them.
        result = ingest_events(body=body, sink=emitter, stats=stats,
                               now=datetime.fromisoformat(TS) + timedelta(minutes=1))
        assert emitter.flush(30)
    assert (result.accepted, result.rejected) == (20, 1)
    ids = ids_of_run(kafka_broker, run, 20)
    assert set(ids) == {f"{run}-{i}" for i in range(20)}
    letters = [json.loads(r.value) for r in read_topics(bootstrap=kafka_broker, topics=[DEADLETTER_TOPIC])]
    assert [d["field"] for d in letters if f"{run}-bad" in d["raw"]] == [result.errors[0]["field"]]


def test_a_record_the_broker_can_never_take_is_counted_and_the_rest_flows(kafka_broker: str, tmp_path: Path) -> None:
    from ablab.streaming.kafka.spool import SpoolRecord

    run = f"poison{time.time_ns()}"
    with Emitter(config=EmitterConfig(bootstrap=kafka_broker, spool_dir=tmp_path / "spool",
                                      probe_backoff_s=(0.2, 1.0))) as emitter:
        emitter.emit_record(SpoolRecord(EVENT_TOPICS["rum"], b"big", b'{"pad":"' + b"x" * 2_000_000 + b'"}'))
        for i in range(50):
            emitter.emit(numbered_event(run, i))
        assert emitter.flush(60), emitter.counters()
        counters = emitter.counters()
    assert counters["dropped"] == 1 and counters["broker_up"], counters
    ids = ids_of_run(kafka_broker, run, 50)
    assert set(ids) == {f"{run}-{i}" for i in range(50)}


def test_heartbeats_reach_every_partition_behind_the_records_sent_before_them(kafka_broker: str, tmp_path: Path) -> None:
    """issue 35: with ``heartbeat_s`` the emitter writes its clock to every partition of the
    inference topic, so the stream job's event time moves while no request arrives."""
    from ablab.platform.events import is_heartbeat
    from ablab_testing.pipeline import PipelineTopics

    topics = PipelineTopics.unique("heartbeat")
    topics.create(bootstrap=kafka_broker, partitions=3)
    config = EmitterConfig(bootstrap=kafka_broker, spool_dir=tmp_path / "spool", heartbeat_s=0.2,
                           heartbeat_topic=topics.inference)
    with Emitter(config=config) as emitter:
        deadline = time.monotonic() + 30
        while emitter.counters()["heartbeats"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert emitter.counters()["heartbeats"] >= 3, emitter.counters()
        assert emitter.flush(30)
    records = read_topics(bootstrap=kafka_broker, topics=[topics.inference], idle_s=2.0)
    assert {r.partition for r in records} == {0, 1, 2}
    assert all(is_heartbeat(r.value) for r in records)
    for r in records:  # the record timestamp is the heartbeat's own time
        ts = datetime.fromisoformat(json.loads(r.value)["ts"].replace("Z", "+00:00"))
        assert abs(ts.timestamp() * 1000 - r.timestamp) < 1
    assert emitter.counters()["spooled"] == 0  # heartbeats are never spooled
