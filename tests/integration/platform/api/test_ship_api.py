"""Shipping a winner over real HTTP (issue 33 item 5): a real API process (the product's app,
served by ``ablab_testing.live_api`` for its loopback route that writes traffic into the store
the API owns) on a real config database (SQLite, and PostgreSQL under the marker), reading
real results from its chDB store, with synthetic traffic (INT8 20 % faster than the control)
as the loader and the stream job would have written it.

``POST /v1/experiments/{key}/ship`` ships INT8 once its decision is ``ship``; then the SDK
config (new revision and ETag, INT8 alone weighted, a new phase), the audit log (who, the
decision and its evidence) and assignment (``/v1/assign/batch`` and the SDK's local assign,
for 2,000 units) all follow, and a retry is the same event. After the ship, traffic arrives
for INT8 alone (every unit on it); results still compare the phases before the ship: no
split mismatch, the same decision, the same numbers, and ``window.shipped`` says so. Refused:
a variant with no win yet, one that harms a guardrail, a viewer's token; ``ablab ship`` says
the same.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ablab_testing import ABLAB, ApiServer, run_child_json, stop_api, wait_for
from ablab_testing.live_api import start_live_api

pytestmark = pytest.mark.integration

WIN, HARM, FLAT = "ship-win", "ship-harm", "ship-flat"
UNITS = [f"unit-{i}" for i in range(2000)]

SEED = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from ablab_testing.dashboard_seed import PAIR_VARIANTS, seed_store

    home = Path(sys.argv[1])
    # ahead of now: results count events after the experiment's start, which comes later
    counts = [seed_store(home=home, experiment=key, n_requests=6000, n_units=1500, variants=PAIR_VARIANTS,
                         begin_in_s=600, seed=11) for key in sys.argv[2:]]
    print(json.dumps(counts))
""")


def _body(key: str, **extra: object) -> dict:
    return {"key": key, "name": key, "traffic": 0.5, "control": "control", "forced": {"qa-unit": "control"},
            "metrics": {"primary": ["e2e_ms"]},
            "variants": [{"key": "control", "weight": 1}, {"key": "int8", "weight": 1, "strategy": {"precision": "int8"}}],
            **extra}


