"""The cluster path under faults: a 3-broker KRaft cluster, a Flink session cluster with
2 TaskManagers running the job at parallelism 2, the loader into chDB. Mid-stream one
broker and then one TaskManager are SIGKILLed; the job restores from its checkpoint on
the surviving TaskManager, and afterwards every window equals the offline computation:
nothing lost, nothing counted twice. (The full-size drill with timings:
``benchmarks/cluster_drill.py``.)"""

from __future__ import annotations

import pytest

from ablab_testing.cluster_drill import run_drill

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_broker_and_taskmanager_killed_mid_stream_windows_stay_exact(tmp_path):
    result = run_drill(workdir=tmp_path, windows=4, per_window=30, timeout_s=180, say=lambda line: print(line, flush=True))
    print(result.timings)
    # The job really lost a TaskManager and came back from a checkpoint taken with a broker down.
    assert result.checkpoint_before_tm_kill is not None
    assert result.restored_checkpoint is not None
    assert result.restored_checkpoint >= 1
    assert result.expected, "the canned stream must produce windows"
    assert result.mismatches() == []
    assert result.balance["raw"] == result.raw_expected and result.balance["late"] == result.balance["raw"] - result.balance["windowed"]
