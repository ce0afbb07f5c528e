"""The official openai client → ``ablab gateway`` → the in-repo worker's OpenAI endpoints
(``ablab worker``), with the real API (real Kafka, chDB) behind the gateway's events.

A variant's ``params`` reach the worker (``max_tokens: 1`` caps its answer); streaming and
not; sticky units; events in the outbox with tokens equal to the worker's usage, in
ClickHouse through the API, and feedback attributed by the returned trace id.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ablab_testing import free_port, start_api, stop_api
from ablab_testing.gateway_stack import (
    ABLAB,
    create_experiment,
    label_and_check_results,
    outbox_events,
    pick_units,
    start_gateway,
    stop,
    wait_http,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
openai = pytest.importorskip("openai")
pytest.importorskip("torch")

KEY = "gw-worker"
MSGS = [{"role": "user", "content": "17+72="}]


@pytest.fixture(scope="module")
def stack(kafka_broker, tmp_path_factory):
    home: Path = tmp_path_factory.mktemp("gateway-worker")
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home,
                    extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_ANALYTICS": "true", "ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    procs: list[subprocess.Popen] = []
    try:
        create_experiment(api, KEY, {"a": {}, "b": {"params": {"max_tokens": 1}}})
        worker_port, gw_port = free_port(), free_port()
        (home / "map.yaml").write_text("experiment: local\nvariants: {control: {}}\n")
        log = home / "worker.log"
        worker = subprocess.Popen([ABLAB, "worker", "--port", str(worker_port), "--strategy-map", str(home / "map.yaml"),
                                   "--events-file", str(home / "worker-events.jsonl"), "--device", "cpu"],
                                  stdout=log.open("wb"), stderr=subprocess.STDOUT)
        procs.append(worker)
        wait_http(f"http://127.0.0.1:{worker_port}/v1/models", worker, log)
        procs.append(start_gateway(api, home, f"backends:\n  tiny: {{url: 'http://127.0.0.1:{worker_port}/v1', price: {{device: cpu}}}}\n",
                                   gw_port))
        yield {"api": api, "gw": f"http://127.0.0.1:{gw_port}", "home": home}
    finally:
        stop(procs)
        stop_api(api)


def test_gateway_in_front_of_the_in_repo_worker(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    units = pick_units(stack["api"], KEY, per_variant=3)
    expected: dict[str, dict] = {}
    for unit in units:
        raw = client.chat.completions.with_raw_response.create(model="ablab-tiny", messages=MSGS, max_tokens=8, user=unit)
        resp = raw.parse()
        expected[raw.headers["x-ablab-trace-id"]] = {"variant": raw.headers["x-ablab-variant"], "out": resp.usage.completion_tokens,
                                                     "prompt": resp.usage.prompt_tokens}
        with client.chat.completions.with_streaming_response.create(
                model="ablab-tiny", messages=MSGS, max_tokens=8, stream=True, stream_options={"include_usage": True},
                extra_headers={"X-Ablab-Unit": unit}) as s:
            assert s.headers["x-ablab-variant"] == raw.headers["x-ablab-variant"]  # sticky
            chunks = list(s.parse())
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage  # asked for: the gateway keeps the backend's usage chunk
            expected[s.headers["x-ablab-trace-id"]] = {"variant": s.headers["x-ablab-variant"],
                                                       "out": usage.completion_tokens, "prompt": usage.prompt_tokens}
    assert [expected[t]["variant"] for t in list(expected)[::2]] == ["ab"[i % 2] for i in range(len(units))]
    outs = {v: [e["out"] for e in expected.values() if e["variant"] == v] for v in "ab"}
    assert max(outs["b"]) == 1 < min(outs["a"])  # b's params.max_tokens reached the worker

    events = {e["trace_id"]: e for e in outbox_events(stack["home"]) if e["type"] == "inference"}
    for trace, seen in expected.items():
        ev = events[trace]
        assert ev["error"] is None and 0 <= ev["ttft_ms"] <= ev["e2e_ms"] and ev["output_tokens"] == seen["out"]
        if seen["prompt"] is not None:
            assert ev["prompt_tokens"] == seen["prompt"]

    label_and_check_results(stack, KEY, expected=expected, events=events, correct="a", source="human")
