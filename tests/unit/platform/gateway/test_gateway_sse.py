"""The data plane's SSE parser gives what the general splitter and ``event_data`` give, on
every way a stream can be cut into reads."""

from __future__ import annotations

import random

import pytest

from ablab.platform.gateway.protocol import SseSplitter, event_data
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.gateway.sse import SseParser

STREAMS = {
    "scripted": b"".join(p for p in ScriptedBackend(tokens=5)._script("ok", True, "r", True) if isinstance(p, bytes)),
    "multiline": b'data: {"a":\ndata: 1}\n\n: comment\n\nevent: ping\n\ndata:{"b":2}\n\ndata: [DONE]\n\n',
    "crlf": b'data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\ndata: [DONE]\r\n\r\n',
    "crlf-late": b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\ndata: [DONE]\n\n',
    "unfinished": b'data: {"a":1}\n\ndata: {"b"',
}


def reference(data: bytes) -> tuple[list[tuple[bytes, bytes | None]], bytes]:
    split = SseSplitter()
    events = split.feed(data)
    return [(e, event_data(e)) for e in events], split.rest()


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_any_cut_gives_the_same_events_as_the_general_splitter(name: str) -> None:
    data = STREAMS[name]
    want_events, want_rest = reference(data)
    rng = random.Random(name)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 8))))
        parser = SseParser()
        got = []
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            got.extend(parser.feed(data[a:b]))
        assert parser.pending() == len(want_rest)
        assert (got, parser.rest()) == (want_events, want_rest)
