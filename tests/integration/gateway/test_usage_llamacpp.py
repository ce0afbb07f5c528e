"""``stream_options.include_usage`` with the official ``openai`` client in front of SmolLM2 on
a real ``llama_cpp.server`` (whose streams carry no usage): the usage chunk arrives exactly when
asked for, last, with ``choices: []``; its numbers are the ones the request's inference event
records, marked estimated. Unasked, no chunk carries usage."""

from __future__ import annotations

import openai
import pytest
from test_gateway_llamacpp import KEY, MSGS, stack  # noqa: F401  (the module's stack fixture: API, llama.cpp, gateway)

from ablab_testing.gateway_stack import outbox_events, pick_units

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_usage_exactly_when_asked_with_the_official_client(stack) -> None:  # noqa: F811  (the imported fixture)
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    unit = pick_units(stack["api"], KEY, per_variant=1)[0]
    model = client.models.list().data[0].id  # the name llama.cpp's server lists (the gateway 404s others)
    with client.chat.completions.with_streaming_response.create(
            model=model, messages=MSGS, max_tokens=6, temperature=0, stream=True, user=unit,
            stream_options={"include_usage": True}) as raw:
        trace = raw.headers["x-ablab-trace-id"]
        asked = list(raw.parse())
    with_usage = [c for c in asked if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is asked[-1] and asked[-1].choices == []
    usage = asked[-1].usage
    pieces = [c.choices[0].delta.content for c in asked if c.choices and c.choices[0].delta.content]
    assert pieces and usage.completion_tokens >= 1 and usage.prompt_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    plain = list(client.chat.completions.create(model=model, messages=MSGS, max_tokens=6, temperature=0,
                                                stream=True, user=unit))
    assert plain and all(c.usage is None for c in plain)

    ev = next(e for e in outbox_events(stack["home"]) if e["type"] == "inference" and e["trace_id"] == trace)
    assert (ev["prompt_tokens"], ev["output_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
    # llama.cpp's server sent no usage: the chunk is the gateway's count, and the event says so
    assert ev["measures"]["tokens_estimated"] == 1.0 and usage.completion_tokens == len(pieces)
