"""`ablab apply -f` with a `factors:` section against a real API: declares, then changes nothing."""

from __future__ import annotations

import os
import subprocess

import pytest

from ablab_testing import ABLAB

pytestmark = pytest.mark.integration

YAML = """
factors:
  - name: engine
    type: enum
    values: [vllm, sglang]
    default: vllm
    description: {description}
  - {{name: params.temperature, type: number, min: 0, max: 2}}
experiments:
  - key: open-factors
    name: Open factors
    traffic: 1
    control: base
    variants:
      - {{key: base, weight: 1, strategy: {{backend: smollm, params: {{temperature: 0.2}}}}}}
      - key: hot
        weight: 1
        strategy: {{backend: smollm, engine: sglang, system_prompt: "Answer briefly.", params: {{temperature: 1.0, max_tokens: 64}}}}
"""


def apply(server, path, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ABLAB_TOKEN": server.tokens["editor"], "ABLAB_API_URL": server.base_url, "COLUMNS": "200"}
    done = subprocess.run([ABLAB, "apply", "-f", str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_apply_declares_factors_before_the_experiments_that_use_them(api_server, tmp_path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(YAML.format(description="Serving engine."))
    first = apply(api_server, path).stdout
    assert first.count("declared") == 2 and "created" in first
    second = apply(api_server, path).stdout
    assert "declared" not in second and "updated" not in second and "created" not in second
    assert second.count("unchanged") == 3  # two factors and the experiment: the 1.0 → 1 spelling hashes alike
    path.write_text(YAML.format(description="Serving engine behind the backend."))
    third = apply(api_server, path).stdout
    assert "updated" in third and "unchanged" in third
    with api_server.client("viewer") as c:
        assert c.get("/v1/factors/engine").json()["description"] == "Serving engine behind the backend."
        exp = c.get("/v1/experiments/open-factors").json()
    assert exp["phase"] == 1 and exp["variants"][1]["strategy"]["engine"] == "sglang"
    assert exp["variants"][1]["strategy"]["params"] == {"temperature": 1, "max_tokens": 64}
    path.write_text(YAML.format(description="x").replace("engine: sglang", "engine: triton"))
    refused = apply(api_server, path, ok=False)
    assert "triton" in refused.stdout + refused.stderr and "one of 'vllm', 'sglang'" in refused.stdout + refused.stderr
