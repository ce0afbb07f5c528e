"""The H200 script's code path, run on CPU: same script, same table, `--device cpu`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_benchmark_script_runs_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_inference.py"), "--device", "cpu", "--quick", "--sections", "strategies,decode,lora", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| baseline (dense fp32) |" in proc.stdout
    data = json.loads(out.read_text())
    assert data["device"] == "cpu"
    rows = data["strategies"]
    assert all(r["error"] is None and r["n"] > 0 for r in rows.values())
    assert data["decode"]["fp32"]["dense"] > 0
    assert set(data["lora"]) == {"ledger", "mirror", "codebook"}


def test_gpu_script_is_a_prepared_bash_script():
    script = ROOT / "benchmarks" / "gpu" / "run_all.sh"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "bench_inference.py" in text and "timeout" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_gpu_script_dry_run_on_cpu(tmp_path):
    """`run_all.sh dry`: the H200 script itself starts and writes its table without a GPU."""
    env = {**__import__("os").environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "DRY_SECTIONS": "decode"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run_all.sh"), "dry"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "inference-gpu.json").read_text())
    assert data["device"] == "cpu" and data["decode"]["fp32"]["dense"] > 0
    assert (tmp_path / "inference-gpu.md").read_text().strip()
    assert (tmp_path / "gpu.txt").exists()
