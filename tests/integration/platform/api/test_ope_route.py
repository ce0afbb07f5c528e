"""``POST /v1/experiments/{key}/ope`` (issue 33) gives ``ablab ope``'s numbers.

1. Today's logs, end to end: a two-variant experiment's events and labels posted over HTTP go
   through real Kafka and the API's loader into chDB; OPE of "always b" (propensities from the
   weights: today's events carry none) equals the shared function on the same events, and bad
   candidates get a 422 naming the field.
2. Policy logs: events carrying ``arm``, ``propensity`` and ``policy_version`` (which the
   event schema does not accept yet, so they are written into ``raw_events`` directly, as the
   loader writes a row: the fields in the stored JSON) read back through the route's one
   store function equal the event file, to the bit.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from ablab.platform.policy.candidate import ope_from_events
from ablab.platform.stats.spec import parse_spec
from ablab_testing import start_api, stop_api

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api(kafka_broker, tmp_path_factory):
    home = tmp_path_factory.mktemp("ope-home")
    server = start_api(
        f"sqlite:///{home / 'ablab.db'}", home,
        extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_GUARDRAIL_INTERVAL_S": "0", "ABLAB_ANALYTICS": "true"},
    )
    yield server
    stop_api(server)


def _events(key: str, n: int, seed: int) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(seed)
    now = datetime.now(UTC)
    events, labels = [], []
    for i in range(n):
        unit = i % 60
        variant = "ab"[unit % 2]
        trace = f"{key}-{i}"
        e2e = float(rng.lognormal(5, 0.3))
        events.append({"v": 1, "type": "inference", "ts": (now + timedelta(milliseconds=i)).isoformat(),
                       "trace_id": trace, "experiment": key, "variant": variant, "unit_id": f"u{unit}",
                       "ttft_ms": e2e / 4, "e2e_ms": e2e, "tpot_ms": 4.0, "prompt_tokens": int(rng.integers(10, 900)),
                       "output_tokens": 12, "device_s": e2e / 1000, "cost_usd": 2e-5, "price_version": "2026-01",
                       "strategy": "s", "dims": {"plan": ["free", "pro"][unit % 3 % 2]}})
        labels.append({"trace_id": trace, "correct": int(rng.random() < (0.6 if variant == "a" else 0.7)), "source": "judge"})
    return events, labels


def _file(path, events: list[dict]) -> pa.Table:
    """The events as ``ablab ope`` reads them: a JSON Lines file."""
    from ablab.platform.analytics.event_files import read_events

    path.write_text("\n".join(json.dumps(e) for e in events))
    return read_events(path)


def test_route_equals_the_shared_function_on_todays_logs(api, tmp_path) -> None:
    key = f"ope-{uuid.uuid4().hex[:6]}"
    body = {"key": key, "name": key, "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 3}], "metrics": {"primary": ["accuracy"]}}
    with api.client("editor") as c:
        c.post("/v1/experiments", json=body).raise_for_status()
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
        exp = c.get(f"/v1/experiments/{key}").json()
    events, labels = _events(key, 240, seed=3)
    with api.client("sdk") as c:
        r = c.post("/v1/events", json={"events": events})
        assert r.status_code == 202 and r.json()["accepted"] == len(events), r.json().get("errors", [])[:3]
        assert c.post("/v1/feedback", json={"labels": labels}).json()["accepted"] == len(labels)

    candidate = {"kind": "fixed", "arm": "b"}
    doc: dict = {}
    deadline = time.monotonic() + 120
    with api.client("viewer") as c:
        while time.monotonic() < deadline:  # until the loader has every request and its label
            r = c.post(f"/v1/experiments/{key}/ope", json={"policy": candidate})
            if r.status_code == 200:
                doc = r.json()
                if doc["n"] == len(events) and doc["rows_without_value"] == 0:
                    break
            time.sleep(2.0)
        assert doc.get("n") == len(events), doc
        spec_body = {"key": key, "control": "a", "variants": body["variants"], "metrics": body["metrics"],
                     "start": exp["started_at"]}
        table = _file(tmp_path / "events.jsonl", [*events, *({"v": 1, "type": "feedback", **lab} for lab in labels)])
        expected = json.loads(json.dumps(ope_from_events(table, parse_spec(spec_body), candidate)))
        for e in ("ips", "snips", "dr"):
            assert doc[e]["estimate"] == pytest.approx(expected[e]["estimate"], rel=1e-9), e
            assert doc[e]["ci"] == pytest.approx(expected[e]["ci"], rel=1e-9), e
        assert doc["ess"] == pytest.approx(expected["ess"], rel=1e-9)
        b = next(row for row in doc["logged"] if row["arm"] == "b")
        assert doc["snips"]["estimate"] == pytest.approx(b["estimate"], rel=1e-12)  # weights: 1/0.75 on b, 0 on a

        r = c.post(f"/v1/experiments/{key}/ope", json={"policy": {"kind": "fixed", "arm": "zz"}})
        assert r.status_code == 422 and r.json()["field"] == "arm", r.text
        r = c.post(f"/v1/experiments/{key}/ope", json={"policy": {"kind": "slo_router", "arms": {"a": {}, "b": {}},
                                                                   "slo": {"cost_usd_p95": 1}, "objective": "accuracy",
                                                                   "explore": 0.1}})
        assert r.status_code == 422 and r.json()["field"] == "policy.slo", r.text
        r = c.post(f"/v1/experiments/{key}/ope", json={"policy": candidate, "metric": "e2e_ms_p95"})
        assert r.status_code == 422 and r.json()["field"] == "metric", r.text


def test_store_read_of_policy_logs_equals_the_event_file(tmp_path) -> None:
    from ablab.platform.policy.evaluate import Decider
    from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy
    from ablab.streaming.store.client import make_client
    from ablab.streaming.store.ddl import apply_ddl
    from ablab.streaming.store.reads import StoreReads

    env = Environment()
    router = router_policy(env, explore=0.1)
    events, spec_body = experiment_events(env, Decider(router, fit_after_exploring(router, env)), np.random.default_rng(4),
                                          key="opesql", n=1200, n_units=120)
    client = make_client(f"chdb://{tmp_path / 'chdb'}")
    apply_ddl(client)
    columns = ["event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id", "ttft_ms", "e2e_ms", "tpot_ms",
               "prompt_tokens", "output_tokens", "device_s", "cost_usd", "price_version", "error", "strategy", "correct",
               "score", "source", "payload", "measures", "dims", "kafka_partition", "kafka_offset", "shadow_of", "shadow"]
    rows = []
    for i, e in enumerate(events):
        g = e.get
        rows.append([f"e{i}", e["type"], datetime.fromisoformat(e["ts"].replace("Z", "+00:00")), g("trace_id") or "",
                     g("experiment") or "", g("variant") or "", g("unit_id") or "", g("ttft_ms"), g("e2e_ms"), g("tpot_ms"),
                     g("prompt_tokens"), g("output_tokens"), g("device_s"), g("cost_usd"), g("price_version") or "",
                     g("error"), g("strategy") or "", g("correct"), g("score"), g("source") or "", json.dumps(e),
                     g("measures") or {}, g("dims") or {}, 0, i, "", ""])
    client.insert("raw_events", rows, column_names=columns)

    store = StoreReads(client)  # what the API's analytics backend reads through
    spec = parse_spec(spec_body)
    from_store = store.logged_events("opesql")
    from_file = _file(tmp_path / "events.jsonl", events)
    for candidate in ({"kind": "fixed", "arm": "control"}, {"kind": "fixed", "arm": "expert"},
                      {"kind": "rule", "arms": {"fast": {}, "helpful": {}, "expert": {}}, "default": "helpful",
                       "rules": [{"when": {"attr.plan": {"eq": "pro"}}, "arm": "expert"}]}):
        a, b = ope_from_events(from_store, spec, candidate), ope_from_events(from_file, spec, candidate)
        assert a["n"] == 1200 and a["rows_without_value"] == 0
        assert a == b, candidate
