"""The ingestion edge over real HTTP: hostile values, deep JSON, replayed webhooks, body limits and
slow clients, against real uvicorn processes (SQLite config DB; the broker is absent, so each
API's emitter spools what it accepted to disk, which shows exactly what went on).

Two API processes share one config DB, as a deployment's do: a signed webhook accepted by one
is refused as a replay by the other.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ablab.streaming.ingest import sign_billing
from ablab_testing import ApiServer, closed_port, start_api, stop_api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SECRET = "edge-test-secret"
LIMIT = 64 * 1024
ENV = {
    "ABLAB_ANALYTICS": "false",
    "ABLAB_WEBHOOK_SECRET": SECRET,
    "ABLAB_MAX_BODY_BYTES": str(LIMIT),
    "ABLAB_HTTP_HEADER_TIMEOUT_S": "2",
    "ABLAB_HTTP_BODY_TIMEOUT_S": "2",
}


@pytest.fixture(scope="module")
def apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, ApiServer]]:
    database = f"sqlite:///{tmp_path_factory.mktemp('db') / 'ablab.db'}"
    env = {**ENV, "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}"}
    first = start_api(database, tmp_path_factory.mktemp("api-a"), extra_env=env)
    try:
        second = start_api(database, tmp_path_factory.mktemp("api-b"), extra_env=env)
    except BaseException:
        stop_api(first)
        raise
    try:
        with first.client("editor") as c:
            c.post("/v1/experiments", json={
                "key": "edge", "name": "edge", "unit": "user", "traffic": 1, "control": "a",
                "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"sparse_ffn_k": 16}}],
            }).raise_for_status()
        yield first, second
    finally:
        stop_api(second)
        stop_api(first)


def _now() -> datetime:
    return datetime.now(UTC)


def inference(trace: str, **overrides) -> dict:
    return {"v": 1, "type": "inference", "ts": _now().isoformat(), "trace_id": trace, "experiment": "edge",
            "variant": "a", "unit_id": "u1", "ttft_ms": 10.0, "e2e_ms": 80.0, "tpot_ms": 4.0, "prompt_tokens": 20,
            "output_tokens": 8, "device_s": 0.05, "cost_usd": 1e-5, "price_version": "p1", "strategy": "s1",
            **overrides}


def spooled(server: ApiServer, *, match: str, expect: int) -> list[dict]:
    """Event records the API's emitter spooled whose trace_id starts with ``match`` (waits for ``expect``)."""
    deadline = time.monotonic() + 30
    while True:
        found = []
        for segment in sorted((server.home / "spool").glob("api-*/seg-*.jsonl")):
            for line in segment.read_bytes().splitlines():
                record = json.loads(line)
                value = json.loads(record["value"])
                if not record["topic"].endswith("deadletter") and str(value.get("trace_id", "")).startswith(match):
                    found.append(value)
        if len(found) >= expect or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def metric(server: ApiServer, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def test_poison_values_are_refused_by_name_and_ordinary_events_flow(apis) -> None:
    api, _ = apis
    run = f"p{uuid.uuid4().hex[:8]}"
    poison = [
        (inference(f"{run}-x1", e2e_ms=1.7e308), "e2e_ms"),
        (inference(f"{run}-x2", ts="9999-12-31T00:00:00Z"), "ts"),
        (inference(f"{run}-x3", ts=(_now() + timedelta(hours=1)).isoformat()), "ts"),
        (inference(f"{run}-x4", ts=(_now() - timedelta(days=90)).isoformat()), "ts"),
        (inference(f"{run}-x5", variant="zz"), "variant"),
        (inference(f"{run}-x6", experiment="ghost"), "experiment"),
        (inference(f"{run}-x7", cost_usd=1e300), "cost_usd"),
        (inference(f"{run}-x8", output_tokens=-3), "output_tokens"),
    ]
    good = [inference(f"{run}-ok{i}", variant="ab"[i % 2]) for i in range(6)]
    body = [good[0], good[1], *[p for p, _ in poison], *good[2:]]
    before = metric(api, "ablab_ingest_rejected_fields_total", endpoint="events", field="ts")
    with api.client("sdk") as c:
        r = c.post("/v1/events", json={"events": body})
        assert r.status_code == 202, r.text
        # Python's JSON parser takes NaN; the edge must not.
        nan = json.dumps(inference(f"{run}-nan")).replace('"e2e_ms": 80.0', '"e2e_ms": NaN')
        r_nan = c.post("/v1/events", content=nan, headers={"content-type": "application/json"})
    assert r.json()["accepted"] == 6 and [e["field"] for e in r.json()["errors"]] == [f for _, f in poison]
    assert r_nan.status_code == 202 and r_nan.json()["errors"][0]["field"] == "e2e_ms"
    assert {e["trace_id"] for e in spooled(api, match=run, expect=6)} == {g["trace_id"] for g in good}
    assert metric(api, "ablab_ingest_rejected_fields_total", endpoint="events", field="ts") == before + 3


def test_an_event_inside_a_json_string_is_refused_per_record_on_every_route(apis) -> None:
    api, _ = apis
    run = f"s{uuid.uuid4().hex[:8]}"
    text = json.dumps(inference(f"{run}-text"))
    before = {e: metric(api, "ablab_ingest_rejected_fields_total", endpoint=e, field="$")
              for e in ("events", "feedback", "billing")}
    with api.client("sdk") as c:
        events = c.post("/v1/events", json=[text, inference(f"{run}-ok")])
        labels = c.post("/v1/feedback", json={"labels": [text]})
    billing = json.dumps({"records": [text]}).encode()
    with httpx.Client(base_url=api.base_url, timeout=30) as c:
        records = c.post("/v1/webhooks/billing", content=billing, headers=_signed(billing))
    for answer in (events, labels, records):
        assert answer.status_code == 202, answer.text
        assert answer.json()["errors"][0]["index"] == 0 and answer.json()["errors"][0]["field"] == "$", answer.text
    assert events.json()["accepted"] == 1 and labels.json()["accepted"] == records.json()["accepted"] == 0
    assert [e["trace_id"] for e in spooled(api, match=run, expect=1)] == [f"{run}-ok"]
    for endpoint, count in before.items():
        assert metric(api, "ablab_ingest_rejected_fields_total", endpoint=endpoint, field="$") == count + 1


@pytest.mark.parametrize(("path", "wrap"), [("/v1/events", "events"), ("/v1/feedback", "labels")])
def test_json_nested_1000_deep_is_a_400_problem_and_counted(apis, path: str, wrap: str) -> None:
    api, _ = apis
    endpoint = path.rsplit("/", 1)[-1]
    before = metric(api, "ablab_ingest_events_total", endpoint=endpoint, outcome="too_deep")
    deep = "[" * 1000 + "]" * 1000
    with api.client("sdk") as c:
        for body in (deep, f'{{"{wrap}": {deep}}}', f'[{{"trace_id": "t", "x": {deep}}}]'):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["field"] == "$" and "nested" in r.json()["detail"]
    assert metric(api, "ablab_ingest_events_total", endpoint=endpoint, outcome="too_deep") == before + 3


def _signed(body: bytes, stamp: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if stamp is None else stamp
    return {"X-Ablab-Timestamp": str(stamp), "X-Ablab-Signature": sign_billing(body=body, secret=SECRET, timestamp=stamp),
            "content-type": "application/json"}


def test_webhook_edge_cases_are_4xx_problems(apis) -> None:
    api, _ = apis
    deep = b'{"records": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    with httpx.Client(base_url=api.base_url, timeout=30) as c:
        r = c.post("/v1/webhooks/billing", content=deep, headers=_signed(deep))
        assert r.status_code == 400 and r.json()["field"] == "$", r.text
        body = json.dumps({"records": [{"trace_id": "t", "cost_usd": 1.0}]}).encode()
        headers = {**_signed(body), "X-Ablab-Timestamp": "9" * 400}
        r = c.post("/v1/webhooks/billing", content=body, headers=headers)
        assert r.status_code == 401 and r.json()["field"] == "X-Ablab-Timestamp", r.text
        assert r.headers["content-type"].startswith("application/problem+json")


def test_a_replayed_webhook_is_refused_by_every_api_process(apis) -> None:
    first, second = apis
    body = json.dumps({"records": [{"id": f"inv-{uuid.uuid4().hex[:8]}", "trace_id": "t1", "cost_usd": 0.25}]}).encode()
    headers = _signed(body)
    with httpx.Client(timeout=30) as c:
        accepted = c.post(f"{first.base_url}/v1/webhooks/billing", content=body, headers=headers)
        again_here = c.post(f"{first.base_url}/v1/webhooks/billing", content=body, headers=headers)
        again_there = c.post(f"{second.base_url}/v1/webhooks/billing", content=body, headers=headers)
        # The provider's own retry is signed again with a new timestamp: accepted (deduplicated downstream).
        resigned = c.post(f"{second.base_url}/v1/webhooks/billing", content=body, headers=_signed(body, int(time.time()) + 1))
    assert accepted.status_code == 202 and accepted.json()["accepted"] == 1, accepted.text
    for replay in (again_here, again_there):
        assert replay.status_code == 409 and replay.json()["field"] == "X-Ablab-Signature", replay.text
    assert resigned.status_code == 202, resigned.text
    for api in (first, second):
        assert metric(api, "ablab_ingest_events_total", endpoint="billing", outcome="replayed") >= 1


def test_a_retried_post_without_event_ids_carries_the_same_ids(apis) -> None:
    api, _ = apis
    run = f"r{uuid.uuid4().hex[:8]}"
    batch = [inference(f"{run}-{i}") for i in range(5)]
    with api.client("sdk") as c:
        for _ in range(2):  # a client retrying after a timeout
            assert c.post("/v1/events", json=batch).json()["accepted"] == 5
    records = spooled(api, match=run, expect=10)
    ids = {}
    for record in records:
        ids.setdefault(record["trace_id"], set()).add(record["event_id"])
    assert len(records) == 10 and all(len(v) == 1 for v in ids.values()) and len(ids) == 5


def test_unknown_field_names_do_not_create_metric_series(apis) -> None:
    api, _ = apis
    names = [f"zz_unknown_{uuid.uuid4().hex[:6]}" for _ in range(30)]
    before = metric(api, "ablab_ingest_rejected_fields_total", endpoint="events", field="$other")
    with api.client("sdk") as c:
        r = c.post("/v1/events", json=[inference("t", **{name: 1}) for name in names])
    assert r.json()["rejected"] == 30
    text = httpx.get(f"{api.base_url}/metrics", timeout=10).text
    assert not any(name in text for name in names)
    assert metric(api, "ablab_ingest_rejected_fields_total", endpoint="events", field="$other") == before + 30


# --- body limits and slow clients (raw sockets: a client httpx would not be) ----------------


def _connect(server: ApiServer) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=15)
    return sock


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not chunk:
            return data
        data += chunk
        if b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), None)
            if length is not None and len(rest) >= length:
                return data


