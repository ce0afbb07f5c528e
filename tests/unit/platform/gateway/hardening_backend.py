"""A small real OpenAI-shaped backend for the hardening and protocol tests (Starlette under
uvicorn): what the scripted backend does not serve (embeddings, the Responses API, 4xx
answers, hostile response headers, error bodies with file paths, its own model list), and it
keeps every request's headers and body for assertions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ablab_testing.gateway_harness import serve

LLAMA_500 = ("Invalid request: /home/ci/llama.cpp/common/chat.cpp:123: Expected 'content' to be a string "
             "(see /usr/lib/python3/site-packages/llama_cpp/server/app.py)")


class HostileBackend:
    def __init__(self, models: tuple[str, ...] = ("m1", "m2", "refuse-400", "llama-500", "text-500")) -> None:
        self.models = models
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.url = ""

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

        async def chat(request: Request) -> Response:
            body = json.loads(await request.body())
            self.requests.append((request.url.path, dict(request.headers), body))
            model = body.get("model")
            if model == "refuse-400":
                return JSONResponse({"error": {"message": "max_tokens is too large", "type": "invalid_request_error",
                                               "param": "max_tokens", "code": None}}, status_code=400)
            if model == "llama-500":
                return JSONResponse({"error": {"code": 500, "message": LLAMA_500, "type": "server_error"}}, status_code=500)
            if model == "text-500":
                return Response(f"Traceback (most recent call last):\n  File \"/srv/app/main.py\", line 3\n{LLAMA_500}",
                                status_code=500, media_type="text/plain")
            headers = {"set-cookie": "session=backend-secret; Path=/", "access-control-allow-origin": "*",
                       "access-control-allow-credentials": "true", "x-backend-note": "kept", "connection": "x-secret-hop",
                       "x-secret-hop": "dropped", "strict-transport-security": "max-age=1"}
            if request.url.path.endswith("/embeddings"):
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                return JSONResponse({"object": "list", "model": model,
                                     "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
                                              for i in range(len(inputs))],
                                     "usage": {"prompt_tokens": 5 * len(inputs), "total_tokens": 5 * len(inputs)}},
                                    headers=headers)
            if request.url.path.endswith("/responses"):
                if body.get("stream"):
                    return StreamingResponse(self._responses_stream(), media_type="text/event-stream")
                return JSONResponse({"id": "resp_1", "object": "response", "status": "completed", "model": model,
                                     "output": [{"type": "message", "role": "assistant",
                                                 "content": [{"type": "output_text", "text": "Paris is the capital."}]}],
                                     "usage": {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}}, headers=headers)
            return JSONResponse({"id": "c1", "object": "chat.completion", "model": model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}, headers=headers)

        routes = [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
                  Route("/v1/completions", chat, methods=["POST"]), Route("/v1/embeddings", chat, methods=["POST"]),
                  Route("/v1/responses", chat, methods=["POST"])]
        return Starlette(routes=routes)

    @staticmethod
    async def _responses_stream() -> Any:
        def event(kind: str, obj: dict[str, Any]) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n".encode()

        yield event("response.created", {"response": {"id": "resp_1", "status": "in_progress"}})
        for piece in ("Paris", " is", " the", " capital."):
            yield event("response.output_text.delta", {"item_id": "m1", "output_index": 0, "content_index": 0, "delta": piece})
        yield event("response.completed", {"response": {"id": "resp_1", "status": "completed",
                                                         "usage": {"input_tokens": 7, "output_tokens": 4, "total_tokens": 11}}})

    def last(self) -> tuple[str, dict[str, str], dict[str, Any]]:
        return self.requests[-1]


@contextmanager
def hostile_backend(models: tuple[str, ...] = ("m1", "m2", "refuse-400", "llama-500", "text-500")) -> Iterator[HostileBackend]:
    b = HostileBackend(models)
    with serve(b.app()) as url:
        b.url = url + "/v1"
        yield b
