"""The stream meter over scripted chunk sequences: no network, no clock."""

from __future__ import annotations

import json

import pytest

from ablab.platform.gateway.protocol import SseSplitter, event_data, view_chunk
from ablab.platform.gateway.stream import StreamMeter
from ablab.platform.gateway.translators import translator_for


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat(delta, finish=None):
    return sse({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def run(events: list[bytes], *, strip: bool, kind: str = "openai", split: int | None = None):
    meter = StreamMeter(translator=translator_for(kind), strip_usage=strip)
    data = b"".join(events)
    pieces = events if split is None else [data[i:i + split] for i in range(0, len(data), split)]
    out = b""
    for t, piece in enumerate(pieces):
        out += meter.feed(piece, float(t))
    out += meter.close()
    return meter.stats, out


def test_role_only_first_chunk_is_not_the_first_token() -> None:
    events = [chat({"role": "assistant", "content": ""}), chat({"content": "Hi"}), chat({"content": "!"}),
              chat({}, "stop"), b"data: [DONE]\n\n"]
    meter = StreamMeter(translator=translator_for("openai"), strip_usage=False)
    for t, e in enumerate(events):
        meter.feed(e, 10.0 + t)
    s = meter.stats
    assert s.first_token_at == 11.0 and s.last_token_at == 12.0
    assert s.generated_chunks == 2 and s.generated_chars == 3
    assert s.itl_sum_s == 1.0 and s.itl_max_s == 1.0
    assert s.done and s.finish_reason == "stop"


@pytest.mark.parametrize("choices", [[], None], ids=["choices-empty", "choices-null"])
def test_usage_chunk_is_read_and_stripped_only_when_not_asked(choices) -> None:
    usage_chunk = sse({"id": "x", "choices": choices, "usage": USAGE})
    events = [chat({"content": "a"}), chat({}, "stop"), usage_chunk, b"data: [DONE]\n\n"]
    stats, out = run(events, strip=True)
    assert stats.usage == USAGE
    assert usage_chunk not in out and out.endswith(b"data: [DONE]\n\n")
    stats, out = run(events, strip=False)
    assert stats.usage == USAGE and usage_chunk in out
    assert out == b"".join(events)  # byte for byte


def test_no_usage_leaves_usage_unset_and_counts_generated_chunks() -> None:
    stats, out = run([chat({"content": "ab"}), chat({"content": "cd"}), b"data: [DONE]\n\n"], strip=True)
    assert stats.usage is None and stats.generated_chunks == 2 and stats.generated_chars == 4


def test_tool_call_and_reasoning_deltas_count_as_tokens() -> None:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    stats, _ = run([chat({"role": "assistant"}), chat({"tool_calls": [call]}), chat({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})], strip=True)
    assert stats.first_token_at == 1.0 and stats.generated_chunks == 2
    stats, _ = run([chat({"role": "assistant"}), chat({"reasoning_content": "hmm"}), chat({"reasoning": "ok"}), chat({"content": "x"})], strip=True)
    assert stats.first_token_at == 1.0 and stats.generated_chunks == 3 and stats.generated_chars == 6


def test_events_split_at_any_byte_boundary_give_the_same_stats_and_bytes() -> None:
    events = [chat({"role": "assistant", "content": ""}), chat({"content": "Hello"}), chat({}, "stop"),
              sse({"choices": [], "usage": USAGE}), b"data: [DONE]\n\n"]
    whole, out_whole = run(events, strip=False)
    for size in (1, 3, 7, 64):
        stats, out = run(events, strip=False, split=size)
        assert out == out_whole == b"".join(events)
        assert stats.usage == whole.usage and stats.generated_chunks == whole.generated_chunks and stats.done


def test_garbage_is_passed_through_and_counted() -> None:
    garbage = b"data: not json {\n\n"
    stats, out = run([chat({"content": "a"}), garbage, chat({"content": "b"})], strip=True)
    assert stats.malformed == 1 and garbage in out and stats.generated_chunks == 2


def test_error_object_mid_stream_is_recorded() -> None:
    stats, _ = run([chat({"content": "a"}), sse({"error": {"message": "overloaded"}})], strip=True)
    assert stats.stream_error == "overloaded"


def test_vllm_metrics_on_the_usage_chunk_are_kept() -> None:
    final = sse({"choices": [], "usage": USAGE, "metrics": {"time_to_first_token_ms": 12.5, "queue_time_ms": 1.0, "bogus": "x"}})
    stats, _ = run([chat({"content": "a"}), final], strip=True, kind="vllm")
    assert stats.server_metrics == {"server_time_to_first_token_ms": 12.5, "server_queue_time_ms": 1.0}
    stats, _ = run([chat({"content": "a"}), final], strip=True, kind="openai")
    assert stats.server_metrics == {}


def test_crlf_events_and_comments() -> None:
    split = SseSplitter()
    events = split.feed(b": keep-alive\r\n\r\ndata: {\"a\": 1}\r\n\r\ndata: x")
    assert [event_data(e) for e in events] == [None, b'{"a": 1}']
    assert split.rest() == b"data: x"


def test_completion_text_chunks() -> None:
    v = view_chunk({"choices": [{"index": 0, "text": "abc", "finish_reason": None}]})
    assert v.generated and v.text_chars == 3 and not v.usage_only
    assert not view_chunk({"choices": [{"index": 0, "text": ""}]}).generated
