"""The official openai client → a running ``ablab gateway`` process → a real
``llama_cpp.server`` with SmolLM2 (embeddings enabled), as a new user would try it:

- a model no backend serves is a 404 ``model_not_found`` (llama.cpp itself would answer any
  name with SmolLM2), the served one answers, streamed and not;
- ``/v1/embeddings`` is forwarded (llama.cpp serves them with ``--embedding true``);
- ``/v1/responses`` is a 404 naming how a backend declares it (llama.cpp does not serve it);
- the process's HTTP limits, by raw socket: a declared oversized body is refused before it
  is read, a trickled head is closed at its deadline (``ABLAB_HTTP_HEADER_TIMEOUT_S``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from ablab_testing import ABLAB, free_port, wait_http
from ablab_testing.gateway_stack import llama_and_openai, start_llama

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

openai = llama_and_openai()
MSGS = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("gateway-protocol")
    llama_port, gw_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_llama(home, llama_port, "--embedding", "true", n_ctx=1024))
        config = home / "gateway.yaml"
        config.write_text(f"backends:\n  smollm2: {{url: 'http://127.0.0.1:{llama_port}/v1', kind: llamacpp, timeout_s: 300}}\n")
        env = {k: v for k, v in os.environ.items() if k != "ABLAB_SDK_TOKEN"}
        env.update({"ABLAB_HOME": str(home), "ABLAB_HTTP_HEADER_TIMEOUT_S": "1", "ABLAB_HTTP_BODY_TIMEOUT_S": "2"})
        gw_log = home / "gateway.log"
        procs.append(subprocess.Popen([ABLAB, "gateway", "--config", str(config), "--port", str(gw_port)], env=env,
                                      stdout=gw_log.open("wb"), stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", procs[1], gw_log)
        yield {"gw": f"http://127.0.0.1:{gw_port}", "port": gw_port, "log": gw_log}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def test_unknown_model_is_404_and_the_served_one_answers(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=300)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=4)
    err = info.value.body
    assert err["code"] == "model_not_found" and err["param"] == "model" and "gpt-4o" in err["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=4, stream=True)
    assert [m.id for m in client.models.list()] == ["smollm2"]
    answer = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=4, temperature=0)
    assert answer.choices[0].message.content and answer.usage.completion_tokens >= 1
    pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="smollm2", messages=MSGS, max_tokens=4, temperature=0, stream=True) if c.choices and c.choices[0].delta.content]
    assert "".join(pieces)


def test_embeddings_are_forwarded(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=300)
    raw = client.embeddings.with_raw_response.create(model="smollm2", input=["hello", "world"])
    data = json.loads(raw.content)
    assert len(data["data"]) == 2 and data["usage"]["prompt_tokens"] >= 2 and raw.headers["x-ablab-trace-id"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="hello")


def test_responses_api_is_404_for_a_backend_that_does_not_serve_it(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=300)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="smollm2", input="hello")
    assert info.value.body["code"] == "unsupported_endpoint" and "responses: true" in info.value.body["message"]


def _read_until_closed(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(65536):  # a refusal carries Connection: close
        chunks.append(chunk)
    return b"".join(chunks)


def test_the_gateway_process_serves_under_its_http_limits(stack) -> None:
    with socket.create_connection(("127.0.0.1", stack["port"]), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 999999999\r\n\r\n")
        answer = _read_until_closed(s)  # the head and body may come in separate segments
    assert answer.startswith(b"HTTP/1.1 413") and b'"type":"invalid_request_error"' in answer
    with socket.create_connection(("127.0.0.1", stack["port"]), timeout=10) as s:
        started = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
        assert s.recv(65536) == b""  # closed at the head deadline (1 s here), not the 10 s socket timeout
        assert time.monotonic() - started < 8
    assert "Traceback" not in stack["log"].read_text(errors="replace")
