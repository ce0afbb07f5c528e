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
