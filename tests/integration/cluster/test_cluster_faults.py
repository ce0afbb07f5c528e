"""The cluster path under faults: a 3-broker KRaft cluster, a Flink session cluster with
2 TaskManagers running the job at parallelism 2, 2 loaders in one group into chDB.
Mid-stream one broker and then one TaskManager are SIGKILLed and one loader dies between
its store writes and its offset commit; the job restores from its checkpoint on the
surviving TaskManager, the other loader replays what the dead one had not committed, and
afterwards every window equals the offline computation and the per-unit rollup counts
every request once: nothing lost, nothing counted twice. (The full-size drill with timings:
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
    assert result.loaders == 2 and result.killed_loader
    assert len(result.loader_errors) == 1 and "killed between" in result.loader_errors[0]  # only the one killed
    assert result.rollup_requests == result.raw_expected
    assert result.expected, "the canned stream must produce windows"
    assert result.mismatches() == []
    assert result.balance["raw"] == result.raw_expected and result.balance["late"] == result.balance["raw"] - result.balance["windowed"]
