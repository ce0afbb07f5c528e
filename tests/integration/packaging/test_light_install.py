"""The light install: a fresh virtualenv with only `pip install ablab` (no extras) imports the
SDK and runs the gateway's CLI, and torch, PyFlink, chDB and Streamlit are not there.

The core's wheels come from a cache pinned by requirements.lock (scripts/wheelhouse.sh), so
pip resolves every dependency itself, offline (`--no-index`), as a user's install would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("platform", "streaming", "inference", "dashboards", "migrations", "cli", "pyproject.toml", "setup.py", "README.md")
HEAVY = ("torch", "pyflink", "chdb", "streamlit", "sqlalchemy", "pandas")


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kwargs)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("light")
    house = _run(["bash", str(ROOT / "scripts" / "wheelhouse.sh")])
    assert house.returncode == 0, house.stderr
    src = base / "src"  # a copy: an in-tree build would leave build/ and egg-info in the checkout
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    pip = _run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--find-links", house.stdout.strip(),
                "-c", str(ROOT / "requirements.lock"), str(src)])
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv


def test_sdk_imports_without_the_heavy_parts(light_venv: Path) -> None:
    probe = (
        "import importlib.util, sys\n"
        "from ablab.platform.sdk import AblabClient, HttpEventSink\n"
        "import ablab.platform.sdk\n"
        f"missing = [m for m in {HEAVY!r} if importlib.util.find_spec(m) is None]\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(missing)); print(','.join(loaded))\n"
    )
    done = _run([str(light_venv / "bin" / "python"), "-c", probe])
    assert done.returncode == 0, done.stderr
    missing, loaded = done.stdout.splitlines()
    assert missing.split(",") == list(HEAVY), f"the light install pulled in: {set(HEAVY) - set(missing.split(','))}"
    assert loaded == ""


def test_cli_runs_and_names_the_extra_a_command_needs(light_venv: Path) -> None:
    ablab = str(light_venv / "bin" / "ablab")
    top = _run([ablab, "--help"])
    assert top.returncode == 0, top.stderr
    assert "gateway" in top.stdout, "the light install must offer `ablab gateway`"
    shown = _run([ablab, "gateway", "--help"])
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "--port" in shown.stdout
    keys = _run([ablab, "keys", "--help"])
    assert keys.returncode == 0, keys.stderr
    worker = _run([ablab, "worker", "--port", "1"])  # the torch runtime is an extra
    assert worker.returncode == 1
    assert "ablab[inference]" in worker.stderr.replace("\n", " "), worker.stderr


def test_light_gateway_serves_a_real_llm(light_venv: Path, tmp_path: Path) -> None:
    """`ablab gateway` from the light install in front of SmolLM2 (llama_cpp.server), driven by
    the official openai client, streaming and not."""
    import json
    import os

    import openai

    from ablab.inference import llamacpp
    from ablab_testing import free_port, wait_http

    backend = llamacpp.start_server(port=free_port(), log=tmp_path / "llm.log")
    port = free_port()
    env = {**os.environ, "ABLAB_HOME": str(tmp_path / "home"),
           "ABLAB_GATEWAY_BACKENDS": json.dumps({"smollm2": {"url": f"{backend.url}/v1", "kind": "llamacpp"}})}
    env.pop("ABLAB_SDK_TOKEN", None)
    gateway = subprocess.Popen([str(light_venv / "bin" / "ablab"), "gateway", "--port", str(port)], env=env,
                               stdout=(tmp_path / "gateway.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", gateway, tmp_path / "gateway.log", timeout=60)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        raw = client.chat.completions.with_raw_response.create(model="smollm2", messages=messages, max_tokens=8)
        reply = raw.parse()
        assert raw.headers.get("x-ablab-trace-id") and reply.usage.completion_tokens >= 1
        assert reply.choices[0].message.content
        chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finally:
        gateway.terminate()
        gateway.wait(10)
        backend.stop()
