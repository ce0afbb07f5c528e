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

Shadows (an assignment's ``shadow``, docs/gateway.md): once the call has its answer, a chosen
share of calls is sent again, rewritten by the shadow's strategy, to the client's base URL (or
a backend named in ``shadow_backends``) by a runner on its own thread, loop, httpx pool, cap
and timeout (:class:`ablab.platform.gateway.shadow.BackgroundShadows`); its answer is never
returned and its event goes to the same sink. ``client.ablab_shadows`` is that runner (None
until a shadow was chosen): ``drain()`` waits for the shadows in flight, ``close()`` stops it.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from ablab.platform.gateway.rewrite import apply_strategy
from ablab.platform.sdk.instrument import Call

# Arguments of the openai client's create() that are not request-body fields.
_CLIENT_ARGS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


def _prompt_text(messages: Any) -> str:
    from ablab.platform.gateway.protocol import message_text

    return message_text({"messages": messages if isinstance(messages, list) else []})


def _prepare(ablab: Any, kwargs: dict[str, Any], templates: dict[str, str], price: Any,
             shadows: _ShadowSource | None = None) -> tuple[Call, dict[str, Any], bool]:
    unit = kwargs.pop("ablab_unit", None) or kwargs.get("user")
    attributes = kwargs.pop("ablab_attributes", None)
    if not unit:
        raise ValueError("instrumented create(): give the unit as `user=` or `ablab_unit=`")
    call = Call(ablab, str(unit), attributes=attributes, model=None, price=price, prompt=_prompt_text(kwargs.get("messages")),
                max_tokens=kwargs.get("max_tokens", kwargs.get("max_completion_tokens")))
    if shadows is not None and any(a.shadow for a in call.assignments):
        call.shadows = _CallShadows(shadows, dict(kwargs))
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


class _ShadowSource:
    """Where an instrumented client's shadows go: a :class:`BackgroundShadows` made on first use."""

    def __init__(self, client: Any, ablab: Any, templates: dict[str, str], price: Any, backends: dict[str, str]) -> None:
        self._client, self._ablab, self._templates, self._price, self._backends = client, ablab, templates, price, backends
        self._lock = threading.Lock()
        self.background: Any = None

    def get(self) -> Any:
        if self.background is None:
            with self._lock:
                if self.background is None:
                    from ablab.platform.gateway.emit import schema_has_measures
                    from ablab.platform.gateway.settings import Backend
                    from ablab.platform.gateway.shadow import BackgroundShadows, ShadowRunner

                    base = str(getattr(self._client, "base_url", "") or "").rstrip("/")
                    backends = {"direct": Backend("direct", base, price=self._price)}
                    backends.update({name: Backend(name, url.rstrip("/"), price=self._price) for name, url in self._backends.items()})
                    sink = self._ablab.sink

                    def record(events: list[dict[str, Any]]) -> None:
                        for event in events:
                            sink.emit(event)

                    self.background = BackgroundShadows(lambda: ShadowRunner(
                        backends=backends, default_backend="direct", templates=self._templates, record=record,
                        with_measures=schema_has_measures()))
        return self.background

    def authorization(self) -> str | None:
        key = getattr(self._client, "api_key", None)
        return f"Bearer {key}" if isinstance(key, str) and key else None


class _CallShadows:
    """One call's shadows: decided as its events are built, submitted once they are emitted."""

    def __init__(self, source: _ShadowSource, request: dict[str, Any]) -> None:
        self._source = source
        self._request = request
        self._jobs: list[tuple[Any, Any]] = []

    def decide(self, call: Call) -> dict[str, str]:
        from ablab.platform.gateway.emit import event_unit_id
        from ablab.platform.gateway.shadow import ShadowJob, spec_of

        statuses: dict[str, str] = {}
        background = None
        for a in call.assignments:
            spec = spec_of(a.shadow)
            if spec is None:
                continue
            background = background or self._source.get()
            status, slot = background.decide(call.trace_id, a.experiment, spec)
            if status is not None:
                statuses[a.experiment] = status
            if slot is not None:
                body, headers = _request_body(self._request)
                job = ShadowJob(spec=spec, experiment=a.experiment, variant=a.variant, unit_id=event_unit_id(call.unit_id),
                                primary_trace=call.trace_id, body=body, authorization=self._source.authorization(),
                                extra_headers=headers)
                self._jobs.append((job, slot))
        return statuses

    def launch(self) -> None:
        jobs, self._jobs = self._jobs, []
        for job, slot in jobs:
            self._source.get().submit(job, slot)


def _request_body(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The request body the caller's create() arguments make, and its extra headers."""
    body = {k: v for k, v in kwargs.items() if k not in _CLIENT_ARGS and type(v).__name__ not in ("NotGiven", "Omit")}
    extra = kwargs.get("extra_body")
    if isinstance(extra, dict):
        body.update(extra)
    headers = kwargs.get("extra_headers")
    headers = {str(k): str(v) for k, v in headers.items() if isinstance(v, str)} if isinstance(headers, dict) else {}
    return body, headers


class _Completions:
    def __init__(self, inner: Any, ablab: Any, templates: dict[str, str], price: Any,
                 shadows: _ShadowSource | None = None) -> None:
        self._inner, self._ablab, self._templates, self._price = inner, ablab, templates, price
        self._shadows = shadows
        self._async = inspect.iscoroutinefunction(inner.create) or type(inner).__name__.startswith("Async")

    def create(self, **kwargs: Any) -> Any:
        call, body, hide = _prepare(self._ablab, kwargs, self._templates, self._price, self._shadows)
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
    def __init__(self, client: Any, ablab: Any, *, templates: dict[str, str] | None = None, price: Any = None,
                 shadows: bool = True, shadow_backends: dict[str, str] | None = None) -> None:
        self._client = client
        self._shadows = _ShadowSource(client, ablab, templates or {}, price, dict(shadow_backends or {})) if shadows else None
        self.chat = _Chat(client.chat, _Completions(client.chat.completions, ablab, templates or {}, price, self._shadows))

    @property
    def ablab_shadows(self) -> Any:
        """The shadow runner (:class:`BackgroundShadows`), or None before the first shadow."""
        return self._shadows.background if self._shadows is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def instrument_openai(client: Any, ablab: Any, *, templates: dict[str, str] | None = None, price: Any = None,
                      shadows: bool = True, shadow_backends: dict[str, str] | None = None) -> InstrumentedOpenAI:
    """Wrap an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client (see the module docstring).
    ``shadows=False`` sends none; ``shadow_backends`` ({name: base URL}) serves a shadow
    strategy's ``backend`` (the default is the client's own base URL)."""
    return InstrumentedOpenAI(client, ablab, templates=templates, price=price, shadows=shadows,
                              shadow_backends=shadow_backends)
