"""The SmolLM2 runner's build-progress reading (from scripts/llm.sh's log) and its server command."""

import sys

import pytest

from ablab.inference import llamacpp


@pytest.fixture
def no_llama(monkeypatch, tmp_path):
    monkeypatch.setenv("ABLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    (tmp_path / "wheels").mkdir()
    return tmp_path / "wheels" / "llama-cpp-python-0.3.36.log"


def test_progress_is_the_last_ninja_step(no_llama):
    assert llamacpp.build_state().state == "not built"
    no_llama.write_text("==> building\n  [1/193] gcc a.c\n  [29/193] g++ b.cpp\n")
    state = llamacpp.build_state()
    assert (state.state, state.done, state.total) == ("building", 29, 193)
    assert "15%" in state.describe()
    no_llama.write_text(no_llama.read_text() + "==> build FAILED (exit 1); see above\n")
    assert llamacpp.build_state().state == "failed"


def test_wait_reports_then_refuses_a_failed_build(no_llama):
    no_llama.write_text("==> build FAILED (exit 1)\n")
    with pytest.raises(llamacpp.BackendUnavailable, match="failed"):
        llamacpp.wait_installed(report=print, poll_s=0)


def test_server_command_serves_the_gguf_under_its_alias(tmp_path):
    gguf = tmp_path / "m.gguf"
    argv = llamacpp.server_argv(port=8123, model=gguf)
    assert argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert argv[argv.index("--model") + 1] == str(gguf) and argv[argv.index("--model_alias") + 1] == "smollm2"
    assert argv[argv.index("--port") + 1] == "8123"
    # a second request (a gateway shadow) must queue, not cut the running stream short
    assert argv[argv.index("--interrupt_requests") + 1] == "false"

