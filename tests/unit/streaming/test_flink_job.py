"""The job runner without a JVM: SQL rendering, configuration, checkpoint discovery."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ablab.streaming.flink import job
from ablab.streaming.flink.job import JobConfig, JobConfigError
from ablab.streaming.flink.local import job_arguments


def test_every_placeholder_in_the_sql_has_a_value_and_none_is_left():
    statements = job.statements(JobConfig(bootstrap="127.0.0.1:19250", inference_topic="x.inference"))
    text = "\n".join(statements)
    assert "${" not in text
    assert "'properties.bootstrap.servers' = '127.0.0.1:19250'" in text
    assert "'topic' = 'x.inference'" in text
    inserts = [s for s in statements if s.upper().startswith("INSERT")]
    assert len(inserts) == 3  # one statement set: windows, late rows, rejected rows


def test_the_watermark_and_the_late_rule_are_bounded_by_the_processing_clock():
    """issue 19: one ts in year 9999 must not move a partition's watermark past now + max_future_s,
    nor reach the late rule's per-partition maximum (it is rejected before that)."""
    text = "\n".join(job.statements(JobConfig(max_future_s=120, out_of_orderness_s=5)))
    watermark = text[text.index("WATERMARK FOR ts"):text.index(") WITH (")]
    assert "WHEN ts <= CAST(CURRENT_TIMESTAMP AS TIMESTAMP_LTZ(3))" in watermark
    assert "INTERVAL '0 00:02:00.000' DAY TO SECOND(3)" in watermark
    # a record beyond the bound gives no watermark; one within it counts at most as when it
    # was received (issue 37: a clock 120 s ahead must not make the events after it late)
    assert ("THEN LEAST(ts, received, CAST(CURRENT_TIMESTAMP AS TIMESTAMP_LTZ(3)))\n"
            "                                  - INTERVAL '5.000' SECOND END") in watermark
    assert "received      TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL" in text
    assert "MAX(LEAST(ts, received, arrival)) OVER (PARTITION BY kafka_partition ORDER BY arrival" in text
    screened = text.index("CREATE TEMPORARY VIEW inference_screened")
    assert text.index("WHEN ts > arrival + INTERVAL '0 00:02:00.000' DAY TO SECOND(3) THEN 'ts'") > screened
    assert "FROM inference_screened\n    WHERE rejected_field IS NULL" in text  # only screened rows are de-duplicated
    assert "COALESCE(event_id, SUBSTRING(SHA256(CONCAT('inference', CHR(31), trace_id)) FROM 1 FOR 32))" in text


def test_physical_bounds_are_double_literals_so_minus_zero_compares_as_zero():
    """issue 37: Flink compares a DOUBLE column with a DECIMAL literal in decimal, where -0.0
    fell below 0 and was rejected while the edge kept it; DOUBLE literals compare as IEEE."""
    text = "\n".join(job.statements(JobConfig(), parts=("transform",)))
    assert "WHEN NOT (e2e_ms BETWEEN 0 AND 86400000.0E0) THEN 'e2e_ms'" in text
    assert "WHEN NOT (cost_usd BETWEEN 0 AND 1000000.0E0) THEN 'cost_usd'" in text
    assert "WHEN ttft_ms > e2e_ms THEN 'ttft_ms'" in text  # the edge's coherence rule, same field
    assert "latencies 0..86400000 ms, cost 0..1000000" in text
    assert job._double_literal(1e22) == "1E+22" and job._double_literal(0.5) == "0.5E0"


def test_a_quote_in_a_parameter_cannot_change_a_statement():
    with pytest.raises(JobConfigError, match="inference_topic"):
        job.statements(JobConfig(inference_topic="x', 'scan.startup.mode' = 'latest-offset"))


def test_unknown_placeholder_is_an_error():
    with pytest.raises(JobConfigError, match="nope"):
        job.render("SELECT '${nope}'", {})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"out_of_orderness_s": -1}, "out_of_orderness_s"), ({"checkpoint_interval_s": 0}, "checkpoint_interval_s"),
     ({"delivery_guarantee": "maybe"}, "delivery_guarantee"), ({"parallelism": 0}, "parallelism"),
     ({"fetch_min_bytes": 0}, "fetch_min_bytes"), ({"fetch_max_wait_ms": 60_000}, "fetch_max_wait_ms")],
)
def test_bad_configuration_names_the_field(kwargs, field):
    with pytest.raises(JobConfigError, match=field):
        JobConfig(**kwargs)


