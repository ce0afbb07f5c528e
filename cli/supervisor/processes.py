"""Detached processes with pidfiles and health checks (a small supervisor, no daemon).

Each service writes ``$ABLAB_HOME/run/<name>.pid`` and logs to
``$ABLAB_HOME/logs/<name>.log``. ``up`` reuses a service that already runs (waiting for its
health check, never starting a second copy), so a second ``up`` is cheap; ``down`` stops in
reverse order, SIGTERM then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Service:
    name: str
    argv: list[str]
    health: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    # How long a service may take to answer its health check (ABLAB_START_TIMEOUT_S, 120 s):
    # a loaded or slow machine may need more.
    start_timeout_s: float = field(default_factory=lambda: float(os.environ.get("ABLAB_START_TIMEOUT_S", "120")))
    # Services such as the Kafka broker manage their own process: start and stop commands.
    stop_argv: list[str] | None = None
    detaches: bool = False
    # Optional and started without waiting for health: it joins when ready (the SmolLM2
    # backend waits for its wheel build; `ablab status` shows the progress), and if it
    # cannot run at all the rest of the stack still comes up.
    background: bool = False


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def tcp_open(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex((host, port)) == 0

    return check


def group_alive(pgid: int) -> bool:
    """Whether any process of the group (session) led by ``pgid`` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Supervisor:
    def __init__(self, home: Path) -> None:
        self.run_dir = home / "run"
        self.log_dir = home / "logs"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Children this Supervisor started: polled so a dead one is reaped, not counted alive
        # as a zombie (matters when one process restarts services, as the soak does).
        self._children: dict[str, subprocess.Popen] = {}

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def _reap(self, name: str) -> None:
        child = self._children.get(name)
        if child is not None and child.poll() is not None:
            del self._children[name]

    def pid(self, name: str) -> int | None:
        self._reap(name)
        try:
            pid = int(self.pidfile(name).read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid

    def start(self, service: Service) -> str:
        if service.detaches:
            if service.health():
                return "reused"
        elif (pid := self.pid(service.name)) is not None and (service.background or self._await_running(service, pid)):
            return "reused"
        log = open(self.log_dir / f"{service.name}.log", "ab")
        env = {**os.environ, **service.env}
        process = subprocess.Popen(
            service.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        log.close()
        if service.detaches:
            code = process.wait(timeout=service.start_timeout_s)
            if code != 0:
                raise RuntimeError(f"{service.name} failed to start (exit {code}); see {self.log_dir / (service.name + '.log')}")
        else:
            self.pidfile(service.name).write_text(str(process.pid))
            self._children[service.name] = process
        deadline = time.monotonic() + (5.0 if service.background else service.start_timeout_s)
        while time.monotonic() < deadline:
            if service.health():
                return "started"
            if not service.detaches and process.poll() is not None:
                if service.background:  # optional: the rest of the stack runs without it
                    last = self.tail(service.name, 1).strip()
                    return f"not running (exit {process.returncode}): {last}"
                raise RuntimeError(
                    f"{service.name} exited with {process.returncode}; last lines of its log:\n" + self.tail(service.name)
                )
            time.sleep(0.5)
        if service.background:
            return "started; joins when ready (`ablab status`)"
        raise RuntimeError(f"{service.name} did not become healthy in {service.start_timeout_s:.0f} s:\n" + self.tail(service.name))

    def _await_running(self, service: Service, pid: int) -> bool:
        """A live process of `service` exists: wait for it to answer rather than start a second
        copy. A copy would overwrite the pidfile and, failing on the first one's locks (chdb),
        leave the first running with no pidfile for ``down`` to find (seen once in CI: a busy
        API answered ``/readyz`` after the 2 s health timeout). False: it died meanwhile."""
        deadline = time.monotonic() + service.start_timeout_s
        while time.monotonic() < deadline:
            if service.health():
                return True
            if self.pid(service.name) is None:
                return False
            time.sleep(0.5)
        raise RuntimeError(
            f"{service.name} runs (pid {pid}) but did not answer its health check in {service.start_timeout_s:.0f} s; "
            f"`ablab down` stops it. Last lines of its log:\n" + self.tail(service.name)
        )

    def stop(self, service: Service, timeout_s: float = 20.0) -> str:
        if service.stop_argv is not None:
            subprocess.run(service.stop_argv, capture_output=True, timeout=120, check=False)
            return "stopped"
        try:
            pid = int(self.pidfile(service.name).read_text().strip())
        except (OSError, ValueError):
            return "not running"
        # A dead leader may have left members behind (a JVM), so judge by the group.
        if not self._group_alive(service.name, pid):
            self.pidfile(service.name).unlink(missing_ok=True)
            return "not running"
        try:
            os.killpg(pid, signal.SIGTERM)  # the whole session: the Flink JVM, uvicorn workers
        except ProcessLookupError:
            pass
        # Wait for the whole group, not only its leader: a leader that exits on SIGTERM can
        # leave a child (the Flink JVM) behind in its group, which only SIGKILL then reaches.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._group_alive(service.name, pid):
            time.sleep(0.2)
        killed = self._group_alive(service.name, pid)
        if killed:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self._group_alive(service.name, pid) and time.monotonic() < deadline + 10:
                time.sleep(0.1)
        self.pidfile(service.name).unlink(missing_ok=True)
        return "killed after SIGTERM timeout" if killed else "stopped"

    def _group_alive(self, name: str, pid: int) -> bool:
        self._reap(name)
        return group_alive(pid)

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
