"""The worker's OpenAI-compatible surface: ``POST /v1/chat/completions``, ``POST /v1/completions``
(streaming as SSE and not) and ``GET /v1/models``, so ``ablab gateway`` (or any OpenAI
client) can sit in front of the in-repo model like any other backend.

Here the worker is a backend, not an experiment: it does no assignment and emits no events
(whatever sits in front measures and emits). The runtime strategy comes from the body's
``ablab_strategy`` (built-in factors, validated like a variant's strategy; a gateway
variant sets it through ``params``), else the worker's default. The prompt is the last user
message (chat) or the prompt (completions), up to the model's 512 characters; ``max_tokens``
is capped at the runtime's 32 new tokens. Sampling fields (``temperature``...) are accepted
and ignored: the in-repo runtime decodes greedily. ``X-Request-Id`` is echoed as the id.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ablab.inference.registry import StrategyNotServable, plan_for
from ablab.inference.tasks import DOMAINS
from ablab.platform.strategy import Strategy

if TYPE_CHECKING:
    from ablab.inference.serving.service import Served
    from ablab.inference.serving.worker import Worker

MODEL_ID = "ablab-tiny"
MAX_PROMPT_CHARS = 512
MAX_NEW_TOKENS = 32


class _Body(BaseModel):
    # unknown OpenAI fields (temperature, n, seed, tools...) are accepted, as OpenAI servers do
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    ablab_strategy: dict[str, Any] | None = None
    ablab_domain: str = Field(default="arith", description=f"Adapter routing hint: one of {DOMAINS}.")

    @property
    def new_tokens(self) -> int:
        return min(self.max_completion_tokens or self.max_tokens or 8, MAX_NEW_TOKENS)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)

    def prompt(self) -> str:
        users = [m for m in self.messages if m.role == "user"] or self.messages
        content = users[-1].content
        if isinstance(content, list):  # content parts: keep the text ones
            return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")
        return content or ""


class CompletionRequest(_Body):
    prompt: str | list[str]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt[:1])


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def _plan(worker: Worker, body: _Body):
    try:
        strategy = Strategy.model_validate(body.ablab_strategy) if body.ablab_strategy is not None else worker.default_strategy
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise OpenAIError(400, f"ablab_strategy: {reasons}", param="ablab_strategy") from exc
    try:
        return plan_for(strategy, worker.service.context)
    except StrategyNotServable as exc:
        raise OpenAIError(400, "ablab_strategy not servable: " + "; ".join(exc.reasons), param="ablab_strategy") from exc


def _check_prompt(text: str, param: str) -> str:
    if not text:
        raise OpenAIError(400, f"{param}: empty prompt", param=param)
    if len(text) > MAX_PROMPT_CHARS:
        raise OpenAIError(400, f"{param}: {len(text)} characters; the in-repo model takes at most {MAX_PROMPT_CHARS}", param=param)
    return text


def _raise_for(served: Served) -> None:
    if served.overloaded:
        raise OpenAIError(503, "overloaded: queued too long to meet the strategy's TTFT SLO; retry", kind="server_error")
    if served.error:
        status = 400 if served.error.startswith("bad_request") else 500
        raise OpenAIError(status, served.error, kind="invalid_request_error" if status == 400 else "server_error")


def _usage(served: Served) -> dict[str, int]:
    return {"prompt_tokens": served.prompt_tokens, "completion_tokens": served.output_tokens,
            "total_tokens": served.prompt_tokens + served.output_tokens}


def _finish(served: Served, limit: int) -> str:
    return "length" if served.output_tokens >= limit else "stop"


class _Shape:
    """What differs between chat and completions: ids, object names, where the text goes."""

    def __init__(self, chat: bool, rid: str, created: int):
        self.chat, self.rid, self.created = chat, rid, created

    def full(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion", "created": self.created,
                "model": MODEL_ID, "choices": [choice], "usage": usage}

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None, *, usage: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"delta": delta or {}} if self.chat else {"text": (delta or {}).get("content", "")})
        out = {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": MODEL_ID, "choices": [choice]}
        if usage:
            out["usage"] = None  # OpenAI sends a null usage on every chunk when usage was asked for
        return out


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _stream(worker: Worker, shape: _Shape, body: _Body, run: Callable[..., Served]) -> AsyncIterator[bytes]:
    """Tokens as the engine decodes them: the generation's token list is read while it grows."""
    loop = asyncio.get_running_loop()
    queued: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(asyncio.to_thread(run, on_submit=lambda req: loop.call_soon_threadsafe(queued.put_nowait, req)))
    usage = body.include_usage
    if shape.chat:
        yield _sse(shape.chunk({"role": "assistant", "content": ""}, usage=usage))
    getter = asyncio.ensure_future(queued.get())
    await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
    req = getter.result() if getter.done() else None
    getter.cancel()
    tokenizer = worker.service.bundle.tokenizer
    sent = ""
    while req is not None and not task.done():
        text = tokenizer.decode(list(req.tokens))
        if len(text) > len(sent) and text.startswith(sent):
            yield _sse(shape.chunk({"content": text[len(sent):]}, usage=usage))
            sent = text
        await asyncio.sleep(0.002)
    served = await task
    try:
        _raise_for(served)
    except OpenAIError as exc:
        yield _sse(exc.body())
        yield b"data: [DONE]\n\n"
        return
    # a revalidated answer (a re-run on the exact configuration) may differ from what was
    # streamed; the stream cannot take text back, so only a continuation is sent
    if served.output.startswith(sent) and len(served.output) > len(sent):
        yield _sse(shape.chunk({"content": served.output[len(sent):]}, usage=usage))
    yield _sse(shape.chunk({}, _finish(served, body.new_tokens), usage=usage))
    if usage:
        tail = shape.chunk(None, usage=True)
        tail["choices"], tail["usage"] = [], _usage(served)
        yield _sse(tail)
    yield b"data: [DONE]\n\n"


def register_openai_routes(app: FastAPI, worker: Worker) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def _serve(request: Request, body: _Body, text: str, *, chat: bool):
        started = time.perf_counter()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        plan = _plan(worker, body)
        shape = _Shape(chat, ("chatcmpl-" if chat else "cmpl-") + rid, int(time.time()))

        def run(on_submit: Callable | None = None) -> Served:
            served = worker.service.serve(text=text, domain=body.ablab_domain, plan=plan, started=started,
                                          max_new_tokens=body.new_tokens, on_submit=on_submit)
            worker.served += 1
            return served

        headers = {"x-request-id": rid}
        if body.stream:
            return StreamingResponse(_stream(worker, shape, body, run), media_type="text/event-stream", headers=headers)
        served = await asyncio.to_thread(run)
        _raise_for(served)
        return JSONResponse(shape.full(served.output, _finish(served, body.new_tokens), _usage(served)), headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest):
        return await _serve(request, body, _check_prompt(body.prompt(), "messages"), chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await _serve(request, body, _check_prompt(body.text(), "prompt"), chat=False)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "ablab"}]}
