"""Instrumentation for teams that call their backend directly (no gateway in the path).

``track`` assigns the unit, times the first token and the end, counts tokens and emits the
``exposure`` and ``inference`` events through the client's sink, with the same metric
definitions as the gateway (docs/architecture.md)::

    with track(ablab, unit_id="user-42") as call:        # or: async with track(...)
        model = call.strategy.get("model", "default-model")
        for piece in my_backend.stream(prompt):
            call.token(piece)                             # first call marks TTFT
        call.usage(prompt_tokens=12, output_tokens=40)    # when the backend reports it

    @tracked(ablab, unit=lambda req: req.user_id)         # sync or async functions
    def answer(req): ...                                  # current_call() inside

Tokens not reported with :meth:`Call.usage` are counted (one per :meth:`Call.token`) and
marked estimated. An exception inside the block is recorded as the event's ``error``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ablab.platform.gateway.metering import Measurement, exposure_event, inference_event, strategy_id
from ablab.platform.gateway.protocol import estimate_tokens
from ablab.platform.gateway.settings import Backend, Price

_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar("ablab_call", default=None)


def current_call() -> Call | None:
    """The call being tracked in this context (inside ``track`` or a ``tracked`` function)."""
    return _current.get()


class Call:
    """One tracked request. ``strategy``/``experiment``/``variant`` come from the assignment
    (empty when the unit is in no experiment: nothing is emitted then)."""

    def __init__(self, client: Any, unit_id: str, *, attributes: Mapping[str, Any] | None = None,
                 experiments: list[str] | None = None, model: str | None = None, price: Price | None = None,
                 prompt: str | None = None, trace_id: str | None = None, backend_name: str = "direct",
                 max_tokens: int | None = None) -> None:
        self._client = client
        self.unit_id = unit_id
        self.trace_id = trace_id or uuid.uuid4().hex
        self.assignments = client.assign(unit_id, attributes, experiments=experiments, log_exposure=False)
        # A policy variant serves the arm this request draws (AblabClient.decide; docs/policies.md)
        self.served: list[Any] = []
        decide = getattr(client, "decide", None)
        merged: dict[str, Any] = {}
        for a in self.assignments:
            strategy = a.strategy
            if "policy" in strategy and decide is not None:
                served = decide(a, self.trace_id, prompt_tokens=estimate_tokens(len(prompt)) if prompt is not None else None,
                                max_tokens=max_tokens, attributes=attributes)
                if served is not None:
                    self.served.append(served)
                    strategy = served.strategy
            for k, v in strategy.items():
                if k != "policy":
                    merged.setdefault(k, v)
        self.strategy: Mapping[str, Any] = merged
        self.experiment = self.assignments[0].experiment if self.assignments else None
        self.variant = self.assignments[0].variant if self.assignments else None
        self.model = model
        self._backend = Backend(name=backend_name, url="http://direct", price=price)
        self._prompt_chars = len(prompt or "")
        self._start = self._first = self._last = None  # type: float | None
        self._chunks = 0
        self._itl_sum = self._itl_max = 0.0
        self._prompt_tokens: int | None = None
        self._output_tokens: int | None = None
        self._server: dict[str, float] = {}
        self.error: str | None = None
        self._ts = datetime.now(UTC)
        self._token: contextvars.Token | None = None
        self.emitted: list[dict[str, Any]] = []
        # Shadows (the openai wrapper sets it): ``decide(call)`` → {experiment: "sent"|"dropped"}
        # just before the events are built, ``launch()`` just after they are emitted.
        self.shadows: Any = None

    # -- measurements -------------------------------------------------------------------

    def start(self) -> Call:
        self._ts = datetime.now(UTC)
        self._start = time.perf_counter()
        return self

    def token(self, text: str | None = None, *, count: int = 1) -> None:
        """A generated token (or chunk of ``count`` tokens) arrived; empty text is ignored."""
        if text is not None and not text:
            return
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        else:
            gap = now - (self._last or now)
            self._itl_sum += gap
            self._itl_max = max(self._itl_max, gap)
        self._last = now
        self._chunks += count

    def usage(self, *, prompt_tokens: int | None = None, output_tokens: int | None = None) -> None:
        """Token counts the backend reported (they replace the counted estimate)."""
        if prompt_tokens is not None:
            self._prompt_tokens = int(prompt_tokens)
        if output_tokens is not None:
            self._output_tokens = int(output_tokens)

    def server_metrics(self, metrics: Mapping[str, float]) -> None:
        self._server.update({f"server_{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))})

    def fail(self, reason: str) -> None:
        self.error = reason[:256]

    # -- the events -----------------------------------------------------------------------

    def finish(self, *, end: float | None = None) -> list[dict[str, Any]]:
        if self._start is None:
            raise RuntimeError("finish() before start(): use `with track(...)`")
        end = end if end is not None else time.perf_counter()
        if not self.assignments or self.emitted:
            return self.emitted
        m = Measurement(start=self._start, end=end, first_token=self._first, prompt_tokens=self._prompt_tokens,
                        output_tokens=self._output_tokens, est_prompt_tokens=estimate_tokens(self._prompt_chars),
                        est_output_tokens=self._chunks, generated_chunks=self._chunks, itl_sum_s=self._itl_sum,
                        itl_max_s=self._itl_max, error=self.error, server_metrics=self._server or None)
        sid = strategy_id(self.strategy)
        from ablab.platform.gateway.emit import event_unit_id, schema_has_measures
        from ablab.platform.gateway.shadow import SHADOW_STATUS, inference_fields

        statuses = self.shadows.decide(self) if self.shadows is not None else {}
        if SHADOW_STATUS not in inference_fields():
            statuses = {}
        unit = event_unit_id(self.unit_id)
        for a in self.assignments:
            common = {"ts": self._ts, "trace_id": self.trace_id, "experiment": a.experiment, "variant": a.variant, "unit_id": unit}
            self.emitted.append(exposure_event(**common))
            event = inference_event(m, **common, strategy=sid, backend=self._backend, model=self.model,
                                    with_measures=schema_has_measures())
            if a.experiment in statuses:
                event[SHADOW_STATUS] = statuses[a.experiment]
            self.emitted.append(event)
        for served in self.served:  # a policy's arm, propensity, version and features
            for event in self.emitted:
                served.annotate(event)
        for event in self.emitted:
            self._client.sink.emit(event)
        if self.shadows is not None:
            self.shadows.launch()
        return self.emitted

    def __enter__(self) -> Call:
        self._token = _current.set(self)
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, _tb: Any) -> None:
        if exc_type is not None and self.error is None:
            self.fail(exc_type.__name__)
        try:
            self.finish()
        finally:
            if self._token is not None:
                _current.reset(self._token)

    async def __aenter__(self) -> Call:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def track(client: Any, unit_id: str, **kwargs: Any) -> Call:
    """A :class:`Call` to use as ``with``/``async with``; see the module docstring."""
    return Call(client, unit_id, **kwargs)


def tracked(client: Any, *, unit: Callable[..., str], **track_kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a sync or async function: each call runs inside ``track(client, unit(*args, **kwargs))``.
    A return value with an OpenAI-style ``usage`` gives the token counts."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        def _usage(call: Call, result: Any) -> None:
            usage = getattr(result, "usage", None) or (result.get("usage") if isinstance(result, dict) else None)
            if usage is not None:
                get = usage.get if isinstance(usage, dict) else lambda k: getattr(usage, k, None)
                call.usage(prompt_tokens=get("prompt_tokens"), output_tokens=get("completion_tokens"))
                if call._first is None:
                    call.token()

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with track(client, unit(*args, **kwargs), **track_kwargs) as call:
                    result = await fn(*args, **kwargs)
                    _usage(call, result)
                    return result
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with track(client, unit(*args, **kwargs), **track_kwargs) as call:
                result = fn(*args, **kwargs)
                _usage(call, result)
                return result
        return wrapper

    return decorate
