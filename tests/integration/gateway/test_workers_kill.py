"""``ablab gateway --workers 2`` with the real API and a real Kafka broker behind it: one worker
is SIGKILLed mid-traffic, and every request's events still reach Kafka exactly once (by
``event_id``): each worker's outbox file keeps what it wrote, the supervisor's one forwarder
ships every worker's directory, and the supervisor starts a new worker in the dead one's place.

The backend is the gateway's scripted OpenAI backend (a real HTTP server, 16 chunks 15 ms
apart), so streams are in flight when the worker dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from ablab.platform.gateway.scripted import ScriptedBackend
from ablab_testing import ABLAB, free_port, start_api, stop_api, wait_for, wait_http
from ablab_testing.gateway_stack import create_experiment, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

KEY = "gw-workers"


def workers_of(pid: int) -> set[int]:
    """The supervisor's worker processes (its spawned children, not multiprocessing's tracker)."""
    out = set()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.add(int(child))
    return out


def kafka_events(bootstrap: str, topic: str) -> list[dict]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        end = consumer.end_offsets(partitions)
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(consumer.position(p) < end[p] for p in partitions):
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(json.loads(r.value) for r in records)
        return [e for e in out if e.get("experiment") == KEY]
    finally:
        consumer.close()


def test_a_killed_worker_loses_no_event_and_doubles_none(kafka_broker: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home, extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker})
    procs: list[subprocess.Popen] = []
    backend = ScriptedBackend(tokens=16).start()
    try:
        create_experiment(api, KEY, {"a": {}, "b": {"params": {"temperature": 0.2}}})
        port = free_port()
        config = home / "gateway.yaml"
        config.write_text(f"backends:\n  scripted: {{url: '{backend.url}', models: ['*']}}\n")
        env = {**os.environ, "ABLAB_HOME": str(home), "ABLAB_SDK_TOKEN": api.tokens["sdk"], "ABLAB_API_URL": api.base_url}
        log = home / "gateway.log"
        sup = subprocess.Popen([ABLAB, "gateway", "--config", str(config), "--port", str(port), "--refresh-s", "1",
                                "--workers", "2"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        procs.append(sup)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/readyz", sup, log)
        wait_for(lambda: len(workers_of(sup.pid)) == 2, timeout_s=60, what="two workers")
        # both workers have the assignment config: 20 /readyz in a row, each on a new connection
        wait_for(lambda: all(httpx.get(f"{url}/readyz").status_code == 200 for _ in range(20)), timeout_s=60,
                 what="both workers ready")

        answered: dict[str, bool] = {}  # trace id -> the stream ended with [DONE]
        failed = 0
        stop_traffic = threading.Event()
        lock = threading.Lock()

        def traffic(n: int) -> None:
            nonlocal failed
            i = 0
            while not stop_traffic.is_set():
                i += 1
                body = {"model": "sleep-15", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                        "user": f"u{n}-{i}"}
                try:  # a new connection per request: the kernel spreads them over both workers
                    with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        data = r.read()
                        trace = r.headers.get("x-ablab-trace-id")
                    with lock:
                        answered[trace] = r.status_code == 200 and data.endswith(b"data: [DONE]\n\n")
                except httpx.HTTPError:
                    with lock:
                        failed += 1

        threads = [threading.Thread(target=traffic, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        wait_for(lambda: len(answered) >= 20, timeout_s=60, what="traffic on both workers")
        victim = min(workers_of(sup.pid))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(workers_of(sup.pid) - {victim}) == 2, timeout_s=60, what="the supervisor's new worker")
        n_at_kill = len(answered)
        wait_for(lambda: len(answered) >= n_at_kill + 30, timeout_s=120, what="traffic after the kill")
        stop_traffic.set()
        for t in threads:
            t.join(60)
        done = {t for t, ok in answered.items() if ok}
        assert len(done) >= 40, (len(done), failed)

        def shipped() -> bool:
            traces = {e["trace_id"] for e in kafka_events(kafka_broker, "ablab.inference")}
            return done <= traces

        wait_for(shipped, timeout_s=120, what="every answered request's inference event in Kafka",
                 on_timeout=lambda: log.read_text()[-3000:])
        # the supervisor stops cleanly, its forwarder shipping what is left
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0
        for topic in ("ablab.inference", "ablab.exposure"):
            events = kafka_events(kafka_broker, topic)
            ids = Counter(e["event_id"] for e in events)
            assert ids and max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:5]  # none twice
            per_trace = Counter(e["trace_id"] for e in events)
            assert all(per_trace[t] == 1 for t in done), topic  # each answered request's event once
            assert max(per_trace.values()) == 1  # and no request's twice, answered or cut by the kill
        dirs = sorted(p.name for p in (home / "gateway-outbox").iterdir() if p.is_dir())
        assert dirs == ["worker-0", "worker-1"]
        for d in dirs:  # both workers served traffic (the kernel spread the connections)
            assert any(p.stat().st_size for p in (home / "gateway-outbox" / d).glob("*.jsonl")), d
        assert "exited with -9; restarting" in log.read_text()
    finally:
        stop(procs)
        backend.stop()
        stop_api(api)
