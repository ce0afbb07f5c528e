"""A Flink standalone session cluster on this machine, from the distribution PyFlink ships.

PyFlink's wheel carries a whole Flink (``pyflink/bin``, ``lib``, ``opt``): the same
JobManager and TaskManager a production cluster runs, so nothing is downloaded. This
module starts them as detached JVMs (``bin/jobmanager.sh start-foreground`` and
``bin/taskmanager.sh start-foreground``, which exec the JVM, so the pid we keep is the
JVM's) with a configuration of its own; the shared PyFlink install is only read::

    <dir>/cluster.json        the cluster's settings (ports, TaskManager count, memory)
    <dir>/conf/config.yaml    rendered here; log4j files copied from pyflink/conf
    <dir>/jobmanager.pid      taskmanager-<i>.pid: pids of the detached JVMs
    <dir>/logs/               JVM logs (<role>.out and Flink's own log files)
    <dir>/checkpoints/        default checkpoint storage: the cluster's shared directory
    <dir>/savepoints/

:func:`start_cluster` is idempotent (a live JobManager is kept, missing TaskManagers are
started) and waits until the REST API reports every TaskManager registered. Jobs are
submitted with ``bin/flink run --detached -pym ablab.streaming.flink.job -- <job flags>``
(:func:`submit`): the same entry point and flags the Kubernetes operator's
``FlinkDeployment`` passes to ``PythonDriver``. Status, savepoints and stops go through the
JobManager's REST API (:mod:`ablab.streaming.flink.rest`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ablab.streaming.flink import rest
from ablab.streaming.flink.job import JobConfig
from ablab.streaming.flink.local import job_arguments
from ablab.streaming.localhost import kill_pid, pid_alive, stop_pids

JOB_MODULE = "ablab.streaming.flink.job"
_JM_CLASS = b"org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
_TM_CLASS = b"org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
_JOB_ID = re.compile(r"JobID\s+([0-9a-f]{32})")
# A cluster job survives a lost TaskManager or broker by restarting from its last
# checkpoint as often as needed; the job's own default (3 quick attempts, then FAILED)
# suits a local run that its supervisor restarts.
CLUSTER_JOB_OPTIONS: dict[str, str] = {
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.exponential-delay.initial-backoff": "1 s",
    "restart-strategy.exponential-delay.max-backoff": "10 s",
}


class FlinkClusterError(RuntimeError):
    """The cluster could not be started, reached or used; the message says what to do."""


def flink_home() -> Path:
    """The Flink distribution inside the installed PyFlink package."""
    import pyflink

    home = Path(pyflink.__file__).resolve().parent
    if not (home / "bin" / "jobmanager.sh").is_file() or not list((home / "lib").glob("flink-dist-*.jar")):
        raise FlinkClusterError(f"{home} has no Flink distribution (bin/, lib/); reinstall apache-flink")
    return home


@dataclass(frozen=True)
class FlinkClusterConfig:
    directory: Path
    taskmanagers: int = 2
    slots: int = 2
    """Slots per TaskManager. Two with parallelism 2: when one TaskManager dies, the
    survivor can run the whole job while the lost one is replaced."""
    host: str = "127.0.0.1"
    rest_port: int = 8081
    rpc_port: int = 6123
    jm_heap_mb: int = 512
    tm_heap_mb: int = 512
    """JVM heap of a TaskManager (framework 128 MB + task); its process is about 1 GB."""

    def __post_init__(self) -> None:
        if self.taskmanagers < 1:
            raise FlinkClusterError(f"taskmanagers must be >= 1, got {self.taskmanagers}")
        if self.slots < 1:
            raise FlinkClusterError(f"slots must be >= 1, got {self.slots}")
        if self.tm_heap_mb < 256:
            raise FlinkClusterError(f"tm_heap_mb must be >= 256, got {self.tm_heap_mb}")

    @property
    def rest_url(self) -> str:
        return f"http://{self.host}:{self.rest_port}"

    @property
    def conf_dir(self) -> Path:
        return self.directory / "conf"

    def pidfile(self, role: str) -> Path:
        return self.directory / f"{role}.pid"


@dataclass(frozen=True)
class FlinkClusterStatus:
    directory: Path
    rest_url: str | None
    jobmanager: int | None
    """pid of the JobManager JVM, None when it is not running"""
    taskmanagers: dict[int, int | None]
    """index → pid (None: that TaskManager is not running)"""

    @property
    def running(self) -> bool:
        return self.jobmanager is not None


def render_configuration(config: FlinkClusterConfig) -> dict[str, str]:
    """The cluster's ``config.yaml`` as flat keys (Flink 2 reads flat and nested YAML)."""
    directory = config.directory.resolve()
    task_heap = config.tm_heap_mb - 128
    return {
        "env.java.opts.all": _shipped_java_opts(),
        "jobmanager.rpc.address": config.host,
        "jobmanager.rpc.port": str(config.rpc_port),
        "jobmanager.bind-host": config.host,
        "rest.address": config.host,
        "rest.bind-address": config.host,
        "rest.port": str(config.rest_port),
        "taskmanager.host": config.host,
        "taskmanager.bind-host": config.host,
        "taskmanager.numberOfTaskSlots": str(config.slots),
        # Spread a job's subtasks over the TaskManagers instead of filling one first.
        "taskmanager.load-balance.mode": "SLOTS",
        "parallelism.default": "2",
        # Small heaps: the machine is shared. JobManager ~0.9 GB process, TaskManager ~1 GB.
        "jobmanager.memory.heap.size": f"{config.jm_heap_mb}m",
        "jobmanager.memory.off-heap.size": "64m",
        "jobmanager.memory.jvm-metaspace.size": "192m",
        "jobmanager.memory.jvm-overhead.min": "128m",
        "jobmanager.memory.jvm-overhead.max": "128m",
        "taskmanager.memory.framework.heap.size": "128m",
        "taskmanager.memory.task.heap.size": f"{task_heap}m",
        "taskmanager.memory.managed.size": "64m",
        "taskmanager.memory.framework.off-heap.size": "64m",
        "taskmanager.memory.task.off-heap.size": "0m",
        "taskmanager.memory.network.min": "64m",
        "taskmanager.memory.network.max": "64m",
        "taskmanager.memory.jvm-metaspace.size": "192m",
        "taskmanager.memory.jvm-overhead.min": "128m",
        "taskmanager.memory.jvm-overhead.max": "128m",
        # A killed TaskManager is noticed in seconds (two missed heartbeat RPCs), not the
        # default 50 s; 20 s without any answer tolerates GC pauses on a busy machine.
        "heartbeat.interval": "2000",
        "heartbeat.timeout": "20000",
        "execution.checkpointing.dir": (directory / "checkpoints").as_uri(),
        "execution.checkpointing.savepoint-dir": (directory / "savepoints").as_uri(),
        "jobmanager.execution.failover-strategy": "region",
        "web.submit.enable": "false",
    }


