"""The data plane's incremental SSE parser: bytes in, ``(event, data)`` pairs out.

``event`` is the event's bytes exactly as received (what is relayed); ``data`` its ``data``
payload (multi-line data joined by ``\\n``; None for comments and ``event:``-only events), as
:func:`.protocol.event_data` defines it. The common shape, ``data: {...}\\n\\n`` with LF
separators, is cut with one ``bytes.split`` per read and no per-line work; anything else
(CRLF separators, several lines in one event) goes through the general path, so both give the
same answer (tests/unit/platform/gateway/test_gateway_sse.py checks them against each other).
"""

from __future__ import annotations

from ablab.platform.gateway.protocol import SseSplitter, event_data


class SseParser:
    __slots__ = ("_buf", "_general")

    def __init__(self) -> None:
        self._buf = b""
        self._general: SseSplitter | None = None  # once a CR is seen: the general splitter from then on

    def feed(self, data: bytes) -> list[tuple[bytes, bytes | None]]:
        if self._general is None and b"\r" not in data:
            buf = self._buf + data if self._buf else data
            pieces = buf.split(b"\n\n")
            self._buf = pieces.pop()
            out: list[tuple[bytes, bytes | None]] = []
            for p in pieces:
                if p.startswith(b"data: ") and b"\n" not in p:
                    out.append((p + b"\n\n", p[6:]))
                else:
                    event = p + b"\n\n"
                    out.append((event, event_data(event)))
            return out
        if self._general is None:
            self._general = SseSplitter()
            if self._buf:
                self._general.feed(self._buf)
                self._buf = b""
        return [(e, event_data(e)) for e in self._general.feed(data)]

    def rest(self) -> bytes:
        if self._general is not None:
            return self._general.rest()
        rest, self._buf = self._buf, b""
        return rest

    def pending(self) -> int:
        return self._general.pending() if self._general is not None else len(self._buf)
