"""A live pipeline for the issue-19 tests: its own Kafka broker, a real API process that owns
the embedded ClickHouse store and runs the loader, and the Flink job in a mini-cluster, all
on the default ``ablab.*`` topics (so the API, the loader and the job are wired exactly as
``ablab up`` wires them). One per test module: the tests' event times and partitions do not
interfere.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from live_support import LiveStack

from ablab_testing import server_ports, start_api, stop_api


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    from ablab.streaming.flink.job import JobConfig
    from ablab.streaming.flink.local import FlinkProcess
    from ablab.streaming.kafka.broker import BrokerConfig, start_broker, stop_broker

    root = tmp_path_factory.mktemp("live")
    broker = BrokerConfig(directory=root / "kafka", port=server_ports(2), heap_mb=384)
    status = start_broker(config=broker)
    bootstrap = status.bootstrap or broker.bootstrap
    api = flink = stack = None
    try:
        api = start_api(f"sqlite:///{root / 'ablab.db'}", root, extra_env={
            "ABLAB_KAFKA_BOOTSTRAP": bootstrap, "ABLAB_ANALYTICS": "true", "ABLAB_GUARDRAIL_INTERVAL_S": "0",
        })
        # As `ablab stream submit` runs it (default bounds and out-of-orderness), except that no
        # partition goes idle: the tests close windows by moving every partition's event time.
        job = JobConfig(bootstrap=bootstrap, checkpoint_dir=root / "checkpoints", checkpoint_interval_s=2.0,
                        idle_timeout_s=0.0, transactional_id_prefix=f"live-{uuid.uuid4().hex[:6]}")
        flink = FlinkProcess(job, log_path=root / "flink.log").start()
        stack = LiveStack(bootstrap, api, flink, job.checkpoint_dir, root, job)
        stack.create_experiment("flush")  # close_windows' events
        yield stack
    finally:
        if stack is not None:
            stack.flink.stop()
        elif flink is not None:
            flink.stop()
        if api is not None:
            stop_api(api)
        stop_broker(directory=broker.directory)