def _shipped_java_opts() -> str:
    """The ``--add-opens`` flags PyFlink's own config.yaml gives every JVM (Java 17)."""
    text = (flink_home() / "conf" / "config.yaml").read_text()
    found = re.search(r"^\s*all:\s*(--add-.*)$", text, re.MULTILINE)
    return found.group(1).strip() if found else ""


def write_configuration(config: FlinkClusterConfig) -> Path:
    config.conf_dir.mkdir(parents=True, exist_ok=True)
    (config.directory / "logs").mkdir(exist_ok=True)
    for name in ("log4j.properties", "log4j-console.properties", "log4j-cli.properties"):
        shutil.copyfile(flink_home() / "conf" / name, config.conf_dir / name)
    lines = [f"{key}: {json.dumps(value)}" for key, value in render_configuration(config).items()]
    (config.conf_dir / "config.yaml").write_text("# Rendered by ablab.streaming.flink.cluster\n" + "\n".join(lines) + "\n")
    (config.directory / "cluster.json").write_text(json.dumps({**asdict(config), "directory": str(config.directory)}))
    return config.conf_dir


def read_cluster(directory: Path) -> FlinkClusterConfig | None:
    try:
        saved = json.loads((directory / "cluster.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    saved["directory"] = Path(saved["directory"])
    return FlinkClusterConfig(**saved)


def _env(config: FlinkClusterConfig, role: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FLINK_CONF_DIR=str(config.conf_dir), FLINK_LOG_DIR=str(config.directory / "logs" / role),
               FLINK_PID_DIR=str(config.directory / "run" / role), FLINK_IDENT_STRING="ablab")
    env.pop("JVM_ARGS", None)  # heap sizes come from config.yaml
    env.pop("FLINK_HOME", None)
    return env


def _launch(config: FlinkClusterConfig, role: str) -> int:
    script = "jobmanager.sh" if role == "jobmanager" else "taskmanager.sh"
    log_dir = config.directory / "logs" / role
    log_dir.mkdir(parents=True, exist_ok=True)
    out = open(config.directory / "logs" / f"{role}.out", "ab")
    process = subprocess.Popen(
        ["bash", str(flink_home() / "bin" / script), "start-foreground"],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(config, role),
        cwd=config.directory, start_new_session=True,  # outlives the CLI, not killed by its ^C
    )
    out.close()
    config.pidfile(role).write_text(f"{process.pid}\n")
    return process.pid


def start_cluster(*, config: FlinkClusterConfig, timeout_s: float = 180.0) -> FlinkClusterStatus:
    """Start the JobManager and every TaskManager not running yet; wait until all registered."""
    saved = read_cluster(config.directory)
    if saved is not None and _pid(config.directory, "jobmanager") is not None and (
            saved.rest_port, saved.rpc_port, saved.host) != (config.rest_port, config.rpc_port, config.host):
        raise FlinkClusterError(f"a cluster already runs from {config.directory} on {saved.rest_url}; "
                                "stop it first (`ablab flink stop`) to change its ports")
    from ablab.streaming.kafka import jars

    jars.java_version()
    write_configuration(config)
    if _pid(config.directory, "jobmanager") is None:
        for port in (config.rest_port, config.rpc_port):
            if _port_open(config.host, port):
                raise FlinkClusterError(f"port {config.host}:{port} is already in use by another process; "
                                        "pick others with --rest-port / --rpc-port")
        _launch(config, "jobmanager")
    for index in range(1, config.taskmanagers + 1):
        if _pid(config.directory, f"taskmanager-{index}") is None:
            _launch(config, f"taskmanager-{index}")
    try:
        wait_for_taskmanagers(config, count=config.taskmanagers, timeout_s=timeout_s)
    except BaseException:
        stop_cluster(directory=config.directory, timeout_s=10)
        raise
    return cluster_status(directory=config.directory)


def start_taskmanager(*, directory: Path, index: int) -> int:
    """Start (or keep) TaskManager ``index``: what a supervisor does after one died."""
    config = _require(directory)
    pid = _pid(directory, f"taskmanager-{index}")
    return pid if pid is not None else _launch(config, f"taskmanager-{index}")


def wait_for_taskmanagers(config: FlinkClusterConfig, *, count: int, timeout_s: float) -> dict:
    """Wait until the JobManager's REST API reports ``count`` registered TaskManagers."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if _pid(config.directory, "jobmanager") is None:
            raise FlinkClusterError("the JobManager exited during start-up; see "
                                    f"{config.directory / 'logs'}:\n{_tail(config.directory / 'logs' / 'jobmanager.out')}")
        try:
            overview = rest.get(config.rest_url, "/overview")
            if overview.get("taskmanagers", 0) >= count:
                return overview
            last = overview
        except rest.RestError as exc:
            last = exc
        time.sleep(0.5)
    raise FlinkClusterError(f"{count} TaskManagers did not register on {config.rest_url} in {timeout_s:.0f}s "
                            f"(last answer: {last}); see {config.directory / 'logs'}")


def stop_cluster(*, directory: Path, timeout_s: float = 30.0) -> int:
    """SIGTERM every JVM of the cluster, SIGKILL what is left after ``timeout_s``; how many ran."""
    roles = [path.stem for path in sorted(directory.glob("*.pid"))]
    pids = [(role, pid) for role in roles if (pid := _pid(directory, role)) is not None]
    stop_pids([pid for _, pid in pids], timeout_s=timeout_s)
    for role in roles:
        (directory / f"{role}.pid").unlink(missing_ok=True)
    return len(pids)


def kill_taskmanager(*, directory: Path, index: int) -> bool:
    """SIGKILL one TaskManager, no clean shutdown: a crashed machine (fault tests)."""
    pid = _pid(directory, f"taskmanager-{index}")
    if pid is None:
        return False
    kill_pid(pid)
    (directory / f"taskmanager-{index}.pid").unlink(missing_ok=True)
    return True


def cluster_status(*, directory: Path) -> FlinkClusterStatus:
    config = read_cluster(directory)
    if config is None:
        return FlinkClusterStatus(directory, None, None, {})
    indexes = sorted({int(p.stem.split("-")[1]) for p in directory.glob("taskmanager-*.pid")} | set(range(1, config.taskmanagers + 1)))
    return FlinkClusterStatus(directory, config.rest_url, _pid(directory, "jobmanager"),
                              {i: _pid(directory, f"taskmanager-{i}") for i in indexes})


# --- job submission --------------------------------------------------------------------


def submission_arguments(config: JobConfig) -> list[str]:
    """``PythonDriver`` arguments for the job: ``-pym <module>`` and the job's own flags.

    The same list is what ``bin/flink run`` passes on, and what the operator's
    FlinkDeployment names in ``job.args`` (tests/unit/deploy checks they agree)."""
    return ["-pym", JOB_MODULE, *job_arguments(config), "--detached"]


def cluster_job_config(config: JobConfig) -> JobConfig:
    """``config`` with the restart strategy a long-running cluster job needs."""
    from dataclasses import replace

    return replace(config, extra_config={**CLUSTER_JOB_OPTIONS, **config.extra_config})


def submit(*, rest_url: str, config: JobConfig, from_savepoint: Path | None = None,
           conf_dir: Path | None = None, log_dir: Path | None = None, timeout_s: float = 300.0) -> str:
    """Submit the job detached to the session cluster at ``rest_url``; return its job id.

    ``conf_dir``: the Flink client configuration (the local cluster's own when it is ours;
    PyFlink's shipped one otherwise). ``from_savepoint``: a savepoint or retained checkpoint
    to start from (otherwise the job resumes from the newest checkpoint in its
    ``checkpoint_dir`` by itself)."""
    address = rest_url.removeprefix("http://").removeprefix("https://").rstrip("/")
    home = flink_home()
    cmd = ["bash", str(home / "bin" / "flink"), "run", "--detached", "-m", address,
           "-pyclientexec", sys.executable, "-pyexec", sys.executable]
    if from_savepoint is not None:
        cmd += ["--fromSavepoint", str(from_savepoint), "--claimMode", "NO_CLAIM"]
    args = submission_arguments(config)
    cmd += [args[0], args[1], "--", *args[2:]]
    env = dict(os.environ)
    env["FLINK_CONF_DIR"] = str(conf_dir or home / "conf")
    env["FLINK_LOG_DIR"] = str(log_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "ablab-flink-client")
    env["JVM_ARGS"] = "-Xmx256m"  # the client JVM only builds and uploads the job graph
    env["PYFLINK_CLIENT_EXECUTABLE"] = sys.executable
    env.pop("FLINK_HOME", None)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise FlinkClusterError(f"`flink run` did not finish in {timeout_s:.0f}s submitting to {rest_url}") from exc
    output = done.stdout + done.stderr
    found = _JOB_ID.search(output)
    if done.returncode != 0 or found is None:
        raise FlinkClusterError(f"submitting the job to {rest_url} failed (exit {done.returncode}):\n"
                                + "\n".join(output.strip().splitlines()[-25:]))
    return found.group(1)


# --- processes -------------------------------------------------------------------------


def _require(directory: Path) -> FlinkClusterConfig:
    config = read_cluster(directory)
    if config is None:
        raise FlinkClusterError(f"no Flink cluster in {directory}; start one with `ablab flink start`")
    return config


def _pid(directory: Path, role: str) -> int | None:
    try:
        pid = int((directory / f"{role}.pid").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) and _is_ours(pid, directory, role) else None


def _is_ours(pid: int, directory: Path, role: str) -> bool:
    """Guard against a recycled pid: a Flink JVM of this role whose --configDir is ours.

    While bash still runs the start script (before it execs the JVM) the pid is trusted."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, PermissionError, ProcessLookupError, OSError):
        return not Path("/proc/self").exists()
    if any(part.endswith((b"jobmanager.sh", b"taskmanager.sh", b"flink-console.sh")) for part in cmdline):
        return True
    main = _JM_CLASS if role == "jobmanager" else _TM_CLASS
    conf = str((directory / "conf").resolve()).encode()
    return main in cmdline and any(part.rstrip(b"/") == conf for part in cmdline)






def _port_open(host: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
