"""``ablab gateway --workers N``: N gateway processes on one port, one outbox forwarder.

Each worker is a spawned process with its own listening socket bound with ``SO_REUSEPORT``
(the kernel spreads new connections over the workers' sockets, so no process is a hand-off
point), its own assignment client and its own outbox directory, ``<outbox>/worker-<i>``: one
writer per directory, as :class:`~.emit.Outbox` requires. The parent process never serves a
request: it restarts a worker that dies and runs the one forwarder
(:class:`~.outbox.ForwarderGroup`), which ships every worker directory's files. A worker killed
at any point has flushed each answered request's events to its file before the answer's last
bytes; the forwarder ships them with the ids they were written with and saves its position
per file only after the API's 202, so every event reaches the API once by ``event_id`` (a
re-post after a lost 202 carries the same ids, which the loader and the Flink job count once).
A restarted worker writes a new file in the same directory (the file name carries its pid).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

from ablab.platform.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


class Closeable(Protocol):
    def close(self) -> None: ...


class AppFactory(Protocol):
    """Builds one process's gateway app and what it must close at exit (its assignment client).

    The CLI passes its own (``ablab.cli.gateway.gateway_app``): the wiring of optional parts
    (the in-repo compressor, the SDK) belongs to the edge, and a spawned worker needs a
    module-level function to import."""

    def __call__(self, settings: GatewaySettings, *, ship: bool) -> tuple[Any, Closeable | None]: ...
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


def worker_outbox(base: Path, index: int) -> Path:
    return base / f"worker-{index}"


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind to the same address too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve_worker(index: int, settings: GatewaySettings, host: str, port: int, log_level: str, parent: int,
                 factory: AppFactory) -> None:
    """One worker process: its socket, its assignment client, its outbox; until SIGTERM or
    until its parent is gone (a worker never outlives the supervisor). It never ships its
    outbox: the supervisor's one forwarder does."""
    import uvicorn

    from ablab.platform.gateway.limits import uvicorn_options

    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s worker-{index} %(levelname)s %(name)s: %(message)s")
    if settings.outbox_dir is not None:
        settings = replace(settings, outbox_dir=worker_outbox(settings.outbox_dir, index))
    app, sdk = factory(settings, ship=False)
    sock = reuseport_socket(host, port)
    server = uvicorn.Server(uvicorn.Config(app, loop="uvloop", log_level=log_level.lower(), access_log=False,
                                           **uvicorn_options()))

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        server.should_exit = True

    threading.Thread(target=orphaned, name="ablab-gateway-parent-watch", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        if sdk is not None:
            sdk.close()


class Supervisor:
    """Starts ``workers`` gateway processes, restarts any that die, and runs the forwarder."""

    def __init__(self, settings: GatewaySettings, *, workers: int, host: str, port: int, factory: AppFactory,
                 log_level: str = "info", ship: bool = True) -> None:
        self.settings, self.workers, self.host, self.port, self.log_level = settings, workers, host, port, log_level
        self.factory = factory
        self._ctx = multiprocessing.get_context("spawn")
        self.procs: dict[int, BaseProcess] = {}
        self.restarts = 0
        self._stopping = threading.Event()
        self.shipper: Any = None
        if ship and settings.outbox_dir is not None and settings.token:
            from ablab.platform.gateway.outbox import GroupShipper

            self.shipper = GroupShipper(settings.outbox_dir, api_url=settings.api_url, token=settings.token)

    def _spawn(self, index: int) -> None:
        proc = self._ctx.Process(target=serve_worker, name=f"ablab-gateway-worker-{index}", daemon=False,
                                 args=(index, self.settings, self.host, self.port, self.log_level, os.getpid(), self.factory))
        proc.start()
        self.procs[index] = proc

    def start(self) -> None:
        for i in range(self.workers):
            self._spawn(i)

    def pids(self) -> dict[int, int | None]:
        return {i: p.pid for i, p in self.procs.items()}

    def watch(self, poll_s: float = 0.5) -> None:
        """Until :meth:`stop`: restart dead workers (with a short backoff per worker)."""
        failures: dict[int, int] = {}
        while not self._stopping.wait(poll_s):
            for i, proc in list(self.procs.items()):
                if proc.is_alive() or self._stopping.is_set():
                    continue
                n = failures.get(i, 0)
                log.error("gateway worker %d (pid %s) exited with %s; restarting", i, proc.pid, proc.exitcode)
                time.sleep(RESTART_BACKOFF_S[min(n, len(RESTART_BACKOFF_S) - 1)])
                failures[i] = n + 1
                self.restarts += 1
                self._spawn(i)

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stopping.set()
        for proc in self.procs.values():
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)  # uvicorn's graceful stop: in-flight streams finish
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if self.shipper is not None:
            self.shipper.close()


def run(settings: GatewaySettings, *, workers: int, host: str, port: int, factory: AppFactory,
        log_level: str = "info") -> None:
    """Serve until SIGTERM/SIGINT (the CLI's entry point for ``--workers N`` > 1)."""
    sup = Supervisor(settings, workers=workers, host=host, port=port, factory=factory, log_level=log_level)

    def stop(*_: object) -> None:
        sup._stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sup.start()
    try:
        sup.watch()
    finally:
        sup.stop()