def _head(server: ApiServer, path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.tokens['sdk']}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


def test_a_declared_oversized_body_is_refused_before_it_is_read(apis) -> None:
    api, _ = apis
    with _connect(api) as sock:
        sock.sendall(_head(api, "/v1/events", f"Content-Length: {LIMIT * 100}\r\n"))
        response = _read_response(sock)  # answered without one byte of the body
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"application/problem+json" in response


def test_a_chunked_body_is_cut_off_with_413_as_it_passes_the_limit(apis) -> None:
    api, _ = apis
    before = metric(api, "ablab_http_bodies_refused_total")
    chunk = b"[" + b" " * 8190 + b"]"
    sent = 0
    with _connect(api) as sock:
        sock.sendall(_head(api, "/v1/events", "Transfer-Encoding: chunked\r\n"))
        sock.settimeout(0.05)
        response = b""
        while sent < LIMIT * 50 and not response:  # an endless body, unless the server answers
            try:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
                response = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(15)
        response += _read_response(sock)
    assert response.startswith(b"HTTP/1.1 413"), (sent, response[:300])
    assert sent < LIMIT * 4, f"the server read {sent} bytes before refusing (limit {LIMIT})"
    assert metric(api, "ablab_http_bodies_refused_total") == before + 1


def test_slow_headers_are_cut_off(apis) -> None:
    api, _ = apis
    with _connect(api) as sock:
        sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        for _ in range(60):  # one header byte a second: well inside the 5 s keep-alive each time
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(1.0)
            try:
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
    assert closed, "a client trickling its headers held the connection for a minute"
    assert time.monotonic() - started < 15


def test_a_slow_body_gets_408(apis) -> None:
    api, _ = apis
    with _connect(api) as sock:
        sock.sendall(_head(api, "/v1/events", "Content-Length: 1000\r\n") + b'{"events": [')
        response = _read_response(sock)  # the rest of the body never comes
    assert response.startswith(b"HTTP/1.1 408"), response[:300]
    assert b"application/problem+json" in response
