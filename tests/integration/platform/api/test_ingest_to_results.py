"""Events over HTTP → real Kafka → the API's in-process loader → chdb → /results.

No Flink here (its windows have their own tests): this checks the API's side of the
pipeline end to end: validation, dead letters, signed webhooks, and that results count
exactly the events accepted.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ablab_testing import poll_results, start_api, stop_api

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline_api(kafka_broker, tmp_path_factory):
    home = tmp_path_factory.mktemp("ingest-home")
    server = start_api(
        f"sqlite:///{home / 'ablab.db'}",
        home,
        extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_WEBHOOK_SECRET": "s3cret-for-tests", "ABLAB_GUARDRAIL_INTERVAL_S": "0", "ABLAB_ANALYTICS": "true"},
    )
    yield server
    stop_api(server)


def inference(exp: str, variant: str, unit: str, e2e: float, ts: datetime) -> dict:
    return {
        "v": 1, "type": "inference", "ts": ts.isoformat(), "trace_id": uuid.uuid4().hex, "experiment": exp,
        "variant": variant, "unit_id": unit, "ttft_ms": e2e / 4, "e2e_ms": e2e, "tpot_ms": 5.0,
        "prompt_tokens": 20, "output_tokens": 8, "device_s": e2e / 1000, "cost_usd": 1e-5, "price_version": "2026-01",
        "strategy": "baseline",
    }


def test_events_flow_to_results_and_bad_ones_are_counted(pipeline_api) -> None:
    key = f"ingest-{uuid.uuid4().hex[:6]}"
    with pipeline_api.client("editor") as c:
        c.post("/v1/experiments", json={
            "key": key, "name": key, "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"sparse_ffn_k": 16}}],
        }).raise_for_status()
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
    now = datetime.now(UTC)
    good = [inference(key, "ab"[i % 2], f"u{i % 40}", 100 + (i % 7) * 10 + (30 if i % 2 else 0), now + timedelta(milliseconds=i)) for i in range(400)]  # after the start: results count from it
    wrong_type = {**good[0], "e2e_ms": "fast", "trace_id": "t-bad"}
    unknown = {**good[1], "experiment": "no-such-experiment", "trace_id": "t-unknown"}
    with pipeline_api.client("sdk") as c:
        r = c.post("/v1/events", json={"events": [*good, wrong_type, unknown]})
        assert r.status_code == 202, r.text
        assert r.json()["accepted"] == 400 and r.json()["rejected"] == 2, r.json()["errors"][:3]
        fields = {e["field"] for e in r.json()["errors"]}
        assert "e2e_ms" in fields and "experiment" in fields
        r = c.post("/v1/events", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem+json")
        big = b'{"events": [' + b",".join([json.dumps(good[0]).encode()] * 20_000) + b"]}"
        assert c.post("/v1/events", content=big, headers={"content-type": "application/json"}).status_code == 413
        labels = [{"trace_id": e["trace_id"], "correct": int(e["variant"] == "b"), "source": "human"} for e in good[:100]]
        assert c.post("/v1/feedback", json={"labels": labels}).json()["accepted"] == 100

    # Unsigned / wrongly signed billing is refused; a signed one is accepted.
    from ablab.streaming.ingest import sign_billing

    body = json.dumps({"records": [{"id": "bill-1", "trace_id": good[2]["trace_id"], "experiment": key, "variant": good[2]["variant"], "unit_id": good[2]["unit_id"], "cost_usd": 0.002}]}).encode()
    stamp = int(time.time())
    with pipeline_api.client(scope=None) as c:
        assert c.post("/v1/webhooks/billing", content=body).status_code == 401
        bad = {"X-Ablab-Timestamp": str(stamp), "X-Ablab-Signature": sign_billing(body=body, secret="wrong", timestamp=stamp)}
        assert c.post("/v1/webhooks/billing", content=body, headers=bad).status_code == 401
        good_sig = {"X-Ablab-Timestamp": str(stamp), "X-Ablab-Signature": sign_billing(body=body, secret="s3cret-for-tests", timestamp=stamp)}
        r = c.post("/v1/webhooks/billing", content=body, headers=good_sig)
        assert r.status_code == 202, r.text

    # The in-process loader brings them into chdb; results count exactly what was accepted.
    result = poll_results(pipeline_api, key, timeout_s=120, interval_s=2.0, until=lambda doc: sum(
        m["n"] for m in doc["metrics"] if m["metric"] == "e2e_ms") >= 400)
    n = {m["variant"]: m["n"] for m in result["metrics"] if m["metric"] == "e2e_ms"}
    assert result["experiment"] == key and result["control"] == "a"
    units = {m["variant"]: m["units"] for m in result["metrics"] if m["metric"] == "e2e_ms"}
    if n != {"a": 200, "b": 200}:  # say whether the loader was behind or the read was wrong
        with pipeline_api.client(scope=None) as c:
            loader = [line for line in c.get("/metrics").text.splitlines() if line.startswith(("ablab_loader", "ablab_emitter", "ablab_ingest"))]
        log_tail = (pipeline_api.home / "api.log").read_text(errors="replace")[-6000:]
        pytest.fail(f"results n = {n}, expected 200 each; loader counters: {loader}; metrics: {result['metrics'][:2]}\n"
                    f"API log (tail):\n{log_tail}")
    assert units == {"a": 20, "b": 20}  # 40 users, randomized by user
    diff = next(m for m in result["metrics"] if m["metric"] == "e2e_ms" and m["variant"] == "b")
    mean = {v: sum(e["e2e_ms"] for e in good if e["variant"] == v) / 200 for v in "ab"}
    assert diff["abs_diff"] == pytest.approx(mean["b"] - mean["a"], abs=1e-6)
    metrics_text = __import__("httpx").get(f"{pipeline_api.base_url}/metrics").text
    assert 'ablab_ingest_events_total{endpoint="events",outcome="rejected"} 2.0' in metrics_text
