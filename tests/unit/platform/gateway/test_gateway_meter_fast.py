"""The meter's shortcut for plain text chunks (``protocol.text_delta_chars``) says what
``view_chunk`` says of every chunk it answers for, and defers on the rest."""

from __future__ import annotations

from typing import Any

import orjson

from ablab.platform.gateway.protocol import text_delta_chars, view_chunk
from ablab.platform.gateway.stream import StreamMeter
from ablab.platform.gateway.translators import translator_for


def _chunks() -> list[Any]:
    deltas: list[Any] = [{}, {"role": "assistant"}, {"content": ""}, {"content": "hé"}, {"content": None},
                         {"content": 5}, {"reasoning_content": "why"}, {"reasoning": "r", "content": "c"},
                         {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}, {"tool_calls": []}, None, "x", []]
    out: list[Any] = [None, [], "s", 1, {}, {"choices": None}, {"choices": []}, {"choices": [1]}]
    for d in deltas:
        for finish in (None, "stop", ""):
            choice = {"index": 0, "delta": d, "finish_reason": finish}
            out += [{"choices": [choice]}, {"choices": [choice, choice]}, {"choices": [choice], "usage": None},
                    {"choices": [choice], "usage": {"prompt_tokens": 1}}, {"choices": [choice], "error": None},
                    {"choices": [choice], "type": "x"}, {"choices": [{k: v for k, v in choice.items() if k != "delta"}]}]
    for text in ("", "abc", None, 3):
        out += [{"choices": [{"index": 0, "text": text, "finish_reason": None}]}, {"choices": [{"text": text}]}]
    return out


def test_the_shortcut_agrees_with_view_chunk_where_it_answers() -> None:
    answered = 0
    for chunk in _chunks():
        n = text_delta_chars(chunk)
        if n is None:
            continue
        answered += 1
        view = view_chunk(chunk)
        assert (view.generated, view.text_chars, view.usage_only, view.usage, view.finish_reason, view.error) == \
            (n > 0, n, False, None, None, None), chunk
    assert answered >= 20  # the common shapes take it


def test_a_stream_measures_the_same_either_way() -> None:
    events = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}]} for i in range(5)]
    events += [{"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
               {"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}}]
    raw = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    meter = StreamMeter(translator=translator_for("openai"), strip_usage=True, text_limit=100)
    out = b"".join(meter.feed(raw[i:i + 7], float(i)) for i in range(0, len(raw), 7)) + meter.close()
    s = meter.stats
    assert (s.generated_chunks, s.generated_chars, s.finish_reason, s.done) == (5, 10, "stop", True)
    assert s.usage == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert meter.text() == "t0t1t2t3t4"
    assert b'"usage"' not in out and out.endswith(b"data: [DONE]\n\n")  # unasked usage stripped
    assert s.first_token_at is not None and s.itl_max_s >= 0.0
