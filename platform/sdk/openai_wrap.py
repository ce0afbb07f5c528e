"""A wrapper for the official ``openai`` client: ``chat.completions.create`` (stream and not,
sync and async) assigns the unit, applies the variant's strategy to the request (model,
params, system prompt, template, CoT depth; as the gateway does), times it and emits the
events::

    client = instrument_openai(openai.OpenAI(base_url=...), ablab)
    client.chat.completions.create(model="m", messages=[...], user="user-42")   # unit = user
    client.chat.completions.create(..., ablab_unit="user-42", ablab_attributes={"plan": "pro"})

The call's trace id goes upstream as ``X-Request-Id`` and is readable as
``response._ablab_trace_id`` (non-streaming) or ``stream.ablab_trace_id``, for feedback.
Streams ask the backend for the usage chunk and hide it again when the caller did not ask.
Everything else on the client is the wrapped client's own.
"""

from __future__ import annotations

import inspect
from typing import Any

from ablab.platform.gateway.rewrite import apply_strategy
from ablab.platform.sdk.instrument import Call


def _prompt_text(messages: Any) -> str:
    from ablab.platform.gateway.protocol import message_text

    return message_text({"messages": messages if isinstance(messages, list) else []})


def _prepare(ablab: Any, kwargs: dict[str, Any], templates: dict[str, str], price: Any) -> tuple[Call, dict[str, Any], bool]:
    unit = kwargs.pop("ablab_unit", None) or kwargs.get("user")
    attributes = kwargs.pop("ablab_attributes", None)
    if not unit:
        raise ValueError("instrumented create(): give the unit as `user=` or `ablab_unit=`")
    call = Call(ablab, str(unit), attributes=attributes, model=None, price=price, prompt=_prompt_text(kwargs.get("messages")))
    body = apply_strategy(kwargs, call.strategy, chat=True, templates=templates) if call.strategy else dict(kwargs)
    call.model = body.get("model") if isinstance(body.get("model"), str) else None
    stream = body.get("stream") is True
    asked = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage") is True
    if stream and not asked:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    body["extra_headers"] = {**(body.get("extra_headers") or {}), "X-Request-Id": call.trace_id}
    return call, body, stream and not asked


def _observe_chunk(call: Call, chunk: Any) -> bool:
    """Record one chunk; True when it is a usage-only chunk (to hide when not asked)."""
    choices = getattr(chunk, "choices", None) or []
    for choice in choices:
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        text = (getattr(delta, "content", None) or getattr(delta, "reasoning_content", None)
                or getattr(delta, "reasoning", None))
        if text or getattr(delta, "tool_calls", None):
            call.token()
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        call.usage(prompt_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
    return usage is not None and not choices


def _finish_response(call: Call, response: Any) -> Any:
    call.token()  # a whole answer arrives at once: its first token is its last
    usage = getattr(response, "usage", None)
    if usage is not None:
        call.usage(prompt_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
    try:
        response._ablab_trace_id = call.trace_id
    except AttributeError:
        pass
    return response


def _stream_error(exc: BaseException) -> str:
    # a consumer that stops iterating closes the generator: the client went away
    return "client_disconnected" if isinstance(exc, GeneratorExit) else type(exc).__name__


def _returned(call: Call, body: dict[str, Any], result: Any, hide: bool, stream: type[_SyncStream]) -> Any:
    """What ``create`` hands back: the stream wrapped (timed as it is read) or the whole
    response, observed now."""
    if body.get("stream") is True:
        return stream(call, result, hide)
    _finish_response(call, result)
    call.finish(end=call._last)
    return result


class _SyncStream:
    def __init__(self, call: Call, stream: Any, hide_usage: bool) -> None:
        self._call, self._stream, self._hide = call, stream, hide_usage
        self.ablab_trace_id = call.trace_id

    def __iter__(self):
        try:
            for chunk in self._stream:
                if _observe_chunk(self._call, chunk) and self._hide:
                    continue
                yield chunk
        except BaseException as exc:
            self._call.fail(_stream_error(exc))
            raise
        finally:
            self._call.finish()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncStream(_SyncStream):
    def __iter__(self):  # type: ignore[override]
        raise TypeError("use `async for` with an AsyncOpenAI stream")

    async def __aiter__(self):
        try:
            async for chunk in self._stream:
                if _observe_chunk(self._call, chunk) and self._hide:
                    continue
                yield chunk
        except BaseException as exc:
            self._call.fail(_stream_error(exc))
            raise
        finally:
            self._call.finish()


class _Completions:
    def __init__(self, inner: Any, ablab: Any, templates: dict[str, str], price: Any) -> None:
        self._inner, self._ablab, self._templates, self._price = inner, ablab, templates, price
        self._async = inspect.iscoroutinefunction(inner.create) or type(inner).__name__.startswith("Async")

    def create(self, **kwargs: Any) -> Any:
        call, body, hide = _prepare(self._ablab, kwargs, self._templates, self._price)
        if self._async:
            return self._acreate(call, body, hide)
        call.start()
        try:
            result = self._inner.create(**body)
        except BaseException as exc:
            call.fail(type(exc).__name__)
            call.finish()
            raise
        return _returned(call, body, result, hide, _SyncStream)

    async def _acreate(self, call: Call, body: dict[str, Any], hide: bool) -> Any:
        call.start()
        try:
            result = await self._inner.create(**body)
        except BaseException as exc:
            call.fail(type(exc).__name__)
            call.finish()
            raise
        return _returned(call, body, result, hide, _AsyncStream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Chat:
    def __init__(self, inner: Any, completions: _Completions) -> None:
        self._inner, self.completions = inner, completions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class InstrumentedOpenAI:
    def __init__(self, client: Any, ablab: Any, *, templates: dict[str, str] | None = None, price: Any = None) -> None:
        self._client = client
        self.chat = _Chat(client.chat, _Completions(client.chat.completions, ablab, templates or {}, price))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def instrument_openai(client: Any, ablab: Any, *, templates: dict[str, str] | None = None, price: Any = None) -> InstrumentedOpenAI:
    """Wrap an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client (see the module docstring)."""
    return InstrumentedOpenAI(client, ablab, templates=templates, price=price)
