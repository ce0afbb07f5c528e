"""What the per-request revocation check costs on ``POST /v1/assign``, side by side.

The API's token cache reads the one-row ``auth_revision`` counter on every request, so a
revoked key fails on its next request on every process. This compares, in one run and
in alternating rounds (the machine is shared), the real app called in-process (ASGI via
Starlette's TestClient, no sockets):

- ``checked``: the code as it is (cache hit + one primary-key read of the counter);
- ``ttl-only``: the same app with the counter read replaced by a constant, i.e. the old
  behaviour (a cached token was trusted for 30 s, revoked or not).

Also the counter read alone (``TokenCache._auth_revision``), µs per call. Figures: wall
and process CPU per request; SQLite file always, PostgreSQL when ``--postgres URL`` (or
``ABLAB_TEST_POSTGRES_URL``) is given.

Usage: .venv/bin/python benchmarks/bench_auth.py [--requests 3000] [--rounds 3] [--postgres URL]
"""

from __future__ import annotations

import argparse
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


def _setup(url: str, home: Path):  # noqa: ANN202 - (TestClient, app state, sdk token)
    from fastapi.testclient import TestClient

    from ablab.platform.api.app import create_app
    from ablab.platform.auth import create_api_key
    from ablab.platform.config import Settings
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import Scope

    upgrade(url)
    engine = make_engine(url)
    with transaction(make_sessionmaker(engine)) as session:
        editor = create_api_key(session, name="bench-editor", scope=Scope.editor)[1]
        sdk = create_api_key(session, name="bench-sdk", scope=Scope.sdk)[1]
    engine.dispose()
    settings = Settings(home=home, database_url=url, analytics=False, kafka_bootstrap="127.0.0.1:1")
    client = TestClient(create_app(settings))
    client.__enter__()
    body = {"key": "bench", "name": "bench", "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
    auth = {"Authorization": f"Bearer {editor}"}
    client.post("/v1/experiments", json=body, headers=auth).raise_for_status()
    client.post("/v1/experiments/bench/start", headers=auth).raise_for_status()
    return client, client.app.state.ablab, sdk


def _round(client, token: str, n: int) -> tuple[float, float]:  # noqa: ANN001
    headers = {"Authorization": f"Bearer {token}"}
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        r = client.post("/v1/assign", json={"unit_id": f"u{i}"}, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(r.text)
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def bench(label: str, url: str, home: Path, requests: int, rounds: int) -> list[tuple[str, ...]]:
    client, state, token = _setup(url, home)
    tokens = state.tokens
    real = tokens._auth_revision
    reads = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(requests):
            real()
        reads.append((time.perf_counter() - start) / requests * 1e6)
    frozen = real()
    results: dict[str, list[tuple[float, float]]] = {"checked": [], "ttl-only": []}
    _round(client, token, 200)  # warm-up
    for _ in range(rounds):
        for mode in ("checked", "ttl-only"):
            tokens._auth_revision = real if mode == "checked" else (lambda: frozen)
            results[mode].append(_round(client, token, requests))
    tokens._auth_revision = real
    client.__exit__(None, None, None)
    med = {m: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for m, r in results.items()}
    return [
        (label, "counter read alone", f"{statistics.median(reads):.0f}", "—", "—"),
        (label, "POST /v1/assign, ttl-only (old)", f"{med['ttl-only'][0]:.0f}", f"{med['ttl-only'][1]:.0f}", "1.00"),
        (label, "POST /v1/assign, checked (now)", f"{med['checked'][0]:.0f}", f"{med['checked'][1]:.0f}",
         f"{med['checked'][1] / med['ttl-only'][1]:.2f}"),
    ]


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
