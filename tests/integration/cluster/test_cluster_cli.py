"""The cluster path as a user drives it: `ablab kafka start --brokers 3`, `ablab flink start`,
`ablab stream submit --cluster URL`, then status, savepoint and stop through the
JobManager's REST API, and both clusters stopped again. Real JVMs throughout."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ablab_testing import ABLAB, server_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def _ablab(*args: str, env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ABLAB, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"ablab {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_cli_runs_both_clusters_and_the_job_lifecycle(tmp_path):
    kafka_port, flink_port = server_ports(6), server_ports(2)
    bootstrap = ",".join(f"127.0.0.1:{kafka_port + i}" for i in range(3))
    env = {**os.environ, "ABLAB_HOME": str(tmp_path), "ABLAB_KAFKA_BOOTSTRAP": bootstrap}
    url = f"http://127.0.0.1:{flink_port}"
    try:
        started = _ablab("kafka", "start", "--brokers", "3", "--port", str(kafka_port), env=env)
        assert f"bootstrap={bootstrap}" in started.stdout
        again = _ablab("kafka", "start", "--brokers", "3", "--port", str(kafka_port), env=env)  # idempotent
        assert "brokers=3" in again.stdout
        assert _ablab("kafka", "status", env=env).stdout.count("running  pid=") == 3

        _ablab("flink", "start", "--taskmanagers", "1", "--rest-port", str(flink_port), "--rpc-port",
               str(flink_port + 1), env=env)
        assert "taskmanagers=1" in _ablab("flink", "status", env=env).stdout

        job_id = _ablab("stream", "submit", "--cluster", url, env=env).stdout.strip().splitlines()[-1]
        assert len(job_id) == 32

        def status() -> dict:
            (only,) = json.loads(_ablab("stream", "status", "--json", env=env).stdout)
            return only

        from ablab.streaming.flink import rest

        rest.wait_for_checkpoint(url, job_id, timeout_s=300)
        current = status()
        assert current["job_id"] == job_id and current["state"] == "RUNNING"
        assert current["total_tasks"] >= 2  # parallelism 2 by default on a cluster
        assert (tmp_path / "flink" / "checkpoints" / job_id).is_dir()  # the shared checkpoint directory

        savepoint = _ablab("stream", "savepoint", env=env).stdout.strip().splitlines()[-1]
        assert (tmp_path / "flink-cluster" / "savepoints").resolve().as_uri().removeprefix("file://") in savepoint
        final = _ablab("stream", "stop", env=env).stdout.strip().splitlines()[-1]
        assert final != savepoint and "savepoint-" in final
        assert rest.job_status(url, job_id).state == "FINISHED"
    finally:
        subprocess.run([ABLAB, "flink", "stop"], env=env, capture_output=True, timeout=120)
        subprocess.run([ABLAB, "kafka", "stop"], env=env, capture_output=True, timeout=120)
    assert subprocess.run([ABLAB, "flink", "status"], env=env, capture_output=True).returncode == 1
    assert subprocess.run([ABLAB, "kafka", "status"], env=env, capture_output=True).returncode == 1
