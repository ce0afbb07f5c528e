"""SIGTERM while the broker is absent: the API exits within seconds and nothing it accepted is lost.

The real API process with embedded chDB and its in-process loader, pointed at a closed port:
the loader's Kafka client sits in a 30 s bootstrap, the emitter is spooling. `ablab down`
(and the soak's API restart) give a service 20 s before SIGKILL, and a SIGKILL would drop the
emitter's in-memory queue, so the exit must come well inside that.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ablab_testing import closed_port, start_api, wait_for

pytestmark = pytest.mark.timeout(180)


def _spooled_lines(home: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in (home / "spool").glob("api-*/seg-*.jsonl"))


def test_sigterm_with_the_broker_down_exits_fast_and_spools_everything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    server = start_api(f"sqlite:///{home / 'registry.db'}", home, extra_env={
        "ABLAB_ANALYTICS": "true",  # embedded chDB: the API runs the loader
        "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}",
    })
    try:
        labels = [{"v": 1, "type": "feedback", "ts": datetime.now(UTC).isoformat(), "trace_id": uuid.uuid4().hex,
                   "correct": i % 2, "source": "human"} for i in range(50)]
        with server.client("sdk") as sdk:
            response = sdk.post("/v1/events", json={"events": labels})
        assert response.status_code == 202, response.text
        assert response.json()["accepted"] == 50
        # the loader has failed against the closed port once and is in its retry cycle
        wait_for(lambda: "loader stopped" in (home / "api.log").read_text(errors="replace"), timeout_s=60,
                 what="the in-process loader failing against the closed port")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=60)
        took = time.monotonic() - started
    finally:
        if server.process.poll() is None:
            server.process.kill()
    log = (home / "api.log").read_text(errors="replace")
    assert code in (0, -signal.SIGTERM), log[-3000:]  # uvicorn re-raises the signal after a clean shutdown
    assert took < 15, f"API took {took:.1f} s to exit on SIGTERM:\n{log[-3000:]}"
    print(f"exit on SIGTERM with the broker down: {took:.1f} s")
    assert _spooled_lines(home) == 50, f"accepted 50 events, {_spooled_lines(home)} on disk:\n{log[-2000:]}"


def test_api_restart_replays_the_spool_of_its_predecessor(tmp_path: Path, kafka_broker: str) -> None:
    """What the SIGTERM left on disk reaches Kafka once an API starts on the same ABLAB_HOME with a broker."""
    from kafka import KafkaConsumer, TopicPartition

    home = tmp_path / "home"
    home.mkdir()
    db = f"sqlite:///{home / 'registry.db'}"
    first = start_api(db, home, extra_env={"ABLAB_ANALYTICS": "false", "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}"})
    marker = uuid.uuid4().hex
    try:
        labels = [{"v": 1, "type": "feedback", "ts": datetime.now(UTC).isoformat(), "trace_id": f"{marker}-{i}",
                   "correct": 1, "source": "human"} for i in range(20)]
        with first.client("sdk") as sdk:
            assert sdk.post("/v1/events", json={"events": labels}).json()["accepted"] == 20
        first.process.send_signal(signal.SIGTERM)
        first.process.wait(timeout=30)
    finally:
        if first.process.poll() is None:
            first.process.kill()
    assert _spooled_lines(home) == 20
    second = start_api(db, home, extra_env={"ABLAB_ANALYTICS": "false", "ABLAB_KAFKA_BOOTSTRAP": kafka_broker})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _spooled_lines(home):
            time.sleep(0.5)
        assert _spooled_lines(home) == 0, "the restarted API did not replay its predecessor's spool"
    finally:
        second.process.send_signal(signal.SIGTERM)
        try:
            second.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            second.process.kill()
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker, enable_auto_commit=False)
    partitions = [TopicPartition("ablab.feedback", p) for p in consumer.partitions_for_topic("ablab.feedback")]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(seen) < 20:
        for records in consumer.poll(timeout_ms=1000).values():
            seen.update(r.value.decode() for r in records if marker.encode() in r.value)
    consumer.close()
    assert len({s for s in seen}) == 20
