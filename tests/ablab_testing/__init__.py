"""Support shared by the tests and the benchmarks; none of it ships in the wheel.

This package holds a real SQL database and a real API process (here), a whole pipeline
on one machine (:mod:`.pipeline`), the offline computation of the Flink job
(:mod:`.flink_reference`), the cluster fault drill (:mod:`.cluster_drill`), a seeder of
the dashboard's store (:mod:`.dashboard_seed`), the inference strategy benchmark
(:mod:`.inference_bench`), the loader in a test's thread (:mod:`.loading`) and the
comparison of two results documents (:mod:`.results`). ``tests/`` is on the import path
through pytest's ``pythonpath`` setting and, for the benchmarks, ``benchmarks/_path.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ablab.streaming.localhost import server_ports

ABLAB = str(Path(sys.executable).with_name("ablab"))
TESTS_DIR = Path(__file__).resolve().parent.parent


def support_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports ``ablab_testing``."""
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A local port nothing listens on (a broker that is down)."""
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


def run_child(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``python -c`` (a fresh process: chDB allows one store per process);
    it can ``import ablab_testing``."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout,
                          env=support_env())


def run_child_json(script: str, *args: str, timeout: float) -> Any:
    """:func:`run_child`, which must succeed and print its answer as JSON on its last line."""
    done = run_child(script, *args, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def raw_frame(ev):
    """``platform.stats.synthetic``-style events as the loader writes them to ``raw_events``
    (its columns, in its order; ``measures``/``dims`` as maps, missing ones empty)."""
    from ablab.streaming.store.columns import RAW_COLUMNS

    ev = ev.copy()
    ev["event_id"] = [f"e{i}" for i in range(len(ev))]
    ev["ts"] = ev["ts"].dt.floor("ms")
    for col in ("trace_id", "experiment", "variant", "unit_id", "price_version", "source"):
        ev[col] = ev[col].fillna("")
    ev["strategy"], ev["payload"], ev["kafka_partition"] = "{}", "", 0
    ev["kafka_offset"] = range(len(ev))
    ev["correct"] = ev["correct"].astype("UInt8")
    for col in ("measures", "dims"):
        ev[col] = [m if isinstance(m, dict) else {} for m in ev[col]] if col in ev.columns else [{}] * len(ev)
    for col in ("prompt_tokens", "output_tokens"):
        if col in ev.columns:
            ev[col] = ev[col].astype("UInt32")
    return ev[[c for c in RAW_COLUMNS if c in ev.columns]]


def insert_synthetic_raw(client, ev) -> None:
    """Write ``platform.stats.synthetic`` events into ``raw_events`` as the loader would."""
    client.insert_df("raw_events", raw_frame(ev))


def wait_for(predicate: Callable[[], Any], *, timeout_s: float, what: str, on_timeout: Callable[[], str] | None = None,
             interval_s: float = 0.5) -> Any:
    """Poll observable state (counters, offsets, checkpoint ids): ``predicate`` every
    ``interval_s`` until it returns something truthy, which is returned; past ``timeout_s``,
    fail naming ``what`` (and ``on_timeout()``'s diagnosis)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval_s)
    detail = on_timeout() if on_timeout else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{detail}")


def postgres_admin_url() -> str | None:
    return os.environ.get("ABLAB_TEST_POSTGRES_URL")


def fresh_postgres_database() -> str:
    """A new, empty database on the test PostgreSQL server; returns its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = postgres_admin_url()
    if not admin:
        if os.environ.get("CI"):
            pytest.fail("ABLAB_TEST_POSTGRES_URL is not set; .ci/run starts PostgreSQL and sets it")
        pytest.skip("PostgreSQL not configured (set ABLAB_TEST_POSTGRES_URL, see scripts/postgres.sh)")
    name = f"ablab_{uuid.uuid4().hex[:10]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))  # name is ours, not user input
    engine.dispose()
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


@dataclass
class ApiServer:
    base_url: str
    database_url: str
    home: Path
    tokens: dict[str, str]
    process: subprocess.Popen[bytes]

    def client(self, scope: str | None = "admin", **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[scope]}"} if scope else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30, **kw)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ABLAB, *args], env=env, capture_output=True, text=True, check=True, timeout=120)


def _test_key(scope: str, home: Path, env: dict[str, str]) -> str:
    """A token named ``test-<scope>``; a second API on the same database gets
    ``test-<scope>-<home>`` (names are unique among active keys)."""
    for name in (f"test-{scope}", f"test-{scope}-{home.name}"):
        done = subprocess.run([ABLAB, "keys", "create", "--name", name, "--scope", scope], env=env, capture_output=True,
                              text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout.strip().splitlines()[-1]
        if "active key named" not in done.stdout + done.stderr:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    raise RuntimeError(f"could not create a {scope} key:\n{done.stdout}{done.stderr}")


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Until ``url`` answers 200; fails with the log's tail if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # poll interval while the process starts
    raise RuntimeError(f"{url} did not come up:\n{log.read_text(errors='replace')[-4000:]}")


def start_api(database_url: str, home: Path, extra_env: dict[str, str] | None = None) -> ApiServer:
    port = server_ports()  # the API binds after `db upgrade`'s own connections
    env = {
        **os.environ,
        "ABLAB_HOME": str(home),
        "ABLAB_DATABASE_URL": database_url,
        "ABLAB_API_URL": f"http://127.0.0.1:{port}",
        # Control-plane tests need no analytics store; tests of it turn it on.
        "ABLAB_ANALYTICS": "false",
        **(extra_env or {}),
    }
    run_cli("db", "upgrade", "--no-clickhouse", env=env)
    tokens = {scope: _test_key(scope, home, env) for scope in ("admin", "editor", "viewer", "sdk")}
    log = open(home / "api.log", "wb")
    process = subprocess.Popen([ABLAB, "api", "--port", str(port), "--no-migrate"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", process, home / "api.log", timeout=60)
    except RuntimeError:
        process.kill()
        raise
    return ApiServer(base, database_url, home, tokens, process)


def concurrent_requests(servers: Sequence[ApiServer], scope: str, n: int,
                        send: Callable[[httpx.Client, int], httpx.Response]) -> list[httpx.Response]:
    """``n`` requests released at once (a barrier), the ``i``-th sent by ``send(client, i)``
    to ``servers[i % len(servers)]`` with a ``scope`` token; the responses as they came."""
    barrier = threading.Barrier(n)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        with servers[i % len(servers)].client(scope) as client:
            barrier.wait()
            response = send(client, i)
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return responses


def poll_results(server: ApiServer, key: str, until: Callable[[dict], bool], *, timeout_s: float,
                 interval_s: float = 1.0) -> dict:
    """``GET /v1/experiments/{key}/results`` until ``until(document)`` holds (the loader
    commits every few seconds); returns the last document read ({} if none), whether or
    not it did, for the caller's assertions to say what was missing."""
    deadline = time.monotonic() + timeout_s
    result: dict = {}
    with server.client("viewer") as client:
        while time.monotonic() < deadline:
            response = client.get(f"/v1/experiments/{key}/results")
            if response.status_code == 200:
                result = response.json()
                if until(result):
                    break
            time.sleep(interval_s)  # poll interval
    return result


def stop_api(server: ApiServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()


