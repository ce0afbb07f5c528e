"""The cluster path's pure parts: broker and Flink configuration, submission arguments,
and the CLI's refusals. The processes themselves run in tests/integration/cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablab.streaming.flink import cluster as flink_cluster
from ablab.streaming.flink.job import JobConfig, _parse_args
from ablab.streaming.kafka.broker import BrokerConfig, ClusterConfig, render_properties
from ablab.streaming.kafka.topics import replication_for


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_one_broker_keeps_its_standalone_quorum_and_no_replication(tmp_path):
    props = _props(render_properties(BrokerConfig(directory=tmp_path, port=19092)))
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert "controller.quorum.voters" not in props
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "1"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "1"


def test_three_nodes_share_one_static_quorum_and_replicate_three_ways(tmp_path):
    cluster = ClusterConfig(directory=tmp_path, brokers=3, port=20000)
    assert cluster.bootstrap == "127.0.0.1:20000,127.0.0.1:20001,127.0.0.1:20002"
    rendered = [_props(render_properties(node)) for node in cluster.nodes]
    assert [p["node.id"] for p in rendered] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in rendered} == {"1@127.0.0.1:20003,2@127.0.0.1:20004,3@127.0.0.1:20005"}
    assert [p["listeners"] for p in rendered] == [
        f"PLAINTEXT://127.0.0.1:{20000 + i},CONTROLLER://127.0.0.1:{20003 + i}" for i in range(3)]
    assert {p["log.dirs"] for p in rendered} == {str(tmp_path / f"node-{i}" / "data") for i in (1, 2, 3)}
    for p in rendered:
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"


@pytest.mark.parametrize(("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2))])
def test_replication_follows_the_cluster(brokers, expected):
    assert replication_for(brokers) == expected


def test_a_cluster_needs_a_broker(tmp_path):
    with pytest.raises(Exception, match="at least one broker"):
        ClusterConfig(directory=tmp_path, brokers=0)


def test_flink_configuration_pins_ports_small_heaps_and_shared_checkpoints(tmp_path):
    config = flink_cluster.FlinkClusterConfig(directory=tmp_path, taskmanagers=2, rest_port=18081, rpc_port=16123)
    conf = flink_cluster.render_configuration(config)
    assert (conf["rest.port"], conf["jobmanager.rpc.port"], conf["rest.address"]) == ("18081", "16123", "127.0.0.1")
    assert conf["jobmanager.memory.heap.size"] == "512m"
    heap = int(conf["taskmanager.memory.framework.heap.size"][:-1]) + int(conf["taskmanager.memory.task.heap.size"][:-1])
    assert heap == 512
    process = heap + sum(int(conf[f"taskmanager.memory.{k}"][:-1]) for k in (
        "managed.size", "framework.off-heap.size", "task.off-heap.size", "network.max", "jvm-metaspace.size",
        "jvm-overhead.max"))
    assert process <= 1024
    assert conf["execution.checkpointing.dir"] == (tmp_path / "checkpoints").resolve().as_uri()
    assert "--add-opens=java.base/java.util=ALL-UNNAMED" in conf["env.java.opts.all"]


def test_configuration_file_round_trips_and_remembers_the_cluster(tmp_path):
    import yaml

    config = flink_cluster.FlinkClusterConfig(directory=tmp_path, taskmanagers=3, rest_port=18081, rpc_port=16123)
    conf_dir = flink_cluster.write_configuration(config)
    written = yaml.safe_load((conf_dir / "config.yaml").read_text())
    assert {k: str(v) for k, v in written.items()} == flink_cluster.render_configuration(config)
    assert (conf_dir / "log4j-console.properties").is_file()
    assert flink_cluster.read_cluster(tmp_path) == config
    status = flink_cluster.cluster_status(directory=tmp_path)
    assert not status.running and status.taskmanagers == {1: None, 2: None, 3: None}


def test_submission_arguments_rebuild_the_same_job_and_detach(tmp_path):
    config = flink_cluster.cluster_job_config(JobConfig(bootstrap="a:1,b:2,c:3", parallelism=2,
                                                         checkpoint_dir=tmp_path / "ckpt"))
    args = flink_cluster.submission_arguments(config)
    assert args[:2] == ["-pym", "ablab.streaming.flink.job"] and args[-1] == "--detached"
    assert _parse_args(args[2:-1]) == config
    assert config.extra_config["restart-strategy.type"] == "exponential-delay"
    # an explicit choice of the caller wins over the cluster default
    mine = flink_cluster.cluster_job_config(JobConfig(extra_config={"restart-strategy.type": "fixed-delay"}))
    assert mine.extra_config["restart-strategy.type"] == "fixed-delay"


def test_job_id_is_read_from_the_flink_client_output():
    found = flink_cluster._JOB_ID.search("Job has been submitted with JobID 0123456789abcdef0123456789abcdef\n")
    assert found and found.group(1) == "0123456789abcdef0123456789abcdef"


def test_flink_home_is_pyflinks_own_distribution():
    home = flink_cluster.flink_home()
    assert (home / "bin" / "flink").is_file() and list((home / "lib").glob("flink-dist-*.jar"))
    assert list((home / "opt").glob("flink-python-*.jar"))


def _cli(tmp_path: Path, *args: str):
    from typer.testing import CliRunner

    from ablab.cli import app

    return CliRunner().invoke(app, list(args), env={"ABLAB_HOME": str(tmp_path)})


def test_cli_refuses_local_and_cluster_together(tmp_path):
    result = _cli(tmp_path, "stream", "submit", "--local", "--cluster", "http://127.0.0.1:1")
    assert result.exit_code == 1 and "exclude each other" in result.output


def test_cli_without_a_cluster_says_how_to_get_one(tmp_path):
    result = _cli(tmp_path, "stream", "status")
    assert result.exit_code == 1 and "ablab flink start" in result.output
    assert _cli(tmp_path, "flink", "status").exit_code == 1


def test_cli_reports_an_unreachable_jobmanager(tmp_path):
    from ablab_testing import closed_port

    result = _cli(tmp_path, "stream", "status", "--cluster", f"http://127.0.0.1:{closed_port()}")
    assert result.exit_code == 1 and "no answer from the JobManager" in result.output