def test_bounded_mode_and_exactly_once_reach_the_sql():
    text = "\n".join(job.statements(JobConfig(bounded=True)))
    assert "'scan.bounded.mode' = 'latest-offset'" in text
    assert text.count("'sink.delivery-guarantee' = 'exactly-once'") == 3
    assert "'properties.isolation.level' = 'read_committed'" in text


def test_the_source_fetches_in_batches_unless_told_otherwise():
    """Kafka's default answers every fetch at once; the job asks the broker to wait for 256 KiB
    or 200 ms (fewer requests per event for the job and the broker), and 1 byte restores it."""
    text = "\n".join(job.statements(JobConfig()))
    assert "'properties.fetch.min.bytes' = '262144'" in text and "'properties.fetch.max.wait.ms' = '200'" in text
    assert "'properties.fetch.min.bytes' = '1'" in "\n".join(job.statements(JobConfig(fetch_min_bytes=1)))


def test_command_line_round_trip(tmp_path):
    config = JobConfig(bootstrap="h:1", bounded=True, checkpoint_dir=tmp_path, out_of_orderness_s=3.5,
                       parallelism=2, fetch_min_bytes=1, extra_config={"state.backend.type": "rocksdb"})
    assert job._parse_args(job_arguments(config)) == config


def test_resume_picks_the_newest_completed_checkpoint(tmp_path):
    assert job.latest_checkpoint(tmp_path) is None
    for name, complete in (("job1/chk-3", True), ("job1/chk-4", False), ("job2/chk-1", True)):
        path = tmp_path / name
        path.mkdir(parents=True)
        if complete:
            (path / "_metadata").write_text("x")
        time.sleep(0.01)
    newest = tmp_path / "job2" / "chk-1"
    os.utime(newest, (time.time() + 5, time.time() + 5))
    assert job.latest_checkpoint(tmp_path) == newest
    conf = job.flink_configuration(JobConfig(checkpoint_dir=tmp_path), connector_jar=Path("/x/c.jar"))
    assert conf["execution.state-recovery.path"] == newest.resolve().as_uri()
    assert conf["pipeline.jars"] == "file:///x/c.jar"
    fresh = job.flink_configuration(JobConfig(checkpoint_dir=tmp_path, restore=False), connector_jar=None)
    assert "execution.state-recovery.path" not in fresh


def test_a_live_job_logs_state_changes_next_to_its_checkpoints_and_a_replay_does_not(tmp_path):
    live = job.flink_configuration(JobConfig(checkpoint_dir=tmp_path / "ckpt"), connector_jar=None)
    assert live["state.changelog.enabled"] == "true"
    assert live["state.changelog.dstl.dfs.base-path"] == (tmp_path / "ckpt" / "changelog").resolve().as_uri()
    replay = job.flink_configuration(JobConfig(checkpoint_dir=tmp_path / "ckpt", bounded=True), connector_jar=None)
    assert not any(key.startswith("state.changelog") for key in replay)
    # Without a checkpoint directory the cluster's own configuration decides.
    assert not any(key.startswith("state.changelog") for key in job.flink_configuration(JobConfig(), connector_jar=None))
    # Resuming claims the retained checkpoint (the changelog backend cannot take the full
    # first snapshot that NO_CLAIM asks for).
    (tmp_path / "ckpt" / "j1" / "chk-4").mkdir(parents=True)
    (tmp_path / "ckpt" / "j1" / "chk-4" / "_metadata").write_bytes(b"")
    resumed = job.flink_configuration(JobConfig(checkpoint_dir=tmp_path / "ckpt"), connector_jar=None)
    assert resumed["execution.state-recovery.claim-mode"] == "CLAIM"
    assert resumed["execution.state-recovery.path"].endswith("/chk-4")
    # The changelog folder is not mistaken for a checkpoint to resume from.
    (tmp_path / "ckpt" / "changelog" / "job" / "dstl").mkdir(parents=True)
    assert job.latest_checkpoint(tmp_path / "ckpt") == tmp_path / "ckpt" / "j1" / "chk-4"
