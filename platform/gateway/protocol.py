"""The OpenAI wire format as the gateway needs it: SSE framing and chunk shapes, pure.

The gateway never re-serializes a body it can copy: it parses a request body once (to read
``model``, ``stream``, ``user`` and to apply a strategy), and parses each stream chunk only
to measure it; the bytes it forwards are the backend's own, except for a usage-only chunk
it strips when the caller did not ask for usage.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

DONE = b"[DONE]"
MAX_BODY_BYTES = 16 * 1024 * 1024  # a request body over this is refused (413)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class ProtocolError(ValueError):
    """The caller's request is not a valid OpenAI request; ``param`` names the field."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI-shaped error object, so the official clients raise their usual exceptions."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def parse_body(raw: bytes, *, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise ProtocolError(f"request body is {len(raw)} bytes; the limit is {max_bytes}", status=413)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Fields read by the gateway or by the backends it fronts, and the JSON type each must have
# when present (null is accepted as absent, as OpenAI's API does). Checked before anything is
# assigned or forwarded, so a malformed body is the caller's 400, never a backend's 500 or
# a failure in the gateway's own bookkeeping.
_TYPED: dict[str, tuple[str, Any]] = {
    "model": ("a string", lambda v: isinstance(v, str)),
    "stream": ("a boolean", lambda v: isinstance(v, bool)),
    "stream_options": ("an object", lambda v: isinstance(v, dict)),
    "user": ("a string", lambda v: isinstance(v, str)),
    "n": ("an integer", _is_int),
    "max_tokens": ("an integer", _is_int),
    "max_completion_tokens": ("an integer", _is_int),
    "max_output_tokens": ("an integer", _is_int),
    "temperature": ("a number", _is_number),
    "top_p": ("a number", _is_number),
    "presence_penalty": ("a number", _is_number),
    "frequency_penalty": ("a number", _is_number),
    "seed": ("an integer", _is_int),
    "logprobs": ("a boolean or an integer", lambda v: isinstance(v, (bool, int))),
    "top_logprobs": ("an integer", _is_int),
    "stop": ("a string or an array of strings", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))),
    "tools": ("an array", lambda v: isinstance(v, list)),
    "response_format": ("an object", lambda v: isinstance(v, dict)),
    "metadata": ("an object", lambda v: isinstance(v, dict)),
    "logit_bias": ("an object", lambda v: isinstance(v, dict)),
    "encoding_format": ("a string", lambda v: isinstance(v, str)),
    "dimensions": ("an integer", _is_int),
    "instructions": ("a string", lambda v: isinstance(v, str)),
    "previous_response_id": ("a string", lambda v: isinstance(v, str)),
}


def check_common(body: dict[str, Any]) -> None:
    for name, value in body.items():  # a body has a few fields; the table has many
        spec = _TYPED.get(name)
        if spec is not None and value is not None and not spec[1](value):
            raise ProtocolError(f"`{name}` must be {spec[0]}, got {_json_type(value)}", param=name)
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
        raise ProtocolError("`stream_options.include_usage` must be a boolean", param="stream_options.include_usage")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _check_messages(messages: Any, param: str = "messages") -> None:
    if not isinstance(messages, list) or not messages:
        raise ProtocolError(f"`{param}` must be a non-empty array", param=param)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ProtocolError(f"`{param}[{i}]` must be an object", param=f"{param}[{i}]")
        if not isinstance(m.get("role"), str):
            raise ProtocolError(f"`{param}[{i}].role` must be a string", param=f"{param}[{i}].role")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ProtocolError(f"`{param}[{i}].content` must be a string or an array of parts", param=f"{param}[{i}].content")
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise ProtocolError(f"`{param}[{i}].content` parts must be objects", param=f"{param}[{i}].content")


def check_chat(body: dict[str, Any]) -> None:
    check_common(body)
    _check_messages(body.get("messages"))


