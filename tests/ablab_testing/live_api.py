"""The real API (``ablab.cli.wiring``'s app: Kafka edge, chDB store) with two test-only
additions, for the dashboard's browser tests::

    python -m ablab_testing.live_api --port P

- ``POST /_test/windows {"experiment", "design"?, "requests"?}`` writes the next 10 s of
  synthetic traffic into the store this process owns (raw events and their window rows,
  one window per variant, right after the experiment's latest window, or the next 10 s from
  now for an experiment with none; the per-unit rollup fed as the loader feeds it): new data
  behind the API, as the loader would have written it, while a browser watches. chDB lets one process
  own a store, so nothing outside this process could write it. ``"start"`` (ISO-8601) places
  the traffic instead: from ``start`` until this moment with ``"until_now": true`` (traffic
  that already happened, e.g. before a ship), else for ``"duration_s"`` (default 9.9);
  ``"variants"`` keeps only some of the design's variants (e.g. a shipped winner alone).
- ``GET /_test/rows?experiment=KEY``: the store's raw events of the experiment per type and
  variant (what was loaded, whatever results read of it).
- ``ABLAB_TEST_BUILD_STATE`` (JSON ``{"state", "done", "total"}``) stands in for the
  llama-cpp-python build's state in ``GET /v1/backends`` (``ablab.cli.backends``): whether
  the real wheel is built on this machine does not decide what a test sees.

The route is on loopback only and this module is not shipped; everything else is the
product's app.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import Body, FastAPI, HTTPException, Request  # at module level: the route's annotations are resolved here

from ablab_testing import ApiServer, _test_key, run_cli, server_ports, support_env, wait_http


def build_app() -> Any:
    from ablab.cli.backends import BackendStatus
    from ablab.cli.wiring import analytics_store, kafka_ingest
    from ablab.inference.llamacpp import BuildState
    from ablab.platform.api.app import create_app
    from ablab.platform.config import get_settings
    from ablab_testing.dashboard_seed import DESIGNS, write_events

    raw = os.environ.get("ABLAB_TEST_BUILD_STATE")
    fake = json.loads(raw) if raw else None

    def backend_status(state: Any) -> BackendStatus:
        build = (lambda: BuildState(fake["state"], int(fake.get("done", 0)), int(fake.get("total", 0)))) if fake else None
        return BackendStatus(state.settings, build_state=build)

    app: FastAPI = create_app(get_settings(), ingest=kafka_ingest, analytics=analytics_store, extensions=[backend_status])

    @app.post("/_test/windows", include_in_schema=False)
    def next_window(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        store = request.app.state.ablab.analytics
        experiment = str(body["experiment"])
        latest = store.client.query(
            "SELECT max(window_start) FROM window_stats WHERE experiment = {e:String}", parameters={"e": experiment}
        ).result_rows[0][0]
        duration_s = float(body.get("duration_s", 9.9))
        if body.get("start"):
            start = datetime.fromisoformat(str(body["start"]).replace("Z", "+00:00"))
            if body.get("until_now"):
                duration_s = (datetime.now(UTC) - start).total_seconds()
                if duration_s <= 0:
                    raise HTTPException(422, f"start: {start.isoformat()} is not in the past")
        elif latest is None or latest.year < 2000:  # no window yet (ClickHouse's max of nothing is the epoch)
            now = datetime.now(UTC).replace(microsecond=0)
            start = now + timedelta(seconds=10 - now.second % 10)  # the next window: after the experiment's start
        else:
            start = (latest.replace(tzinfo=UTC) if latest.tzinfo is None else latest) + timedelta(seconds=10)
            start = start.replace(microsecond=0)
        design = DESIGNS[str(body.get("design", "factorial"))]
        if body.get("variants"):
            design = {k: v for k, v in design.items() if k in body["variants"]}
        counts = write_events(store.client, experiment=experiment, n_requests=int(body.get("requests", 200)),
                              n_units=int(body.get("units", 200)), start=start, duration_s=duration_s,
                              variants=design, seed=int(start.timestamp()) % 10_000,
                              segments=bool(body.get("segments", False)), trace_suffix=f"-w{int(start.timestamp())}",
                              feed_rollup=True)
        return {**counts, "window_start": start.isoformat()}

    @app.get("/_test/rows", include_in_schema=False)
    def rows(request: Request, experiment: str) -> dict[str, dict[str, int]]:
        found = request.app.state.ablab.analytics.client.query(
            "SELECT toString(type), toString(variant), count() FROM raw_events FINAL WHERE experiment = {e:String} "
            "GROUP BY type, variant", parameters={"e": experiment}).result_rows
        out: dict[str, dict[str, int]] = {}
        for kind, variant, n in found:
            out.setdefault(str(kind), {})[str(variant)] = int(n)
        return out

    return app


def start_live_api(database_url: str, home: Path, extra_env: dict[str, str] | None = None) -> ApiServer:
    """:func:`ablab_testing.start_api`, serving this module's app instead of ``ablab api``."""
    port = server_ports()
    env = {
        **support_env(),
        "ABLAB_HOME": str(home),
        "ABLAB_DATABASE_URL": database_url,
        "ABLAB_API_URL": f"http://127.0.0.1:{port}",
        **(extra_env or {}),
    }
    run_cli("db", "upgrade", "--no-clickhouse", env=env)
    tokens = {scope: _test_key(scope, home, env) for scope in ("admin", "editor", "viewer", "sdk")}
    log = open(home / "api.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "ablab_testing.live_api", "--port", str(port)], env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", process, home / "api.log", timeout=60)
    except RuntimeError:
        process.kill()
        raise
    return ApiServer(base, database_url, home, tokens, process)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
