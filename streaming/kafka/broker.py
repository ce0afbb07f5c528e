"""Run real Apache Kafka 4.x brokers (KRaft) on 127.0.0.1: one node, or a local cluster.

One node (the default) lives in one directory (``ABLAB_HOME/kafka`` for ``ablab kafka start``, a temp
dir in tests)::

    <dir>/server.properties   rendered from deploy/kafka/server.properties.template
    <dir>/data/               log.dirs, formatted once with `StorageTool format --standalone`
    <dir>/logs/server.log     broker log (log4j2, deploy/kafka/log4j2.properties)
    <dir>/broker.out          JVM stdout/stderr (start-up failures end up here)
    <dir>/broker.pid          pid of the detached JVM

:func:`start_broker` is idempotent (a live broker on the same dir is reused), waits until
the broker answers metadata requests and creates the topics. :func:`stop_broker` sends
SIGTERM (a clean shutdown flushes logs) and SIGKILL after a timeout.

A local cluster (:func:`start_cluster`, ``ablab kafka start --brokers 3``) is N such nodes
under ``<dir>/node-<id>/``, each broker and controller in one JVM, with a static quorum of
all N controllers, formatted with one shared cluster id (``<dir>/cluster.id``). With three
or more nodes every topic, internal ones included, has replication factor 3 and
``min.insync.replicas`` 2, so any one node may die without losing an acknowledged write
or stopping producers, transactions or consumer groups. Clients take the bootstrap list
(:attr:`ClusterConfig.bootstrap`), unchanged otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import string
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ablab.streaming.kafka import jars
from ablab.streaming.kafka.topics import TOPICS, TopicSpec, create_topics
from ablab.streaming.localhost import kill_pid, pid_alive, stop_pids

TEMPLATE = jars.REPO_ROOT / "deploy" / "kafka" / "server.properties.template"
LOG4J2_CONFIG = jars.REPO_ROOT / "deploy" / "kafka" / "log4j2.properties"
MAIN_CLASS = "kafka.Kafka"


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerConfig:
    directory: Path
    port: int = 9092
    controller_port: int | None = None  # default: port + 1
    host: str = "127.0.0.1"
    heap_mb: int = 512
    node_id: int = 1
    voters: tuple[tuple[int, int], ...] = ()
    """A cluster's controllers as (node id, controller port); empty for one node."""

    @property
    def replication(self) -> int:
        return min(3, max(1, len(self.voters)))

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def resolved_controller_port(self) -> int:
        return self.controller_port or self.port + 1

    @property
    def pidfile(self) -> Path:
        return self.directory / "broker.pid"


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None
    directory: Path


def render_properties(config: BrokerConfig) -> str:
    if config.voters:
        quorum = "controller.quorum.voters=" + ",".join(f"{node}@{config.host}:{port}" for node, port in config.voters)
    else:
        quorum = f"controller.quorum.bootstrap.servers={config.host}:{config.resolved_controller_port}"
    return string.Template(TEMPLATE.read_text()).substitute(
        host=config.host,
        port=config.port,
        controller_port=config.resolved_controller_port,
        log_dirs=str(config.directory / "data"),
        node_id=config.node_id,
        quorum=quorum,
        replication=config.replication,
        min_isr=min_insync_replicas(config.replication),
    )


def min_insync_replicas(replication: int) -> int:
    """2 of 3 replicas must take a write: one node may be down, an acked write survives another."""
    return 2 if replication >= 3 else 1


def start_broker(
    *, config: BrokerConfig, topics: tuple[TopicSpec, ...] = TOPICS, timeout_s: float = 90.0
) -> BrokerStatus:
    """Start the broker detached (or reuse the one already running there); create topics."""
    current = broker_status(directory=config.directory)
    if current.running:
        create_topics(bootstrap=current.bootstrap or config.bootstrap, specs=topics)
        return current
    for port in (config.port, config.resolved_controller_port):
        if _port_open(config.host, port):
            raise BrokerError(f"port {config.host}:{port} is already in use by another process; "
                              "pick another with --port (or ABLAB_KAFKA_BOOTSTRAP)")
    jars.ensure_jars()
    jars.java_version()
    process = _launch(config)
    try:
        _wait_until_ready(config, process, deadline=time.monotonic() + timeout_s)
        create_topics(bootstrap=config.bootstrap, specs=topics)
    except BaseException:
        stop_broker(directory=config.directory)
        raise
    return BrokerStatus(True, process.pid, config.bootstrap, config.directory)