def check_completion(body: dict[str, Any]) -> None:
    check_common(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise ProtocolError("`prompt` must be a string or an array", param="prompt")
    if isinstance(prompt, list) and not _strings_or_tokens(prompt):
        raise ProtocolError("`prompt` must be a string, an array of strings, or token arrays", param="prompt")
    if "messages" in body:
        raise ProtocolError("`messages` belongs to /v1/chat/completions; /v1/completions takes `prompt`", param="messages")


def _strings_or_tokens(items: list[Any]) -> bool:
    if all(isinstance(x, str) for x in items) or all(_is_int(x) for x in items):
        return True
    return all(isinstance(x, list) and all(_is_int(t) for t in x) for x in items)


def check_embeddings(body: dict[str, Any]) -> None:
    check_common(body)
    value = body.get("input")
    if not (isinstance(value, str) or (isinstance(value, list) and value and _strings_or_tokens(value))):
        raise ProtocolError("`input` must be a string, a non-empty array of strings, or token arrays", param="input")
    if body.get("stream"):
        raise ProtocolError("/v1/embeddings does not stream", param="stream")


def check_responses(body: dict[str, Any]) -> None:
    check_common(body)
    value = body.get("input")
    if isinstance(value, list):
        if not all(isinstance(item, dict) for item in value):
            raise ProtocolError("`input` items must be objects", param="input")
    elif not isinstance(value, str):
        raise ProtocolError("`input` must be a string or an array of input items", param="input")


def wants_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


# --- SSE -------------------------------------------------------------------------------


class SseSplitter:
    """Cuts a byte stream into complete SSE events (``b"data: ...\\n\\n"``), keeping each
    event's bytes exactly as received. Accepts ``\\n\\n`` and ``\\r\\n\\r\\n`` separators."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        events: list[bytes] = []
        start = 0
        while True:
            cut = buf.find(b"\n\n", start)
            alt = buf.find(b"\r\n\r\n", start)
            if cut < 0 and alt < 0:
                break
            if alt >= 0 and (cut < 0 or alt < cut):
                end = alt + 4
            else:
                end = cut + 2
            events.append(buf[start:end])
            start = end
        self._buf = buf[start:]
        return events

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream that ended mid-event)."""
        rest, self._buf = self._buf, b""
        return rest

    def pending(self) -> int:
        """Bytes held waiting for the end of their event (what a bound on memory watches)."""
        return len(self._buf)


def event_data(event: bytes) -> bytes | None:
    """The ``data`` payload of one SSE event (multi-line data joined), or None (comments,
    ``event:``-only or empty events)."""
    parts = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            parts.append(line[6:] if line[5:6] == b" " else line[5:])
    return b"\n".join(parts) if parts else None


# --- chunks ----------------------------------------------------------------------------


class ChunkView(NamedTuple):
    """What one parsed stream chunk means for measurement. A tuple, not a frozen dataclass:
    one is built per SSE event, and a frozen dataclass's ``__init__`` (a ``object.__setattr__``
    per field) was most of the meter's CPU in a profile."""

    generated: bool  # carries content, reasoning, tool-call or completion text
    text_chars: int  # characters of generated text (for an estimate when usage is absent)
    usage_only: bool  # usage with no choices (``[]`` or ``null``): strip when not asked
    usage: dict[str, Any] | None
    finish_reason: str | None
    error: Any = None  # an ``error`` object sent in the stream


def _delta_chars(choice: dict[str, Any]) -> tuple[bool, int]:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        n = 0
        generated = False
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                generated = True
                n += len(value)
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls:
            generated = True
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    n += len(fn.get("arguments") or "") + len(fn.get("name") or "")
        return generated, n
    text = choice.get("text")  # /v1/completions
    if isinstance(text, str) and text:
        return True, len(text)
    return False, 0


_RESPONSES_DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta",
                               "response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
                               "response.refusal.delta"})
