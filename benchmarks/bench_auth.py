"""What the per-request revocation check costs on ``POST /v1/assign``, side by side.

The API's token cache reads the one-row ``auth_revision`` counter on every request, so a
revoked key fails on its next request on every process. This compares, in one run and
in alternating rounds (the machine is shared), the real app called in-process (its ASGI
callable driven directly: no sockets, no test client):

- ``checked``: the code as it is (cache hit + one primary-key read of the counter);
- ``ttl-only``: the same app with the counter read replaced by a constant, i.e. the old
  behaviour (a cached token was trusted for 30 s, revoked or not).

Also the counter read alone (``TokenCache._auth_revision``), µs per call. Figures: wall
and the event-loop thread's CPU per request (the route and its auth run there; process
CPU would also count the app's background threads, which run while a query waits); SQLite file always, PostgreSQL when ``--postgres URL`` (or
``ABLAB_TEST_POSTGRES_URL``) is given.

Usage: .venv/bin/python benchmarks/bench_auth.py [--requests 3000] [--rounds 3] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=160)


def _fresh_postgres(admin_url: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"ablab_bench_{uuid.uuid4().hex[:8]}"
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))  # our own name, not input
    engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def _request(app, method: str, path: str, body: dict, token: str) -> tuple[int, bytes]:
    """One request straight into the ASGI app: no sockets, no test client in the way."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {token}".encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    sent = False
    out: dict = {"status": 0, "body": b""}

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["body"]


async def _round(app, token: str, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        status, body = await _request(app, "POST", "/v1/assign", {"unit_id": f"u{i}"}, token)
        if status != 200:
            raise RuntimeError(body)
    return (time.perf_counter() - wall) / n * 1e6, (time.thread_time() - cpu) / n * 1e6


async def _bench(label: str, url: str, home: Path, requests: int, rounds: int) -> list[tuple[str, ...]]:
    from ablab.cli.wiring import create_app
    from ablab.platform.auth import create_api_key
    from ablab.platform.config import Settings
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import Scope

    upgrade(url)
    engine = make_engine(url)
    with transaction(make_sessionmaker(engine)) as session:
        editor = create_api_key(session, name="bench-editor", scope=Scope.editor)[1]
        token = create_api_key(session, name="bench-sdk", scope=Scope.sdk)[1]
    engine.dispose()
    app = create_app(Settings(home=home, database_url=url, analytics=False, kafka_bootstrap="127.0.0.1:1"))
    async with app.router.lifespan_context(app):
        body = {"key": "bench", "name": "bench", "traffic": 1.0, "control": "a",
                "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
        for path, payload in (("/v1/experiments", body), ("/v1/experiments/bench/start", {})):
            status, text = await _request(app, "POST", path, payload, editor)
            assert status in (200, 201), text
        tokens = app.state.ablab.tokens
        real = tokens._auth_revision
        reads = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(requests):
                real()
            reads.append((time.perf_counter() - start) / requests * 1e6)
        frozen = real()
        results: dict[str, list[tuple[float, float]]] = {"checked": [], "ttl-only": []}
        await _round(app, token, 300)  # warm-up
        for _ in range(rounds):
            for mode in ("checked", "ttl-only"):
                tokens._auth_revision = real if mode == "checked" else (lambda: frozen)
                results[mode].append(await _round(app, token, requests))
        tokens._auth_revision = real
    med = {m: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for m, r in results.items()}
    return [
        (label, "counter read alone", f"{statistics.median(reads):.0f}", "—", "—"),
        (label, "POST /v1/assign, ttl-only (old)", f"{med['ttl-only'][0]:.0f}", f"{med['ttl-only'][1]:.0f}", "1.00"),
        (label, "POST /v1/assign, checked (now)", f"{med['checked'][0]:.0f}", f"{med['checked'][1]:.0f}",
         f"{med['checked'][1] / med['ttl-only'][1]:.2f}"),
    ]


def bench(label: str, url: str, home: Path, requests: int, rounds: int) -> list[tuple[str, ...]]:
    return asyncio.run(_bench(label, url, home, requests, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default=os.environ.get("ABLAB_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    console.print(f"load average before: {os.getloadavg()}; python {sys.version.split()[0]}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        rows += bench("SQLite", f"sqlite:///{home / 'bench.db'}", home, args.requests, args.rounds)
        if args.postgres:
            (home / "pg").mkdir()
            rows += bench("PostgreSQL", _fresh_postgres(args.postgres), home / "pg", args.requests, args.rounds)
    table = Table("database", "what", "wall µs/req", "CPU µs/req", "CPU ratio")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
