"""Streaming commands: the local Kafka broker (``ablab kafka …``) and JVM jar set-up.

One function per command. ``ensure_jars`` is also what ``ablab setup`` calls.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ablab.platform.cli._common import console, fail, out

kafka_app = typer.Typer(help="Run the local single-node Kafka broker (KRaft).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")
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


@kafka_app.command("start")
def kafka_start(
    port: int = typer.Option(None, help="Listener port (default: the port of ABLAB_KAFKA_BOOTSTRAP); controller on port+1."),
    heap_mb: int = typer.Option(512, min=128, max=8192, help="JVM heap of the broker."),
    timeout_s: float = typer.Option(90.0, help="How long to wait for the broker to answer."),
) -> None:
    """Start the broker detached (idempotent) and create the ablab topics."""
    from ablab.streaming.kafka.broker import BrokerError, start_broker
    from ablab.streaming.kafka.jars import MissingToolError

    config = _broker_config(port, heap_mb)
    ensure_jars()
    with console.status(f"starting Kafka on {config.bootstrap}…"):
        try:
            status = start_broker(config=config, timeout_s=timeout_s)
        except (BrokerError, MissingToolError, TimeoutError) as exc:
            fail(str(exc))
    out.print(f"kafka running  pid={status.pid}  bootstrap={status.bootstrap}  dir={status.directory}")


@kafka_app.command("stop")
def kafka_stop(timeout_s: float = typer.Option(30.0, help="Seconds before SIGTERM becomes SIGKILL.")) -> None:
    """Stop the local broker (clean shutdown, then SIGKILL after the timeout)."""
    from ablab.platform.config import get_settings
    from ablab.streaming.kafka.broker import stop_broker

    directory = get_settings().home / "kafka"
    stopped = stop_broker(directory=directory, timeout_s=timeout_s)
    out.print("kafka stopped" if stopped else "kafka was not running")


@kafka_app.command("status")
def kafka_status() -> None:
    """Say whether the local broker runs (exit code 1 when it does not)."""
    from ablab.platform.config import get_settings
    from ablab.streaming.kafka.broker import broker_status

    status = broker_status(directory=get_settings().home / "kafka")
    if not status.running:
        out.print("kafka not running")
        raise typer.Exit(1)
    out.print(f"kafka running  pid={status.pid}  bootstrap={status.bootstrap}  dir={status.directory}")


# --- the Flink window job and the Kafka → ClickHouse loader ---------------------------

stream_app = typer.Typer(help="The PyFlink 10 s window job.", no_args_is_help=True)


def register_pipeline(app: typer.Typer) -> None:
    app.add_typer(stream_app, name="stream")
    app.command("loader")(loader)


@stream_app.command("submit")
def stream_submit(
    local: bool = typer.Option(True, "--local/--cluster", help="Run in a local mini-cluster (default), or print the `flink run` command for a cluster."),
    out_of_orderness_s: float = typer.Option(
        5.0, min=0, help="Watermark bound: how far out of order events may arrive (the emitters batch for 1-2 s; "
        "later ones are late rows, folded into their window at query time)."),
    checkpoint_interval_s: float = typer.Option(2.0, min=0.1, help="Checkpoint (and Kafka commit) interval."),
    parallelism: int = typer.Option(1, min=1, help="Flink parallelism."),
    idle_timeout_s: float = typer.Option(
        5.0, min=0,
        help="Seconds after which a silent partition/topic stops holding the watermark, so live windows close "
        "within seconds. 0 = never idle (exact, for bounded replays). Cost: an event reaching an idle partition "
        "after the watermark passed its window is kept as a late row, not counted in its window.",
    ),
    bounded: bool = typer.Option(False, help="Stop at the offsets that are the latest at start (backfills)."),
    fresh: bool = typer.Option(False, help="Ignore retained checkpoints and start from the earliest offsets."),
) -> None:
    """Run the window job; resumes from the newest checkpoint under ABLAB_HOME/flink/checkpoints."""
    from ablab.platform.config import get_settings
    from ablab.streaming.flink.job import JobConfig, JobConfigError, submit
    from ablab.streaming.flink.local import job_arguments
    from ablab.streaming.kafka.topics import EVENT_TOPICS, WINDOWS_TOPIC

    settings = get_settings()
    try:
        config = JobConfig(
            bootstrap=settings.kafka_bootstrap, inference_topic=EVENT_TOPICS["inference"],
            windows_topic=WINDOWS_TOPIC, out_of_orderness_s=out_of_orderness_s,
            checkpoint_interval_s=checkpoint_interval_s, parallelism=parallelism, bounded=bounded,
            idle_timeout_s=idle_timeout_s,
            checkpoint_dir=settings.home / "flink" / "checkpoints", restore=not fresh,
        )
    except JobConfigError as exc:
        fail(str(exc))
    if not local:
        args = " ".join(a for a in job_arguments(config) if not a.startswith("--checkpoint-dir") and a != str(config.checkpoint_dir))
        out.print(f"flink run -pym ablab.streaming.flink.job -- {args}")
        console.print("[dim]on a cluster, checkpoint storage comes from the cluster's configuration[/]")
        return
    ensure_jars()
    console.print(f"[green]flink[/] window job on {config.bootstrap} (Ctrl-C stops it; state is checkpointed)")
    try:
        submit(config, wait=True)
    except KeyboardInterrupt:
        console.print("stopped")


def loader(
    batch_max_records: int = typer.Option(20_000, min=1, help="Rows per ClickHouse insert at most."),
    batch_max_s: float = typer.Option(0.5, min=0.01, help="Longest a row waits before its batch is written."),
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
    except Exception as exc:  # noqa: BLE001 — the store's own error names the cause
        fail(f"cannot open the ClickHouse store: {exc}",
             hint="in embedded mode (chdb://) the API process owns the store and runs the loader itself")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = Loader(client, settings.kafka_bootstrap, group_id=group_id,
                    batch_max_records=batch_max_records, batch_max_s=batch_max_s)
    console.print(f"[green]loader[/] {settings.kafka_bootstrap} → {settings.public_dict()['clickhouse_url'] or 'chdb (embedded)'}")
    stats = worker.run(stop)
    out.print(stats.as_dict())
