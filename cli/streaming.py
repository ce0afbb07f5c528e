"""Streaming commands: local Kafka (``ablab kafka …``), a local Flink session cluster
(``ablab flink …``), the window job (``ablab stream …``), the loader, and JVM jar set-up.

One function per command. ``ensure_jars`` is also what ``ablab setup`` calls.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ablab.cli._common import console, fail, out

kafka_app = typer.Typer(help="Run local Kafka (KRaft): one broker, or a cluster with --brokers 3.", no_args_is_help=True)
flink_app = typer.Typer(help="Run a local Flink session cluster (JobManager + TaskManagers from PyFlink's own Flink).",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")
    app.add_typer(flink_app, name="flink")
    register_pipeline(app)


def ensure_jars() -> Path:
    """Resolve the Kafka broker and Flink connector jars once (Maven, cached). For `ablab setup`."""
    from ablab.streaming.kafka import jars

    if jars.jars_ready():
        return jars.jars_dir()
    with console.status("resolving JVM jars with Maven (first run only)…"):
        try:
            return jars.ensure_jars()
        except jars.MissingToolError as exc:
            fail(str(exc))
        except RuntimeError as exc:
            fail(str(exc), hint="check network access to Maven Central, then re-run")


def _broker_config(port: int | None, heap_mb: int):
    from ablab.platform.config import get_settings
    from ablab.streaming.kafka.broker import BrokerConfig

    settings = get_settings()
    host, _, bootstrap_port = settings.kafka_bootstrap.split(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        fail(f"ABLAB_KAFKA_BOOTSTRAP={settings.kafka_bootstrap} is not local; `ablab kafka` only runs a local broker")
    return BrokerConfig(directory=settings.home / "kafka", port=port or int(bootstrap_port), heap_mb=heap_mb)


def _kafka_dirs() -> tuple[Path, Path]:
    from ablab.platform.config import get_settings

    home = get_settings().home
    return home / "kafka", home / "kafka-cluster"


@kafka_app.command("start")
def kafka_start(
    brokers: int = typer.Option(1, min=1, max=9, help="Brokers. 1: one node (default). 3 or more: a KRaft cluster of "
                                "combined broker+controller nodes; topics get replication 3, min.insync.replicas 2."),
    port: int = typer.Option(None, help="Listener port (default: the port of ABLAB_KAFKA_BOOTSTRAP). One broker: its "
                             "controller on port+1. A cluster: brokers on port..port+N-1, controllers after them."),
    heap_mb: int = typer.Option(None, min=128, max=8192, help="JVM heap per broker (default 512 for one, 320 each in a cluster)."),
    timeout_s: float = typer.Option(180.0, help="How long to wait for the brokers to answer."),
) -> None:
    """Start Kafka detached (idempotent; a cluster restarts only its dead nodes) and create the ablab topics."""
    from ablab.streaming.kafka.broker import BrokerError, ClusterConfig, start_broker, start_cluster
    from ablab.streaming.kafka.jars import MissingToolError

    single = _broker_config(port, heap_mb or 512)
    ensure_jars()
    if brokers == 1:
        with console.status(f"starting Kafka on {single.bootstrap}…"):
            try:
                status = start_broker(config=single, timeout_s=timeout_s)
            except (BrokerError, MissingToolError, TimeoutError) as exc:
                fail(str(exc))
        out.print(f"kafka running  pid={status.pid}  bootstrap={status.bootstrap}  dir={status.directory}", soft_wrap=True)
        return
    try:
        config = ClusterConfig(directory=_kafka_dirs()[1], brokers=brokers, port=single.port, heap_mb=heap_mb or 320)
    except BrokerError as exc:
        fail(str(exc))
    with console.status(f"starting a Kafka cluster of {brokers} brokers on {config.bootstrap}…"):
        try:
            cluster = start_cluster(config=config, timeout_s=timeout_s)
        except (BrokerError, MissingToolError, TimeoutError) as exc:
            fail(str(exc), hint="`ablab kafka status` shows which nodes run; their logs are under "
                 f"{config.directory}/node-*/logs")
    for node in cluster.nodes:
        out.print(f"broker {node.directory.name}  pid={node.pid}  {node.bootstrap}", soft_wrap=True)
    out.print(f"kafka cluster running  brokers={cluster.running}  bootstrap={config.bootstrap}", soft_wrap=True)
    console.print(f"[dim]clients use it with[/] export ABLAB_KAFKA_BOOTSTRAP={config.bootstrap}")


@kafka_app.command("stop")
def kafka_stop(timeout_s: float = typer.Option(30.0, help="Seconds before SIGTERM becomes SIGKILL.")) -> None:
    """Stop the local broker or cluster (clean shutdown, then SIGKILL after the timeout)."""
    from ablab.streaming.kafka.broker import stop_broker, stop_cluster

    single, cluster = _kafka_dirs()
    stopped = stop_broker(directory=single, timeout_s=timeout_s)
    nodes = stop_cluster(directory=cluster, timeout_s=timeout_s)
    if nodes:
        out.print(f"kafka cluster stopped ({nodes} brokers)", soft_wrap=True)
    if stopped:
        out.print("kafka stopped", soft_wrap=True)
    if not stopped and not nodes:
        out.print("kafka was not running", soft_wrap=True)


@kafka_app.command("status")
def kafka_status() -> None:
    """Say whether the local broker or cluster runs (exit code 1 when nothing does)."""
    from ablab.streaming.kafka.broker import broker_status, cluster_status

    single, cluster_dir = _kafka_dirs()
    status = broker_status(directory=single)
    cluster = cluster_status(directory=cluster_dir)
    if status.running:
        out.print(f"kafka running  pid={status.pid}  bootstrap={status.bootstrap}  dir={status.directory}", soft_wrap=True)
    for node in cluster.nodes:
        out.print(f"broker {node.directory.name}  " + (f"running  pid={node.pid}  {node.bootstrap}" if node.running else "down"), soft_wrap=True)
    if cluster.nodes:
        out.print(f"kafka cluster  {cluster.running}/{len(cluster.nodes)} brokers running  bootstrap={cluster.bootstrap}", soft_wrap=True)
    if not status.running and not cluster.running:
        if not cluster.nodes:
            out.print("kafka not running", soft_wrap=True)
        raise typer.Exit(1)


# --- a local Flink session cluster -----------------------------------------------------


def _flink_dir() -> Path:
    from ablab.platform.config import get_settings

    return get_settings().home / "flink-cluster"


@flink_app.command("start")
def flink_start(
    taskmanagers: int = typer.Option(2, min=1, max=16, help="TaskManagers (one JVM each)."),
    slots: int = typer.Option(2, min=1, max=16, help="Task slots per TaskManager."),
    rest_port: int = typer.Option(8081, help="JobManager REST port (the Flink web UI and API)."),
    rpc_port: int = typer.Option(6123, help="JobManager RPC port."),
    jm_heap_mb: int = typer.Option(512, min=256, max=16384, help="JobManager JVM heap."),
    tm_heap_mb: int = typer.Option(512, min=256, max=16384, help="TaskManager JVM heap (its process is about 512 MB more)."),
    timeout_s: float = typer.Option(180.0, help="How long to wait for every TaskManager to register."),
) -> None:
    """Start a standalone session cluster on 127.0.0.1, detached (idempotent: missing TaskManagers are started)."""
    from ablab.streaming.flink.cluster import FlinkClusterConfig, FlinkClusterError, start_cluster
    from ablab.streaming.kafka.jars import MissingToolError

    try:
        config = FlinkClusterConfig(directory=_flink_dir(), taskmanagers=taskmanagers, slots=slots, rest_port=rest_port,
                                    rpc_port=rpc_port, jm_heap_mb=jm_heap_mb, tm_heap_mb=tm_heap_mb)
    except FlinkClusterError as exc:
        fail(str(exc))
    with console.status(f"starting a JobManager and {taskmanagers} TaskManagers on {config.rest_url}…"):
        try:
            status = start_cluster(config=config, timeout_s=timeout_s)
        except (FlinkClusterError, MissingToolError) as exc:
            fail(str(exc), hint=f"logs are under {config.directory / 'logs'}")
    out.print(f"flink running  jobmanager pid={status.jobmanager}  taskmanagers={sum(p is not None for p in status.taskmanagers.values())}"
              f"  rest={status.rest_url}  dir={status.directory}", soft_wrap=True)
    console.print(f"[dim]submit the window job with[/] ablab stream submit --cluster {status.rest_url}")


@flink_app.command("stop")
def flink_stop(timeout_s: float = typer.Option(30.0, help="Seconds before SIGTERM becomes SIGKILL.")) -> None:
    """Stop the local session cluster (its jobs stop with it; retained checkpoints stay)."""
    from ablab.streaming.flink.cluster import stop_cluster

    stopped = stop_cluster(directory=_flink_dir(), timeout_s=timeout_s)
    out.print(f"flink stopped ({stopped} JVMs)" if stopped else "flink was not running", soft_wrap=True)


@flink_app.command("status")
def flink_status() -> None:
    """The local session cluster's processes and what its REST API reports (exit code 1 when down)."""
    from ablab.streaming.flink import rest
    from ablab.streaming.flink.cluster import cluster_status

    status = cluster_status(directory=_flink_dir())
    if not status.running:
        out.print("flink not running", soft_wrap=True)
        raise typer.Exit(1)
    for index, pid in status.taskmanagers.items():
        out.print(f"taskmanager-{index}  " + (f"running  pid={pid}" if pid else "down"), soft_wrap=True)
    try:
        overview = rest.get(status.rest_url or "", "/overview")
        summary = (f"taskmanagers={overview['taskmanagers']}  slots={overview['slots-available']}/{overview['slots-total']} free"
                   f"  jobs running={overview['jobs-running']}")
    except rest.RestError as exc:
        summary = f"REST API not answering yet ({exc})"
    out.print(f"flink running  jobmanager pid={status.jobmanager}  rest={status.rest_url}  {summary}", soft_wrap=True)