def _launch(config: BrokerConfig, *, cluster_id: str | None = None) -> subprocess.Popen:
    """Render, format (first time only) and start one node's JVM, detached."""
    config.directory.mkdir(parents=True, exist_ok=True)
    (config.directory / "logs").mkdir(exist_ok=True)
    properties = config.directory / "server.properties"
    properties.write_text(render_properties(config))
    _format_storage(config, properties, cluster_id=cluster_id)
    out = open(config.directory / "broker.out", "ab")
    process = subprocess.Popen(
        [*_java_command(config), MAIN_CLASS, str(properties)],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        cwd=config.directory, start_new_session=True,  # outlives the CLI, not killed by its ^C
    )
    out.close()
    config.pidfile.write_text(f"{process.pid}\n{config.bootstrap}\n")
    return process


def stop_broker(*, directory: Path, timeout_s: float = 30.0) -> bool:
    """Stop the broker of ``directory``; True when one was running."""
    status = broker_status(directory=directory)
    pidfile = directory / "broker.pid"
    if not status.running or status.pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    stop_pids([status.pid], timeout_s=timeout_s)
    pidfile.unlink(missing_ok=True)
    return True


def kill_broker(*, directory: Path) -> bool:
    """SIGKILL, no clean shutdown: what a crash looks like (fault tests)."""
    status = broker_status(directory=directory)
    if not status.running or status.pid is None:
        return False
    kill_pid(status.pid)
    (directory / "broker.pid").unlink(missing_ok=True)
    return True


def broker_status(*, directory: Path) -> BrokerStatus:
    pidfile = directory / "broker.pid"
    try:
        pid_text, bootstrap = pidfile.read_text().split("\n")[:2]
        pid = int(pid_text)
    except (FileNotFoundError, ValueError):
        return BrokerStatus(False, None, None, directory)
    running = pid_alive(pid) and _is_our_broker(pid, directory)
    return BrokerStatus(running, pid if running else None, bootstrap if running else None, directory)


# --- a local cluster of N nodes --------------------------------------------------------


@dataclass(frozen=True)
class ClusterConfig:
    """N combined broker+controller nodes: node i (1-based) listens on ``port + i - 1``, its
    controller on ``port + brokers + i - 1``; data and logs under ``directory/node-<i>``."""

    directory: Path
    brokers: int = 3
    port: int = 9092
    host: str = "127.0.0.1"
    heap_mb: int = 320

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise BrokerError(f"a cluster needs at least one broker, got brokers={self.brokers}")

    @property
    def voters(self) -> tuple[tuple[int, int], ...]:
        return tuple((i, self.port + self.brokers + i - 1) for i in range(1, self.brokers + 1))

    def node(self, node_id: int) -> BrokerConfig:
        return BrokerConfig(directory=self.directory / f"node-{node_id}", port=self.port + node_id - 1,
                            controller_port=self.port + self.brokers + node_id - 1, host=self.host,
                            heap_mb=self.heap_mb, node_id=node_id, voters=self.voters)

    @property
    def nodes(self) -> list[BrokerConfig]:
        return [self.node(i) for i in range(1, self.brokers + 1)]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def manifest(self) -> Path:
        return self.directory / "cluster.json"


@dataclass(frozen=True)
class ClusterStatus:
    directory: Path
    nodes: tuple[BrokerStatus, ...]

    @property
    def running(self) -> int:
        return sum(node.running for node in self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes if node.running and node.bootstrap)


