"""The stream meter: a pure function over the backend's SSE bytes and their arrival times.

``feed(data, now)`` returns the bytes to forward (the backend's own; a usage-only chunk is
dropped when the caller did not ask for usage) and records, per docs/architecture.md:
TTFT = first chunk with non-empty content, reasoning or tool-call delta (role-only chunks
do not count); ITL = gaps between such chunks; the usage object; backend metrics. It does
no I/O and reads no clock, so every case is tested without a network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ablab.platform.gateway.protocol import DONE, SseSplitter, chunk_text, event_data, view_chunk
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


class StreamMeter:
    """``text_limit`` > 0 also keeps the answer's text, up to that many characters (a shadow's,
    for graders; the primary's bytes are relayed, never kept)."""

    __slots__ = ("_split", "_strip_usage", "_translator", "stats", "_text", "_text_left")

    def __init__(self, *, translator: Translator, strip_usage: bool, text_limit: int = 0) -> None:
        self._split = SseSplitter()
        self._strip_usage = strip_usage
        self._translator = translator
        self.stats = StreamStats()
        self._text: list[str] = []
        self._text_left = text_limit

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
        for event in events:
            if self._observe(event, now):
                out.append(event)
        return b"".join(out) if len(out) != 1 else out[0]

    def close(self) -> bytes:
        """Bytes left after the last complete event (forwarded as they are)."""
        rest = self._split.rest()
        if rest.strip():
            self.stats.malformed += 1
        return rest

    def _observe(self, event: bytes, now: float) -> bool:
        """Record one event; False when it must not be forwarded."""
        s = self.stats
        s.last_chunk_at = now
        payload = event_data(event)
        if payload is None:
            return True
        if payload.strip() == DONE:
            s.done = True
            return True
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            s.malformed += 1
            return True  # not ours to judge: pass it through, count it
        view = view_chunk(chunk)
        if view.error is not None and isinstance(chunk, dict) and "error" in chunk:
            err = chunk["error"]
            s.stream_error = str(err.get("message") if isinstance(err, dict) else err)[:200]
        elif view.error is not None:
            s.malformed += 1
        if view.generated:
            if s.first_token_at is None:
                s.first_token_at = now
            else:
                gap = now - s.last_token_at  # type: ignore[operator]
                s.itl_sum_s += gap
                if gap > s.itl_max_s:
                    s.itl_max_s = gap
            s.last_token_at = now
            s.generated_chunks += 1
            s.generated_chars += view.text_chars
            if self._text_left > 0 and (piece := chunk_text(chunk)):
                piece = piece[:self._text_left]
                self._text.append(piece)
                self._text_left -= len(piece)
        if view.finish_reason:
            s.finish_reason = view.finish_reason
        if view.usage is not None:
            s.usage = view.usage
            if isinstance(chunk, dict):
                s.server_metrics.update(self._translator.server_metrics(chunk))
        return not (view.usage_only and self._strip_usage)