# --- the Flink window job and the Kafka → ClickHouse loader ---------------------------

stream_app = typer.Typer(help="The PyFlink 10 s window job: locally, or on a Flink cluster.", no_args_is_help=True)


def register_pipeline(app: typer.Typer) -> None:
    app.add_typer(stream_app, name="stream")
    app.command("loader")(loader)


@stream_app.command("submit")
def stream_submit(
    local: bool = typer.Option(False, "--local", help="Run in a local mini-cluster inside this process (the default "
                               "without --cluster)."),
    cluster: str = typer.Option(None, "--cluster", metavar="URL", help="Submit to the Flink session cluster whose "
                                "JobManager REST API is URL (e.g. http://127.0.0.1:8081, as `ablab flink start` prints); "
                                "prints the job id and returns."),
    out_of_orderness_s: float = typer.Option(
        5.0, min=0, help="Watermark bound: how far out of order events may arrive (the emitters batch for 1-2 s; "
        "later ones are late rows, folded into their window at query time)."),
    checkpoint_interval_s: float = typer.Option(2.0, min=0.1, help="Checkpoint (and Kafka commit) interval."),
    parallelism: int = typer.Option(None, min=1, help="Flink parallelism (default 1 locally, 2 on a cluster)."),
    idle_timeout_s: float = typer.Option(
        5.0, min=0,
        help="Seconds after which a silent partition/topic stops holding the watermark, so live windows close "
        "within seconds. 0 = never idle (exact, for bounded replays). Cost: an event reaching an idle partition "
        "after the watermark passed its window is kept as a late row, not counted in its window.",
    ),
    bounded: bool = typer.Option(False, help="Stop at the offsets that are the latest at start (backfills)."),
    fresh: bool = typer.Option(False, help="Ignore retained checkpoints and start from the earliest offsets."),
    checkpoint_dir: Path = typer.Option(None, help="Checkpoint directory, shared by every JobManager and TaskManager "
                                        "(default ABLAB_HOME/flink/checkpoints)."),
    from_savepoint: Path = typer.Option(None, help="With --cluster: start from this savepoint (see `ablab stream savepoint`)."),
) -> None:
    """Run the window job; it resumes from the newest checkpoint in its checkpoint directory."""
    from ablab.platform.config import get_settings
    from ablab.streaming.flink.job import JobConfig, JobConfigError, submit
    from ablab.streaming.kafka.topics import EVENT_TOPICS, WINDOWS_TOPIC

    if local and cluster:
        fail("--local and --cluster exclude each other")
    settings = get_settings()
    try:
        config = JobConfig(
            bootstrap=settings.kafka_bootstrap, inference_topic=EVENT_TOPICS["inference"],
            windows_topic=WINDOWS_TOPIC, out_of_orderness_s=out_of_orderness_s,
            checkpoint_interval_s=checkpoint_interval_s, parallelism=parallelism or (2 if cluster else 1), bounded=bounded,
            idle_timeout_s=idle_timeout_s,
            checkpoint_dir=(checkpoint_dir or settings.home / "flink" / "checkpoints").resolve(), restore=not fresh,
        )
    except JobConfigError as exc:
        fail(str(exc))
    ensure_jars()
    if cluster:
        _submit_to_cluster(cluster, config, from_savepoint)
        return
    console.print(f"[green]flink[/] window job on {config.bootstrap} (Ctrl-C stops it; state is checkpointed)")
    try:
        submit(config, wait=True)
    except KeyboardInterrupt:
        console.print("stopped")


