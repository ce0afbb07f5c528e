"""`ablab apply -f` against a real API: creates, then changes nothing, then updates."""

from __future__ import annotations

import os
import subprocess

import pytest

from ablab_testing import ABLAB

pytestmark = pytest.mark.integration

YAML = """
layers:
  - {{key: serving}}
experiments:
  - key: gitops-demo
    name: GitOps demo
    layer: serving
    layer_share: 0.5
    traffic: {traffic}
    control: dense
    status: running
    variants:
      - {{key: dense, weight: 1}}
      - {{key: sparse, weight: 1, strategy: {{sparse_ffn_k: 64}}}}
    guardrails:
      - {{metric: ttft_ms_p95, max: 900}}
"""


def apply(server, path) -> str:
    env = {**os.environ, "ABLAB_TOKEN": server.tokens["editor"], "ABLAB_API_URL": server.base_url}
    done = subprocess.run([ABLAB, "apply", "-f", str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_apply_is_idempotent(api_server, tmp_path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(YAML.format(traffic=0.2))
    first = apply(api_server, path)
    assert "created" in first and "running" in first
    second = apply(api_server, path)
    assert "unchanged" in second and "created" not in second and "updated" not in second
    with api_server.client("viewer") as c:
        before = c.get("/v1/experiments/gitops-demo").json()
    path.write_text(YAML.format(traffic=0.6))
    third = apply(api_server, path)
    assert "updated traffic" in third
    with api_server.client("viewer") as c:
        after = c.get("/v1/experiments/gitops-demo").json()
    assert after["traffic"] == 0.6 and after["phase"] == before["phase"]  # a ramp, not a reshuffle
    assert after["version"] == before["version"] + 1
