"""The OpenAI wire format as the gateway needs it: SSE framing and chunk shapes, pure.

The gateway never re-serializes a body it can copy: it parses a request body once (to read
``model``, ``stream``, ``user`` and to apply a strategy), and parses each stream chunk only
to measure it; the bytes it forwards are the backend's own, except for a usage-only chunk
it strips when the caller did not ask for usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise ProtocolError(f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", status=413)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body


def check_chat(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("`messages` must be a non-empty array", param="messages")


def check_completion(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise ProtocolError("`prompt` must be a string or an array", param="prompt")


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


@dataclass(frozen=True, slots=True)
class ChunkView:
    """What one parsed stream chunk means for measurement."""

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


def view_chunk(chunk: Any) -> ChunkView:
    if not isinstance(chunk, dict):
        return ChunkView(False, 0, False, None, None, error="chunk is not an object")
    choices = chunk.get("choices")
    usage = chunk.get("usage")
    usage = usage if isinstance(usage, dict) else None
    generated, chars, finish = False, 0, None
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            g, n = _delta_chars(choice)
            generated |= g
            chars += n
            finish = choice.get("finish_reason") or finish
    usage_only = usage is not None and not choices
    return ChunkView(generated, chars, usage_only, usage, finish, error=chunk.get("error"))


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
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            return msg["content"]
        if isinstance(choice.get("text"), str):
            return choice["text"]
    return ""


def message_text(body: dict[str, Any]) -> str:
    """All text the caller sent (chat messages or a completion prompt), for token estimates."""
    if "messages" in body:
        out = []
        for m in body.get("messages") or ():
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out.extend(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "\n".join(out)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def estimate_tokens(chars: int) -> int:
    """~4 characters per token for English text (the common rule of thumb); marked estimated."""
    return 0 if chars <= 0 else max(1, round(chars / 4))


def response_view(body: Any) -> tuple[dict[str, Any] | None, int]:
    """Usage and generated characters of a non-streaming response."""
    if not isinstance(body, dict):
        return None, 0
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    chars = 0
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        msg = choice.get("message")
        if isinstance(msg, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                if isinstance(msg.get(key), str):
                    chars += len(msg[key])
            for call in msg.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    chars += len(fn.get("arguments") or "")
        elif isinstance(choice.get("text"), str):
            chars += len(choice["text"])
    return usage, chars