_RESPONSES_DONE = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses API usage object (``input_tokens``/``output_tokens``) in the chat shape
    the translators read (``prompt_tokens``/``completion_tokens``); others as they are."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        return {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens"),
                "total_tokens": usage.get("total_tokens")}
    return usage


def _view_responses_event(chunk: dict[str, Any], kind: str) -> ChunkView:
    """One Responses API stream event (``POST /v1/responses`` with ``stream: true``)."""
    if kind in _RESPONSES_DELTAS:
        delta = chunk.get("delta")
        n = len(delta) if isinstance(delta, str) else 0
        return ChunkView(n > 0, n, False, None, None)
    if kind in _RESPONSES_DONE:
        response = chunk.get("response")
        usage = responses_usage(response.get("usage")) if isinstance(response, dict) else None
        finish = "stop" if kind == "response.completed" else kind.rsplit(".", 1)[1]
        error = response.get("error") if kind == "response.failed" and isinstance(response, dict) else None
        # never usage-only: this event ends the caller's stream, it is never stripped
        return ChunkView(False, 0, False, usage, finish, error=error)
    if kind == "error":
        return ChunkView(False, 0, False, None, None, error=chunk.get("message") or "error")
    return ChunkView(False, 0, False, None, None)


_TEXT_KEYS = ("content", "reasoning_content", "reasoning")


def text_delta_chars(chunk: Any) -> int | None:
    """The characters of generated text in a chunk of the commonest shape (one choice with a
    text delta, or completion ``text``; no finish, usage, error, tool call or ``type``), which
    is then all :func:`view_chunk` would say of it (``generated`` is this > 0); None for any
    other chunk: ask :func:`view_chunk`. Measured: the meter's per-event cost was mostly
    building the view; most events of a stream are this shape."""
    if type(chunk) is not dict or "usage" in chunk or "error" in chunk or "type" in chunk:
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if delta is None:
        text = choice.get("text")
        if text is None:
            return 0
        return len(text) if type(text) is str else None
    if type(delta) is not dict or "tool_calls" in delta:
        return None
    n = 0
    for key in _TEXT_KEYS:
        value = delta.get(key)
        if value is not None:
            if type(value) is not str:
                return None
            n += len(value)
    return n


def view_chunk(chunk: Any) -> ChunkView:
    if not isinstance(chunk, dict):
        return ChunkView(False, 0, False, None, None, error="chunk is not an object")
    kind = chunk.get("type")
    if isinstance(kind, str) and (kind.startswith("response.") or kind == "error") and "choices" not in chunk:
        return _view_responses_event(chunk, kind)
    choices = chunk.get("choices")
    usage = chunk.get("usage")
    usage = usage if isinstance(usage, dict) else None
    generated, chars, finish = False, 0, None
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if type(delta) is dict and "tool_calls" not in delta:  # most chunks: a text delta, inlined
                for key in _TEXT_KEYS:
                    value = delta.get(key)
                    if isinstance(value, str) and value:
                        generated = True
                        chars += len(value)
            else:
                g, n = _delta_chars(choice)
                generated |= g
                chars += n
            finish = choice.get("finish_reason") or finish
    usage_only = usage is not None and not choices
    return ChunkView(generated, chars, usage_only, usage, finish, chunk.get("error"))


def chunk_text(chunk: Any) -> str:
    """The generated text (content, else reasoning; or completion text) of one stream chunk."""
    out = []
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            value = delta.get("content")
            if isinstance(value, str):
                out.append(value)
        elif isinstance(choice.get("text"), str):
            out.append(choice["text"])
    return "".join(out)