def _submit_to_cluster(url: str, config, from_savepoint: Path | None) -> None:
    from ablab.streaming.flink import cluster as flink_cluster

    local = flink_cluster.read_cluster(_flink_dir())
    ours = local is not None and local.rest_url == url.rstrip("/")
    with console.status(f"submitting the window job to {url} (parallelism {config.parallelism})…"):
        try:
            job_id = flink_cluster.submit(
                rest_url=url, config=flink_cluster.cluster_job_config(config), from_savepoint=from_savepoint,
                conf_dir=local.conf_dir if ours else None, log_dir=_flink_dir() / "logs" / "client")
        except flink_cluster.FlinkClusterError as exc:
            fail(str(exc), hint="is the cluster up (`ablab flink status`) and Kafka reachable from it?")
    console.print(f"[green]submitted[/] checkpoints in {config.checkpoint_dir}; follow it with `ablab stream status --cluster {url}`")
    typer.echo(job_id)  # plain: scripts read the last line


def _cluster_url(cluster: str | None) -> str:
    if cluster:
        return cluster.rstrip("/")
    from ablab.streaming.flink.cluster import read_cluster

    local = read_cluster(_flink_dir())
    if local is None:
        fail("no --cluster given and no local session cluster", hint="pass --cluster URL, or `ablab flink start`")
    return local.rest_url


