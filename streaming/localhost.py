"""Processes and ports of the services ablab runs on this machine (broker, Flink cluster).

One place for what every local runner needs: ports a server can bind a while later, and
whether a pid still runs, and stopping one (SIGTERM, then SIGKILL after a deadline).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path


def server_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports below the kernel's ephemeral range, for
    a server that starts a while later. A ``bind(0)`` port is ephemeral: an outgoing
    connection made in the meantime (a DB migration, an HTTP client) can take it first, and
    the server then fails with "Address already in use"."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        first = rng.randrange(20_000, low - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports in 20000..{low}")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie child of this process counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True


def send_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_pids(pids: Iterable[int], *, timeout_s: float) -> None:
    """SIGTERM all of ``pids`` at once, SIGKILL whatever still runs after ``timeout_s``."""
    pids = list(pids)
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_pid(pid)


def kill_pid(pid: int) -> None:
    """SIGKILL, no clean shutdown (what a crash looks like), and wait until it is gone."""
    if pid_alive(pid):
        send_signal(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.05)