def read_cluster(directory: Path) -> ClusterConfig | None:
    """The cluster formatted in ``directory`` (None when there is none)."""
    try:
        saved = json.loads((directory / "cluster.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return ClusterConfig(directory=directory, brokers=saved["brokers"], port=saved["port"], host=saved["host"],
                         heap_mb=saved.get("heap_mb", 320))


def start_cluster(*, config: ClusterConfig, topics: tuple[TopicSpec, ...] = TOPICS,
                  timeout_s: float = 180.0) -> ClusterStatus:
    """Start every node that is not running (all, or the ones that died), wait until all N
    brokers are registered, create the topics. Idempotent: a full cluster is reused."""
    saved = read_cluster(config.directory)
    if saved is not None and (saved.brokers, saved.port, saved.host) != (config.brokers, config.port, config.host):
        raise BrokerError(f"{config.directory} holds a cluster of {saved.brokers} brokers from port {saved.port}; "
                          f"stop it and remove the folder to make another (or use --brokers {saved.brokers} --port {saved.port})")
    if saved is None:
        config.directory.mkdir(parents=True, exist_ok=True)
        config.manifest.write_text(json.dumps({"cluster_id": _new_cluster_id(), "brokers": config.brokers,
                                               "port": config.port, "host": config.host, "heap_mb": config.heap_mb}))
    cluster_id = json.loads(config.manifest.read_text())["cluster_id"]
    launched: list[tuple[BrokerConfig, subprocess.Popen]] = []
    for node in config.nodes:
        if broker_status(directory=node.directory).running:
            continue
        for port in (node.port, node.resolved_controller_port):
            if _port_open(node.host, port):
                raise BrokerError(f"port {node.host}:{port} (node {node.node_id}) is already in use by another "
                                  "process; pick another first port with --port")
        if not launched:
            jars.ensure_jars()
            jars.java_version()
        launched.append((node, _launch(node, cluster_id=cluster_id)))
    deadline = time.monotonic() + timeout_s
    try:
        for node, process in launched:
            _wait_until_ready(node, process, deadline=deadline)
        _wait_for_brokers(config, deadline=deadline)
        create_topics(bootstrap=config.bootstrap, specs=topics)
    except BaseException:
        for node, _ in launched:
            stop_broker(directory=node.directory, timeout_s=5)
        raise
    return cluster_status(directory=config.directory)


def _wait_for_brokers(config: ClusterConfig, *, deadline: float) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    registered: set[int] = set()
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(bootstrap_servers=config.bootstrap, request_timeout_ms=5000)
            try:
                registered = {b["broker_id"] for b in admin.describe_cluster()["brokers"]}
            finally:
                admin.close()
            if len(registered) >= config.brokers:
                return
        except KafkaError:
            pass
        time.sleep(0.25)
    raise BrokerError(f"only brokers {sorted(registered)} of {config.brokers} registered in time; "
                      f"see {config.directory}/node-*/logs")


def stop_cluster(*, directory: Path, timeout_s: float = 30.0) -> int:
    """Stop every node (SIGTERM to all, SIGKILL what is left after ``timeout_s``); how many ran.

    All at once: a node stopped alone waits for the others to move its partitions' leaders,
    and the last ones cannot finish a controlled shutdown without a quorum anyway."""
    status = cluster_status(directory=directory)
    running = [node for node in status.nodes if node.running and node.pid is not None]
    stop_pids([node.pid for node in running], timeout_s=timeout_s)
    for node in running:
        (node.directory / "broker.pid").unlink(missing_ok=True)
    return len(running)


def cluster_status(*, directory: Path) -> ClusterStatus:
    config = read_cluster(directory)
    if config is None:
        return ClusterStatus(directory, ())
    return ClusterStatus(directory, tuple(broker_status(directory=node.directory) for node in config.nodes))


def _java_command(config: BrokerConfig) -> list[str]:
    return [
        "java",
        f"-Xms{min(256, config.heap_mb)}m", f"-Xmx{config.heap_mb}m",
        "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
        "-XX:ActiveProcessorCount=2", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        f"-Dkafka.logs.dir={config.directory / 'logs'}",
        "-cp", jars.kafka_classpath(),
    ]


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _format_storage(config: BrokerConfig, properties: Path, *, cluster_id: str | None = None) -> None:
    if (config.directory / "data" / "meta.properties").is_file():
        return  # formatted before: keep the data (restart, not reset)
    # One node formats a dynamic quorum of itself; a cluster's nodes share one id and the
    # static voter set of their properties.
    quorum = [] if config.voters else ["--standalone"]
    done = subprocess.run(
        [*_java_command(config), "kafka.tools.StorageTool", "format", *quorum,
         f"--cluster-id={cluster_id or _new_cluster_id()}", "-c", str(properties)],  # "=": an id may start with "-" (1 in 32)
        capture_output=True, text=True, cwd=config.directory,
    )
    if done.returncode != 0:
        raise BrokerError(f"formatting the KRaft storage failed:\n{(done.stdout + done.stderr)[-2000:]}")


def _wait_until_ready(config: BrokerConfig, process: subprocess.Popen, *, deadline: float) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrokerError(f"the broker exited with code {process.returncode} during start-up; "
                              f"see {config.directory / 'broker.out'} and {config.directory / 'logs'}:\n"
                              + _tail(config.directory / "broker.out"))
        if _port_open(config.host, config.port):
            try:
                KafkaAdminClient(bootstrap_servers=config.bootstrap, request_timeout_ms=5000).close()
                return
            except KafkaError:
                pass
        time.sleep(0.25)
    raise BrokerError(f"the broker did not answer on {config.bootstrap} in time; see {config.directory / 'logs'}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on whose successor is free too (broker + controller)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port < 65535 and not _port_open(host, port + 1):
            try:
                with socket.socket() as probe:
                    probe.bind((host, port + 1))
                return port
            except OSError:
                continue
    raise BrokerError("no free pair of ports found")




def _is_our_broker(pid: int, directory: Path) -> bool:
    """Guard against a recycled pid: the process must be a Kafka JVM started in ``directory``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except (FileNotFoundError, PermissionError, ProcessLookupError, OSError):
        return not Path("/proc/self").exists()  # no /proc at all (macOS): trust the pidfile
    return MAIN_CLASS.encode() in cmdline and cwd.resolve() == directory.resolve()