def _pick_job(url: str, job: str | None) -> str:
    from ablab.streaming.flink import rest

    if job:
        return job
    try:
        live = [j for j in rest.jobs(url) if j.get("state") not in ("FINISHED", "CANCELED", "FAILED")]
    except rest.RestError as exc:
        fail(str(exc))
    if len(live) != 1:
        fail(f"{len(live)} jobs are running on {url}; name one with --job",
             hint="`ablab stream status` lists them" if live else "submit one with `ablab stream submit --cluster URL`")
    return live[0]["jid"]


_CLUSTER_OPTION = typer.Option(None, "--cluster", metavar="URL", help="JobManager REST URL (default: the local session cluster).")
_JOB_OPTION = typer.Option(None, "--job", help="Job id (default: the one job running).")


@stream_app.command("status")
def stream_status(cluster: str = _CLUSTER_OPTION, job: str = _JOB_OPTION,
                  json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Jobs on the cluster: state, running tasks, completed and restored checkpoints."""
    import json

    from ablab.streaming.flink import rest

    url = _cluster_url(cluster)
    try:
        ids = [job] if job else [j["jid"] for j in rest.jobs(url)]
        statuses = [rest.job_status(url, jid) for jid in ids]
    except rest.RestError as exc:
        fail(str(exc))
    if json_output:
        typer.echo(json.dumps([s.as_dict() for s in statuses]))
        return
    if not statuses:
        out.print(f"no jobs on {url}", soft_wrap=True)
    for s in statuses:
        restored = f"  restored from checkpoint {s.restored_checkpoint}" if s.restored_checkpoint is not None else ""
        out.print(f"{s.job_id}  {s.name}  {s.state}  tasks {s.running_tasks}/{s.total_tasks} running"
                  f"  checkpoints {s.completed_checkpoints} (latest {s.latest_checkpoint}){restored}", soft_wrap=True)


@stream_app.command("savepoint")
def stream_savepoint(cluster: str = _CLUSTER_OPTION, job: str = _JOB_OPTION,
                     directory: str = typer.Option(None, "--dir", help="Target directory (default: the cluster's savepoint dir)."),
                     timeout_s: float = typer.Option(300.0, help="How long to wait for the savepoint.")) -> None:
    """Take a savepoint of a running job; prints its path (start from it with `submit --from-savepoint`)."""
    from ablab.streaming.flink import rest

    url = _cluster_url(cluster)
    job_id = _pick_job(url, job)
    with console.status(f"savepoint of {job_id}…"):
        try:
            location = rest.wait_operation(url, job_id, rest.trigger_savepoint(url, job_id, target_dir=directory),
                                           timeout_s=timeout_s)
        except rest.RestError as exc:
            fail(str(exc))
    typer.echo(location)  # plain and unwrapped: scripts read the path


@stream_app.command("stop")
def stream_stop(cluster: str = _CLUSTER_OPTION, job: str = _JOB_OPTION,
                savepoint: bool = typer.Option(True, help="Stop with a final savepoint (printed); --no-savepoint cancels "
                                               "(the retained checkpoints still let the next submit resume)."),
                directory: str = typer.Option(None, "--dir", help="Savepoint directory (default: the cluster's)."),
                timeout_s: float = typer.Option(300.0, help="How long to wait for the final savepoint.")) -> None:
    """Stop a job on the cluster."""
    from ablab.streaming.flink import rest

    url = _cluster_url(cluster)
    job_id = _pick_job(url, job)
    try:
        if not savepoint:
            rest.cancel(url, job_id)
            out.print(f"{job_id} cancelled", soft_wrap=True)
            return
        with console.status(f"stopping {job_id} with a savepoint…"):
            location = rest.wait_operation(url, job_id, rest.trigger_stop(url, job_id, target_dir=directory),
                                           timeout_s=timeout_s)
    except rest.RestError as exc:
        fail(str(exc))
    console.print(f"{job_id} stopped; resume with `ablab stream submit --cluster {url} --from-savepoint {location}`")
    typer.echo(location)  # plain and unwrapped: scripts read the path


def loader(
    batch_max_records: int = typer.Option(20_000, min=1, help="Rows per ClickHouse insert at most."),
    batch_max_s: float = typer.Option(0.5, min=0.01, help="Longest a row waits before its batch is written."),
    rollup_interval_s: float = typer.Option(
        5.0, min=0.0,
        help="While behind, recompute the per-unit rollup and commit offsets at most this often (0: after every "
             "batch). Caught up, every batch is committed at once."),
    group_id: str = typer.Option("ablab-loader", help="Kafka consumer group."),
) -> None:
    """Kafka → ClickHouse loader (server mode; in embedded mode the API process runs it)."""
    import signal
    import threading

    from ablab.platform.config import get_settings
    from ablab.streaming.loader.service import Loader
    from ablab.streaming.store import apply_ddl, get_clickhouse_client

    settings = get_settings()
    try:
        client = get_clickhouse_client(settings)
        apply_ddl(client)
    except Exception as exc:
        fail(f"cannot open the ClickHouse store: {exc}",
             hint="in embedded mode (chdb://) the API process owns the store and runs the loader itself")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = Loader(client, settings.kafka_bootstrap, group_id=group_id,
                    batch_max_records=batch_max_records, batch_max_s=batch_max_s, rollup_interval_s=rollup_interval_s)
    console.print(f"[green]loader[/] {settings.kafka_bootstrap} → {settings.public_dict()['clickhouse_url'] or 'chdb (embedded)'}")
    stats = worker.supervise(stop)
    out.print(stats.as_dict())
