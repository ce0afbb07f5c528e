"""The stream meter: a pure function over the backend's SSE bytes and their arrival times.

``feed(data, now)`` returns the bytes to forward (the backend's own; a usage-only chunk is
dropped when the caller did not ask for usage; when the caller asked for usage
(``stream_options.include_usage``) and the backend sent none by its ``[DONE]``, the gateway's
own count goes out as OpenAI's final usage chunk, ``choices: []``, just before ``[DONE]``: see
:func:`estimated_usage`, the same estimate the inference event records and marks
``tokens_estimated``) and records, per docs/architecture.md:
TTFT = first chunk with non-empty content, reasoning or tool-call delta (role-only chunks
do not count); ITL = gaps between such chunks; the usage object; backend metrics. It does
no I/O and reads no clock, so every case is tested without a network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ablab.platform.gateway.protocol import DONE, chunk_text, estimate_tokens, text_delta_chars, view_chunk
from ablab.platform.gateway.sse import SseParser
from ablab.platform.gateway.translators import Translator


@dataclass(slots=True)
class StreamStats:
    first_token_at: float | None = None
    last_token_at: float | None = None
    last_chunk_at: float | None = None
    generated_chunks: int = 0
    generated_chars: int = 0
    itl_sum_s: float = 0.0
    itl_max_s: float = 0.0
    usage: dict[str, Any] | None = None
    server_metrics: dict[str, float] = field(default_factory=dict)
    finish_reason: str | None = None
    done: bool = False
    malformed: int = 0
    stream_error: str | None = None  # an ``error`` object the backend sent mid-stream
    usage_sent_estimated: bool = False  # the caller got the gateway's own count as the usage chunk


def estimated_usage(stats: StreamStats, prompt_tokens: int) -> dict[str, int]:
    """The gateway's own token count for a stream whose backend sent no usage: output tokens
    are the content chunks (one token each, as servers stream them), else ~4 characters per
    token; the inference event records the same numbers (``metering``: est_output_tokens)."""
    out = stats.generated_chunks or estimate_tokens(stats.generated_chars)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": out, "total_tokens": prompt_tokens + out}


class StreamMeter:
    """``text_limit`` > 0 also keeps the answer's text, up to that many characters (a shadow's,
    for graders; the primary's bytes are relayed, never kept). ``prompt_tokens`` (the
    gateway's estimate of the prompt) turns on the usage chunk from the gateway's own count
    when the caller asked for usage (``strip_usage`` False) and the backend sent none."""

    __slots__ = ("_split", "_strip_usage", "_translator", "stats", "_text", "_text_left", "_prompt_tokens", "_head")

    def __init__(self, *, translator: Translator, strip_usage: bool, text_limit: int = 0,
                 prompt_tokens: int | None = None) -> None:
        self._split = SseParser()
        self._strip_usage = strip_usage
        self._translator = translator
        self.stats = StreamStats()
        self._text: list[str] = []
        self._text_left = text_limit
        self._prompt_tokens = None if strip_usage else prompt_tokens
        self._head: dict[str, Any] | None = None  # the first chunk's id, object, created, model

    @property
    def pending(self) -> int:
        """Bytes of an event not yet complete (held in memory)."""
        return self._split.pending()

    def text(self) -> str:
        return "".join(self._text)

    def feed(self, data: bytes, now: float) -> bytes:
        events = self._split.feed(data)
        if not events:
            return b""
        out = []
        for event, payload in events:
            if (forward := self._observe(event, payload, now)) is not None:
                if self.stats.done and self._prompt_tokens is not None and self.stats.usage is None:
                    out.append(self._usage_chunk())
                out.append(forward)
        return b"".join(out) if len(out) != 1 else out[0]

    def _usage_chunk(self) -> bytes:
        """OpenAI's final usage chunk (``choices: []``), from the gateway's own count; once."""
        prompt, self._prompt_tokens = self._prompt_tokens or 0, None
        self.stats.usage_sent_estimated = True
        head = self._head or {}
        chunk = {"id": head.get("id", ""), "object": head.get("object", "chat.completion.chunk"),
                 "created": head.get("created", 0), "model": head.get("model", ""), "choices": [],
                 "usage": estimated_usage(self.stats, prompt)}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def close(self) -> bytes:
        """Bytes left after the last complete event (forwarded as they are)."""
        rest = self._split.rest()
        if rest.strip():
            self.stats.malformed += 1
        return rest

    def _generated(self, chunk: Any, chars: int, now: float) -> None:
        """A chunk with generated text: TTFT, ITL, counts (and the text, where kept)."""
        s = self.stats
        if s.first_token_at is None:
            s.first_token_at = now
        else:
            gap = now - s.last_token_at  # type: ignore[operator]
            s.itl_sum_s += gap
            if gap > s.itl_max_s:
                s.itl_max_s = gap
        s.last_token_at = now
        s.generated_chunks += 1
        s.generated_chars += chars
        if self._text_left > 0 and (piece := chunk_text(chunk)):
            piece = piece[:self._text_left]
            self._text.append(piece)
            self._text_left -= len(piece)

    def _observe(self, event: bytes, payload: bytes | None, now: float) -> bytes | None:
        """Record one event; return what to forward of it (None: nothing)."""
        s = self.stats
        s.last_chunk_at = now
        if payload is None:
            return event
        if payload == DONE or (payload[:1] != b"{" and payload.strip() == DONE):  # a chunk: no strip copy
            s.done = True
            return event
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            s.malformed += 1
            return event  # not ours to judge: pass it through, count it
        if self._head is None and isinstance(chunk, dict):
            self._head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        if (chars := text_delta_chars(chunk)) is not None:  # most events: text only, no view built
            if chars:
                self._generated(chunk, chars, now)
            return event
        view = view_chunk(chunk)
        if view.error is not None and isinstance(chunk, dict) and "error" in chunk:
            err = chunk["error"]
            s.stream_error = str(err.get("message") if isinstance(err, dict) else err)[:200]
        elif view.error is not None:
            s.malformed += 1
        if view.generated:
            self._generated(chunk, view.text_chars, now)
        if view.finish_reason:
            s.finish_reason = view.finish_reason
        if view.usage is not None:
            s.usage = view.usage
            if isinstance(chunk, dict):
                s.server_metrics.update(self._translator.server_metrics(chunk))
            if self._strip_usage:
                if view.usage_only:
                    return None
                if isinstance(chunk, dict) and "usage" in chunk and "choices" in chunk:
                    # usage beside the choices (some servers' last chunk), unasked: OpenAI sends none
                    return b"data: " + orjson.dumps({k: v for k, v in chunk.items() if k != "usage"}) + b"\n\n"
        return event