def response_text(body: Any) -> str:
    """The answer's text of a non-streaming response (the first choice's message or text)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        msg = choice.get("message")
        if isinstance(msg, dict) and isinstance(content := msg.get("content"), str):
            return content
        if isinstance(text := choice.get("text"), str):
            return text
    return ""


def message_text(body: dict[str, Any]) -> str:
    """All text the caller sent (chat messages, a completion prompt, an embeddings or
    Responses ``input``), for token estimates. Total over any JSON: never raises."""
    out: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        _texts(messages, out)
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            _texts(value, out)
    return "\n".join(out)


def _texts(items: list[Any], out: list[str]) -> None:
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            content = item.get("content")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


def estimate_tokens(chars: int) -> int:
    """~4 characters per token for English text (the common rule of thumb); marked estimated."""
    return 0 if chars <= 0 else max(1, round(chars / 4))


def response_view(body: Any) -> tuple[dict[str, Any] | None, int]:
    """Usage and generated characters of a non-streaming response (chat, completions,
    embeddings, or the Responses API's ``output`` items). Total over any JSON."""
    if not isinstance(body, dict):
        return None, 0
    usage = responses_usage(body.get("usage"))
    chars = 0
    choices = body.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        msg = choice.get("message")
        if isinstance(msg, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                if isinstance(msg.get(key), str):
                    chars += len(msg[key])
            calls = msg.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    chars += len(fn["arguments"])
        elif isinstance(choice.get("text"), str):
            chars += len(choice["text"])
    output = body.get("output")
    for item in output if isinstance(output, list) else ():
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                chars += len(part["text"])
        if isinstance(item, dict) and isinstance(item.get("arguments"), str):
            chars += len(item["arguments"])
    if usage is not None and "completion_tokens" not in usage and body.get("object") == "list":
        usage = {**usage, "completion_tokens": 0}  # embeddings: their usage is exact, and generates nothing
    return usage, chars


# --- errors toward the caller -----------------------------------------------------------

# File-system paths in a backend's error text (llama.cpp's validation errors name its source
# files): POSIX paths of two or more segments, Windows drive paths.
_PATHS = re.compile(r"(?:(?<![\w:/])/(?:[\w.\-+@~]+/)+[\w.\-+@~]*)|(?:\b[A-Za-z]:\\(?:[^\s\\\"']+\\)*[^\s\\\"']*)")
MAX_RELAYED_ERROR_CHARS = 1000


def scrub(text: str) -> str:
    """``text`` without file-system paths, and at most :data:`MAX_RELAYED_ERROR_CHARS`."""
    text = _PATHS.sub("<path>", text)
    return text if len(text) <= MAX_RELAYED_ERROR_CHARS else text[:MAX_RELAYED_ERROR_CHARS] + "…"


def backend_error_body(status: int, data: bytes) -> tuple[bytes, bool]:
    """A backend's error answer (status >= 400) as the caller receives it: OpenAI's error
    shape, its message without file paths; the backend's own ``type``/``param``/``code`` kept
    when it sent that shape. Returns the body and whether it differs from the backend's."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    err = parsed.get("error") if isinstance(parsed, dict) else None
    default_kind = "server_error" if status >= 500 else "invalid_request_error"
    if isinstance(err, dict):
        message = err.get("message")
        text = message if isinstance(message, str) else orjson.dumps(message).decode() if message is not None else ""
        kind = str(err["type"]) if isinstance(err.get("type"), str) else default_kind
        param = err.get("param") if isinstance(err.get("param"), str) else None
        code = err.get("code") if isinstance(err.get("code"), (str, int)) and not isinstance(err.get("code"), bool) else None
        clean = scrub(text)
        if clean == text and isinstance(message, str) and set(err) <= {"message", "type", "param", "code"} \
                and set(parsed) == {"error"}:
            return data, False
        return error_body(clean, kind=kind, param=param, code=None if code is None else str(code)), True
    if isinstance(err, str):
        text = err
    elif isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
        text = parsed["detail"]  # FastAPI's shape
    elif isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        text = parsed["message"]
    else:
        text = data.decode("utf-8", "replace").strip() or f"backend answered {status}"
    return error_body(scrub(text), kind=default_kind, code=f"backend_http_{status}"), True
