"""Fault test from the issue: the broker dies for 30 s while a producer emits.

A dedicated broker (the shared session broker must not be killed) is SIGKILLed — a crash,
no clean shutdown — while a thread emits numbered events at a steady rate; 30 s later it
is restarted on the same data dir. Every event must arrive: the set of ids is compared
exactly. Duplicates are counted apart and may only come from the documented race (a
write that reached the broker in the instant it was killed, its ack lost), so they are
bounded by what was emitted in the second before the kill.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ablab.streaming.kafka.consumer import read_topics
from ablab.streaming.kafka.emitter import Emitter, EmitterConfig
from ablab.streaming.kafka.topics import EVENT_TOPICS
from ablab_testing import server_ports, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGE_S = 30.0
RATE_PER_S = 200


def test_broker_down_30s_while_emitting_loses_nothing(tmp_path: Path) -> None:
    from test_emitter import numbered_event

    from ablab.streaming.kafka.broker import BrokerConfig, kill_broker, start_broker, stop_broker

    broker = BrokerConfig(directory=tmp_path / "kafka", port=server_ports(2), heap_mb=384)
    start_broker(config=broker)
    run = f"fault{time.time_ns()}"
    # A send that waited on the dead broker would block max_block_ms (30 s here): far above
    # anything a loaded machine's scheduling adds, so the bound below tells the two apart.
    emitter = Emitter(config=EmitterConfig(bootstrap=broker.bootstrap, spool_dir=tmp_path / "spool",
                                           probe_backoff_s=(0.5, 2.0), max_block_ms=30_000))
    emitted = 0
    stop = threading.Event()
    worst_emit_s = 0.0

    def produce() -> None:
        nonlocal emitted, worst_emit_s
        start = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - start) * RATE_PER_S)
            while emitted < due:
                began = time.perf_counter()
                emitter.emit(numbered_event(run, emitted))
                worst_emit_s = max(worst_emit_s, time.perf_counter() - began)
                emitted += 1
            stop.wait(0.005)  # the pace of steady traffic

    thread = threading.Thread(target=produce)
    try:
        thread.start()
        wait_for(lambda: emitter.counters()["sent"] >= 5 * RATE_PER_S, timeout_s=60,
                 what="5 s of traffic acknowledged by the broker", on_timeout=lambda: str(emitter.counters()))
        before_kill = emitted
        kill_broker(directory=broker.directory)
        killed_at = emitted
        time.sleep(OUTAGE_S)  # the fault under test: the broker stays down this long
        during = emitter.counters()
        restarting_at = emitted
        assert not during["broker_up"] and during["spool_pending"] > 0, during
        start_broker(config=broker)
        # traffic goes on until the broker is back, acknowledges new events and the spool replays
        wait_for(lambda: (c := emitter.counters())["broker_up"] and c["replayed"] > 0
                 and c["sent"] >= during["sent"] + 5 * RATE_PER_S, timeout_s=120,
                 what="5 s of new traffic acknowledged after the restart", on_timeout=lambda: str(emitter.counters()))
        stop.set()
        thread.join()
        assert emitter.flush(120), emitter.counters()
        counters = emitter.counters()
        emitter.close(timeout_s=5)
        records = read_topics(bootstrap=broker.bootstrap, topics=EVENT_TOPICS.values(), expected=emitted,
                              timeout_s=60)
    finally:  # never leave a broker behind, whatever failed
        stop.set()
        thread.join(timeout=10)
        emitter.close(timeout_s=5)
        stop_broker(directory=broker.directory)
    ids = Counter(json.loads(r.value)["event_id"] for r in records)
    expected = {f"{run}-{i}" for i in range(emitted)}
    missing, unexpected = expected - set(ids), set(ids) - expected
    duplicates = sum(n - 1 for n in ids.values())
    print(f"\nemitted={emitted} killed_at={killed_at} received={len(records)} duplicates={duplicates} "
          f"worst_emit_ms={worst_emit_s * 1000:.2f} counters={counters}")
    assert not missing, f"{len(missing)} events lost, e.g. {sorted(missing)[:5]}"
    assert not unexpected
    assert restarting_at - killed_at > OUTAGE_S * RATE_PER_S * 0.8  # the producer kept emitting through the outage
    assert counters["spooled"] > OUTAGE_S * RATE_PER_S * 0.5 and counters["replayed"] > 0
    assert counters["dropped"] == 0 and counters["inflight"] == 0
    assert duplicates <= max(RATE_PER_S, killed_at - before_kill + RATE_PER_S)
    # emit never waited on the dead broker: one wait would have taken max_block_ms (30 s)
    assert worst_emit_s < 10.0