@pytest.fixture(scope="module")
def ship_api(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    home = tmp_path_factory.mktemp("ship-home")
    run_child_json(SEED, str(home), HARM, timeout=300)  # chDB: one owner per store, so seed before the API
    server = start_live_api(database_url, home, extra_env={
        "ABLAB_ANALYTICS": "true", "ABLAB_RUN_LOADER": "false", "ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    try:
        with server.client("editor") as c:
            for body in (_body(WIN), _body(HARM, guardrails=[{"metric": "ttft_ms", "max": 1.0}]), _body(FLAT)):
                c.post("/v1/experiments", json=body).raise_for_status()
                c.post(f"/v1/experiments/{body['key']}/start").raise_for_status()
            started = _at(c.get(f"/v1/experiments/{WIN}").json()["started_at"])
        # WIN's traffic happened between its start and now, so a ship from now on comes after it
        _traffic(server, start=started + timedelta(milliseconds=2), until_now=True, requests=6000, units=1500)
        yield server
    finally:
        stop_api(server)


def _at(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _traffic(server: ApiServer, **body: object) -> dict:
    """WIN's synthetic traffic written into the store the API owns (``ablab_testing.live_api``)."""
    r = httpx.post(f"{server.base_url}/_test/windows", timeout=120, json={
        "experiment": WIN, "design": "pair", **{k: v.isoformat() if isinstance(v, datetime) else v for k, v in body.items()}})
    r.raise_for_status()
    return r.json()


def _rows(server: ApiServer, key: str) -> dict[str, dict[str, int]]:
    """The experiment's raw events in the store, per type and variant, whatever results read of them."""
    r = httpx.get(f"{server.base_url}/_test/rows", params={"experiment": key}, timeout=30)
    r.raise_for_status()
    return r.json()


def _results(server: ApiServer, key: str) -> dict:
    with server.client("viewer") as c:
        r = c.get(f"/v1/experiments/{key}/results")
    assert r.status_code == 200, r.text
    return r.json()


def _decision(server: ApiServer, key: str) -> dict:
    return next(d for d in _results(server, key)["decisions"] if d["variant"] == "int8")


def _assigned_by_api(server: ApiServer, key: str) -> dict[str, int]:
    with server.client("sdk") as c:
        r = c.post("/v1/assign/batch", json={"units": [{"unit_id": u} for u in UNITS], "experiments": [key]})
    r.raise_for_status()
    counts: dict[str, int] = {}
    for found in r.json()["results"]:
        for a in found:
            counts[a["variant"]] = counts.get(a["variant"], 0) + 1
    return counts


def _cli(server: ApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ABLAB_API_URL": server.base_url, "ABLAB_TOKEN": server.tokens["editor"], "COLUMNS": "200"}
    return subprocess.run([ABLAB, "ship", *args], env=env, capture_output=True, text=True, timeout=120)


def test_refused_without_a_win_with_a_harmed_guardrail_or_a_viewer_token(ship_api: ApiServer) -> None:
    assert _decision(ship_api, FLAT)["decision"] == "keep_running"  # no events: nothing decided
    harm = _decision(ship_api, HARM)
    assert harm["decision"] == "no_ship" and any("guardrail breached" in r for r in harm["reasons"]), harm
    with ship_api.client("viewer") as c:
        r = c.post(f"/v1/experiments/{WIN}/ship", json={"variant": "int8"})
    assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    with ship_api.client("editor") as c:
        flat = c.post(f"/v1/experiments/{FLAT}/ship", json={"variant": "int8"})
        harmed = c.post(f"/v1/experiments/{HARM}/ship", json={"variant": "int8"})
        unforced = c.post(f"/v1/experiments/{HARM}/ship", json={"variant": "int8", "force": True})
        phases = {k: c.get(f"/v1/experiments/{k}").json()["phase"] for k in (FLAT, HARM)}
        audits = [a["action"] for k in (FLAT, HARM) for a in c.get(f"/v1/experiments/{k}/audit").json()]
    for r, decision, todo in ((flat, "keep_running", "keep the experiment running"), (harmed, "no_ship", "do not ship it")):
        assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json", r.text
        problem = r.json()
        assert (problem["field"], problem["decision"]) == ("variant", decision)
        assert todo in problem["detail"] and "force: true with a reason" in problem["detail"]
    assert harmed.json()["reasons"] == harm["reasons"]
    assert unforced.status_code == 422 and unforced.json()["field"] == "reason"
    assert phases == {FLAT: 1, HARM: 1} and "ship" not in audits  # nothing changed

    cli = _cli(ship_api, HARM, "int8", "--yes")  # the CLI shows the same refusal and the way out
    assert cli.returncode == 1 and "guardrail breached" in cli.stderr and "--force --reason" in cli.stderr, cli.stderr


def test_a_shipped_winner_is_followed_by_the_sdk_config_the_audit_log_and_assignment(ship_api: ApiServer) -> None:
    from ablab.platform.sdk.client import AblabClient

    compared = _results(ship_api, WIN)
    decision = next(d for d in compared["decisions"] if d["variant"] == "int8")
    assert decision["decision"] == "ship", decision  # the fixture's traffic is decisive
    assert compared["window"]["end"] is None and compared["window"]["shipped"] is None
    with ship_api.client("sdk") as c:
        config = c.get("/v1/sdk/config")
    etag, revision = config.headers["ETag"], config.json()["revision"]
    before = _assigned_by_api(ship_api, WIN)
    assert set(before) == {"control", "int8"} and sum(before.values()) < 0.6 * len(UNITS)  # traffic 0.5
    sdk = AblabClient(ship_api.base_url, ship_api.tokens["sdk"], refresh_s=3600)
    try:
        assert sdk.wait_ready(10)

        with ship_api.client("editor") as c:
            shipped = c.post(f"/v1/experiments/{WIN}/ship", json={"variant": "int8"})
        assert shipped.status_code == 200, shipped.text
        body = shipped.json()
        assert not body["replayed"] and shipped.headers["ETag"] == f'"{body["experiment"]["version"]}"'
        ship = body["ship"]
        assert (ship["variant"], ship["phase"], ship["previous_phase"], ship["forced"]) == ("int8", 2, 1, False)
        assert ship["actor"] == "test-editor" and ship["decision"] == "ship" and ship["reasons"] == decision["reasons"]

        # the SDK config: a new revision and ETag; int8 alone weighted, in a new phase, on all traffic
        with ship_api.client("sdk") as c:
            after = c.get("/v1/sdk/config", headers={"If-None-Match": etag})
        assert after.status_code == 200 and after.headers["ETag"] != etag and after.json()["revision"] > revision
        entry = next(e for e in after.json()["experiments"] if e["key"] == WIN)
        assert (entry["phase"], entry["traffic"], entry["forced"], entry["status"]) == (2, 1.0, {}, "running")
        assert {v["key"]: v["weight"] for v in entry["variants"]} == {"control": 0.0, "int8": 1.0}

        # assignment: every unit gets int8, from the API (its cache follows the revision) and the SDK
        everyone = {"int8": len(UNITS)}
        assert wait_for(lambda: _assigned_by_api(ship_api, WIN) == everyone, timeout_s=30, what="/v1/assign to follow")
        assert sdk.refresh()
        assert [[a.variant for a in found] for found in sdk.assign_batch(UNITS, experiments=[WIN])] == [["int8"]] * len(UNITS)
        with ship_api.client("sdk") as c:
            qa = c.post("/v1/assign", json={"unit_id": "qa-unit", "experiments": [WIN]}).json()["assignments"]
        assert [a["variant"] for a in qa] == ["int8"]  # the forced QA unit too
    finally:
        sdk.close()

    # the audit log: who, when, what changed, and the decision's evidence
    with ship_api.client("viewer") as c:
        [entry, *_] = c.get(f"/v1/experiments/{WIN}/audit").json()
        status = c.get(f"/v1/experiments/{WIN}/ship").json()
    assert (entry["action"], entry["actor"]) == ("ship", "test-editor")
    assert entry["before"]["phase"] == 1 and entry["before"]["traffic"] == 0.5 and entry["after"]["phase"] == 2
    evidence = entry["after"]["ship"]["evidence"]
    assert {(r["metric"], r["variant"]) for r in evidence["primary"]} == {("e2e_ms", "control"), ("e2e_ms", "int8")}
    assert evidence["srm"]["flagged"] is False
    int8 = next(r for r in evidence["primary"] if r["variant"] == "int8")
    assert int8["rel_diff"] < 0 and int8["p_value_adjusted"] < 0.05
    assert status["shipped"] == ship

    # after the ship, traffic arrives for INT8 alone (every unit on it, exposures too) ...
    loaded = _rows(ship_api, WIN)
    _traffic(ship_api, start=_at(ship["at"]) + timedelta(seconds=1), duration_s=60, variants=["int8"],
             requests=3000, units=1500)
    wait_for(lambda: _rows(ship_api, WIN)["inference"].get("int8", 0) >= loaded["inference"]["int8"] + 3000,
             timeout_s=60, what="the post-ship traffic to be in the store")
    now = _rows(ship_api, WIN)
    assert now["inference"]["control"] == loaded["inference"]["control"]
    assert now["exposure"]["int8"] > loaded["exposure"]["int8"]
    # ... and results still compare the phases before the ship: no split mismatch, the same
    # decision and numbers, and the window says why
    after = _results(ship_api, WIN)
    assert not after["srm"]["flagged"] and after["srm"]["observed"] == compared["srm"]["observed"], after["srm"]
    assert next(d for d in after["decisions"] if d["variant"] == "int8")["decision"] == "ship"
    for a, b in zip(after["metrics"], compared["metrics"], strict=True):  # (the rollup then, the raw scan now)
        assert (a["metric"], a["variant"], a["n"], a["units"]) == (b["metric"], b["variant"], b["n"], b["units"])
        assert a["estimate"] == b["estimate"] or a["estimate"] == pytest.approx(b["estimate"], rel=1e-9), (a, b)
    shipped_window = after["window"]["shipped"]
    assert (shipped_window["variant"], shipped_window["phase"]) == ("int8", 2)
    assert _at(shipped_window["at"]) == _at(after["window"]["end"]) == _at(ship["at"])
    with ship_api.client("viewer") as c:  # the time series ends with the last window before the ship
        series = c.get(f"/v1/experiments/{WIN}/timeseries").json()["series"]
    # (the post-ship windows are in the store: the route wrote them with the traffic)
    assert all(_at(p["ts"]) + timedelta(seconds=10) <= _at(ship["at"]) for s in series for p in s["points"])

    # a retry is the same event: 200, the same ship and phase, no second audit entry
    with ship_api.client("editor") as c:
        again = c.post(f"/v1/experiments/{WIN}/ship", json={"variant": "int8"})
        actions = [a["action"] for a in c.get(f"/v1/experiments/{WIN}/audit").json()]
    assert again.status_code == 200 and again.json()["replayed"] and again.json()["ship"] == ship
    assert actions.count("ship") == 1
    cli = _cli(ship_api, WIN, "int8")  # no prompt needed: the CLI sees it shipped already
    assert cli.returncode == 0 and "already shipped" in cli.stderr and "1 → 2" in cli.stdout, cli.stdout + cli.stderr


def test_the_cli_forces_a_ship_with_a_reason_after_confirmation(ship_api: ApiServer) -> None:
    declined = subprocess.run([ABLAB, "ship", FLAT, "int8", "--force", "--reason", "launch deadline"], input="n\n",
                              env={**os.environ, "ABLAB_API_URL": ship_api.base_url, "ABLAB_TOKEN": ship_api.tokens["editor"],
                                   "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert declined.returncode == 1 and "keep running" in declined.stdout and "nothing shipped" in declined.stderr
    with httpx.Client(base_url=ship_api.base_url, headers={"Authorization": f"Bearer {ship_api.tokens['viewer']}"}) as c:
        assert c.get(f"/v1/experiments/{FLAT}").json()["phase"] == 1
    done = _cli(ship_api, FLAT, "int8", "--force", "--reason", "launch deadline", "--yes")
    assert done.returncode == 0, done.stderr
    assert "forced" in done.stdout and "launch deadline" in done.stdout and "1 → 2" in done.stdout
    with ship_api.client("viewer") as c:
        [entry, *_] = c.get(f"/v1/experiments/{FLAT}/audit").json()
    assert entry["action"] == "ship" and entry["after"]["ship"]["forced"] is True
    assert entry["after"]["ship"]["decision"] == "keep_running" and entry["after"]["ship"]["reason"] == "launch deadline"


def test_the_dashboard_client_reads_and_ships_through_the_same_routes(ship_api: ApiServer) -> None:
    from ablab.dashboards.client import ApiClient, ApiError

    editor = ApiClient(ship_api.base_url, ship_api.tokens["editor"])
    try:
        with pytest.raises(ApiError) as refused:
            editor.ship(HARM, "int8")
        assert refused.value.status == 409 and refused.value.field == "variant" and "do not ship it" in refused.value.detail
        assert editor.ship_status(HARM) is None
        with ship_api.client("viewer") as c:
            shipped = c.get(f"/v1/experiments/{WIN}/ship").json()["shipped"]
        assert shipped is not None and editor.ship_status(WIN) == shipped  # shipped by the test above
        assert editor.ship(WIN, "int8")["replayed"] is True
    finally:
        editor.close()
