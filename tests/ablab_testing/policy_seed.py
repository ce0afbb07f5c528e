"""Seed an embedded ClickHouse store with a policy experiment's logged events, for dashboard
tests: a ``control`` variant (always one arm) and a ``router`` variant (the simulated
environment's SLO router, with a fitted model), each request logging ``arm``, ``propensity``
and ``policy_version`` as the gateway does (:func:`ablab.platform.policy.simulate.experiment_events`).

chDB lets one process own a data directory, so seeding runs in its own process before the API
that will own the store starts::

    python -m ablab_testing.policy_seed --home DIR --experiment KEY [--requests N]

It prints the ``POST /v1/experiments`` body matching the events.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

EXPERIMENT = "router-sim"
"""The key the dashboard tests seed it under (a policy variant beside a fixed one)."""


def policy_events(*, experiment: str, n_requests: int, n_units: int, start: datetime, duration_s: float,
                  seed: int = 7) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(events, experiment body): the simulator's two-variant experiment, its requests spread
    evenly over ``duration_s`` from ``start``."""
    import numpy as np

    from ablab.platform.policy.evaluate import Decider
    from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy

    env = Environment()
    policy = router_policy(env, explore=0.05)
    router = Decider(policy, fit_after_exploring(policy, env, seed=seed))
    events, spec = experiment_events(env, router, np.random.default_rng(seed), key=experiment, n=n_requests,
                                     n_units=n_units, start=start.replace(tzinfo=None).isoformat())
    step = duration_s / max(1, n_requests)
    for i, event in enumerate(events):  # a request's inference and feedback share its time
        event["ts"] = (start + timedelta(seconds=(i // 2) * step)).isoformat().replace("+00:00", "Z")
    body = {**spec, "name": "SLO router vs one prompt", "owner": "ml-platform", "traffic": 1.0,
            "hypothesis": "Routing per request by prompt length and plan beats the helpful prompt within the TTFT SLO.",
            "metrics": {"primary": ["accuracy"]}}
    return events, body


def seed_store(*, home: Path, experiment: str, n_requests: int = 4000, n_units: int = 400, begin_in_s: float = 0.0,
               duration_s: float = 600.0) -> dict[str, Any]:
    """Write the events into the chDB store under ``home``; returns ``{raw_events, body}``."""
    from ablab.platform.events import Rejection, validate_event
    from ablab.streaming.loader.rows import RAW_COLUMNS, raw_event_row
    from ablab.streaming.store import apply_ddl, make_client

    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=begin_in_s)
    events, body = policy_events(experiment=experiment, n_requests=n_requests, n_units=n_units, start=start,
                                 duration_s=duration_s)
    rows = []
    for offset, event in enumerate(events):
        payload = json.dumps(event).encode()
        parsed = validate_event(payload)
        if isinstance(parsed, Rejection):
            raise ValueError(f"seeded event refused: {parsed}")
        rows.append(raw_event_row(parsed, payload=payload, partition=0, offset=offset))
    client = make_client(f"chdb:///{(home / 'chdb').resolve()}")
    apply_ddl(client)
    try:
        client.insert("raw_events", rows, column_names=list(RAW_COLUMNS))
    finally:
        client.close()
    return {"raw_events": len(rows), "body": body}


def seed_in_child(*, home: Path, experiment: str, requests: int = 4000, units: int = 400,
                  begin_in_s: float = 0.0) -> dict[str, Any]:
    """:func:`seed_store` in a child process (the API that will own the store runs in another)."""
    import subprocess
    import sys

    from ablab_testing import support_env

    done = subprocess.run(
        [sys.executable, "-m", "ablab_testing.policy_seed", "--home", str(home), "--experiment", experiment,
         "--requests", str(requests), "--units", str(units), "--begin-in-s", str(begin_in_s)],
        capture_output=True, text=True, timeout=300, env=support_env())
    if done.returncode != 0:
        raise RuntimeError(f"seeding {experiment} failed:\n{done.stdout}{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="ABLAB_HOME of the API that will own the store")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--begin-in-s", type=float, default=0.0, help="events start this far ahead (default: now)")
    args = parser.parse_args(argv)
    print(json.dumps(seed_store(home=args.home, experiment=args.experiment, n_requests=args.requests, n_units=args.units,
                                begin_in_s=args.begin_in_s)))


if __name__ == "__main__":
    main()
