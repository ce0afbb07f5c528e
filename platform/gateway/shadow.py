"""Shadow traffic: a share of the requests is sent again, rewritten by a candidate strategy,
and measured like any request; its answer is never returned.

An experiment (or one variant) declares ``shadow: {strategy, fraction, max_concurrency,
timeout_s}`` in the registry; the SDK config hands it to the gateway and the SDK with each
assignment (``Assignment.shadow``). Per request and experiment:

- **choice**: the request is shadowed when a hash of ``(experiment, trace id)`` falls below
  ``fraction`` (:func:`chosen`): deterministic, so a replayed trace decides the same, and
  independent of the unit, so every unit's requests are sampled alike;
- **cap**: a slot of the shadow's ``max_concurrency`` (and of the process-wide
  ``max_inflight``) is taken without waiting (:class:`Cap`); when none is free the shadow is
  **dropped** and counted, never queued. The primary's event says ``shadow: sent|dropped``;
- **run** (:meth:`ShadowRunner.run`): the caller's own request rewritten by the shadow's
  strategy (:func:`ablab.platform.gateway.rewrite.apply_strategy`, as a variant's), sent on
  the runner's own httpx clients (never the primaries' pools), inside ``timeout_s`` for the
  whole exchange. The body is streamed and discarded while it is metered (TTFT, ITL, tokens,
  cost as for a primary); only the answer's text is kept, up to :data:`ANSWER_LIMIT_CHARS`,
  and an event still incomplete past :data:`BODY_LIMIT_BYTES` ends the shadow. Its
  ``inference`` event has its own trace id, the primary's experiment, variant and unit, its
  own strategy hash and ``shadow_of: <primary trace id>``; no ``exposure`` event (no unit saw
  it). Nothing a shadow does reaches the primary: every error ends in its own event.

The gateway runs a :class:`ShadowRunner` on its event loop (its own task set); the SDK,
whose caller may have no loop, a :class:`BackgroundShadows` (a runner on a loop in a thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import httpx
import orjson

from ablab.platform.events import MAX_OUTPUT_TEXT_CHARS
from ablab.platform.gateway import protocol
from ablab.platform.gateway.metering import Measurement, inference_event, strategy_id
from ablab.platform.gateway.rewrite import StrategyError, apply_strategy, strategy_problems
from ablab.platform.gateway.settings import Backend
from ablab.platform.gateway.stream import StreamMeter
from ablab.platform.gateway.translators import translator_for

log = logging.getLogger(__name__)

ANSWER_LIMIT_CHARS = MAX_OUTPUT_TEXT_CHARS  # the answer's text kept for graders: what its event may carry
BODY_LIMIT_BYTES = 1024 * 1024  # a whole (non-streaming) body, or one SSE event, held at most
SHADOW_OF = "shadow_of"  # the shadow's event: the primary's trace id
SHADOW_STATUS = "shadow"  # the primary's event: "sent" | "dropped" | None
OUTPUT_TEXT = "output_text"  # the shadow's answer text, where the event schema has the field

Record = Callable[[list[dict[str, Any]]], None]
# The gateway's whole request rewrite (strategy → upstream body), for strategies that need
# more than apply_strategy (its prompt strategies): (body, strategy, chat=, backend=, trace_id=).
Rewrite = Callable[..., Awaitable[dict[str, Any]]]


@lru_cache(maxsize=1)
def inference_fields() -> frozenset[str]:
    """The inference event's fields in this build's schema (shadow fields are written only
    where it has them: an event with a field the schema lacks would be refused)."""
    from ablab.platform.events import InferenceEvent

    return frozenset(InferenceEvent.model_fields)


@dataclass(frozen=True, slots=True)
class ShadowSpec:
    strategy: Mapping[str, Any]
    fraction: float
    max_concurrency: int
    timeout_s: float
    key: str  # the declaration's canonical JSON: one cap per declared shadow
    strategy_id: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> ShadowSpec | None:
        """From the SDK config's ``shadow`` mapping (the registry validated it); None when
        absent or, from a config this build does not understand, malformed (logged)."""
        if not raw:
            return None
        try:
            strategy = raw.get("strategy") or {}
            fraction, cap, timeout = float(raw["fraction"]), int(raw.get("max_concurrency", 8)), float(raw.get("timeout_s", 30.0))
            if not isinstance(strategy, Mapping) or not 0 <= fraction <= 1 or cap < 1 or timeout <= 0:
                raise ValueError("out of range")
            key = json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str)
        except (KeyError, TypeError, ValueError) as exc:
            log.error("ignoring a shadow this build cannot read (%s): %r", exc, raw)
            return None
        return cls(dict(strategy), fraction, cap, timeout, key, strategy_id(dict(strategy)))


_PARSED: dict[int, tuple[Mapping[str, Any], ShadowSpec | None]] = {}


def spec_of(raw: Mapping[str, Any] | None) -> ShadowSpec | None:
    """:meth:`ShadowSpec.parse`, cached per config object (the SDK asks on every call)."""
    if not raw:
        return None
    hit = _PARSED.get(id(raw))
    if hit is not None and hit[0] is raw:
        return hit[1]
    spec = ShadowSpec.parse(raw)
    if len(_PARSED) > 4096:
        _PARSED.clear()
    _PARSED[id(raw)] = (raw, spec)
    return spec


def chosen(trace_id: str, experiment: str, fraction: float) -> bool:
    """Whether this request is shadowed: a 64-bit hash of (experiment, trace id) below
    ``fraction`` of its range (0 never, 1 always)."""
    if fraction <= 0.0:
        return False
    if fraction >= 1.0:
        return True
    digest = hashlib.blake2b(f"{experiment}\x00{trace_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 18446744073709551616.0


class Cap:
    """A semaphore taken without waiting: :meth:`try_acquire` is False when it is full (the
    caller drops its shadow). Thread-safe (the SDK reserves from its callers' threads)."""

    __slots__ = ("limit", "inflight", "_lock")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self.inflight >= self.limit:
                return False
            self.inflight += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.inflight -= 1


@dataclass(slots=True)
class Slot:
    """A reserved place for one shadow (its own cap and the process-wide one)."""

    caps: tuple[Cap, ...]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            for cap in self.caps:
                cap.release()


@dataclass(slots=True)
class ShadowJob:
    """One shadow to send: the caller's parsed request and who it shadows."""

    spec: ShadowSpec
    experiment: str
    variant: str
    unit_id: str  # as the primary's events carry it
    primary_trace: str
    body: dict[str, Any]
    chat: bool = True
    endpoint: str = "/chat/completions"
    authorization: str | None = None  # the caller's, passed on where the backend has no key of its own
    extra_headers: dict[str, str] = field(default_factory=dict)
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class ShadowRunner:
    """Chooses, reserves and runs shadows; see the module docstring. ``record`` receives each
    shadow's events (the gateway's outbox, the SDK's sink); ``metrics`` is the gateway's
    :class:`~ablab.platform.gateway.observe.GatewayMetrics` (or None); ``counts`` counts
    ``(experiment, sent|dropped|ok|failed)`` either way."""

    def __init__(self, *, backends: Mapping[str, Backend], default_backend: str, templates: Mapping[str, str] | None = None,
                 compress: Callable[[str, float, int], str] | None = None, record: Record | None = None,
                 metrics: Any = None, with_measures: bool = False, max_inflight: int = 64,
                 inflight: dict[str, int] | None = None, answer_limit: int = ANSWER_LIMIT_CHARS,
                 body_limit: int = BODY_LIMIT_BYTES) -> None:
        self.backends, self.default_backend = dict(backends), default_backend
        self.templates = dict(templates or {})
        self.compress, self.record, self.metrics = compress, record, metrics
        self.with_measures = with_measures
        self.total = Cap(max_inflight)
        self.caps: dict[tuple[str, str], Cap] = {}
        self.inflight = inflight if inflight is not None else {}  # per backend, shared with primaries (device cost)
        self.answer_limit, self.body_limit = answer_limit, body_limit
        self.counts: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[tuple[str, str]] = Counter()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._ssl: Any = None
        self._problems: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self._warned_schema = False
        self.last_answers: dict[str, str] = {}  # shadow trace id → answer text, the latest few (tests, debugging)
        self.rewrite: Rewrite | None = None  # default: apply_strategy

    # -- choosing and reserving (on the primary's path: no I/O, no waiting) ------------------

    def reserve(self, experiment: str, spec: ShadowSpec) -> Slot | None:
        """A slot for one shadow of ``experiment``, or None (dropped, counted)."""
        key = (experiment, spec.key)
        cap = self.caps.get(key)
        if cap is None:
            with self._lock:
                cap = self.caps.get(key)
                if cap is None:
                    if len(self.caps) > 1024:  # declarations replaced by config changes
                        self.caps = {k: c for k, c in self.caps.items() if c.inflight}
                    cap = self.caps[key] = Cap(spec.max_concurrency)
        if not cap.try_acquire():
            self._count(experiment, "dropped")
            return None
        if not self.total.try_acquire():
            cap.release()
            self._count(experiment, "dropped")
            return None
        self._count(experiment, "sent")
        return Slot((cap, self.total))

    def decide(self, trace_id: str, experiment: str, spec: ShadowSpec | None) -> tuple[str | None, Slot | None]:
        """(``"sent"``/``"dropped"``/None, the slot when sent) for one primary request."""
        if spec is None or not chosen(trace_id, experiment, spec.fraction):
            return None, None
        slot = self.reserve(experiment, spec)
        return ("sent" if slot is not None else "dropped"), slot

    def launch(self, job: ShadowJob, slot: Slot) -> asyncio.Task[dict[str, Any] | None]:
        """Start a reserved shadow on the running loop; it owns ``slot`` from here on."""
        task = asyncio.get_running_loop().create_task(self.run(job, slot), name=f"ablab-shadow-{job.trace_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _count(self, experiment: str, result: str) -> None:
        with self._lock:
            self.counts[(experiment, result)] += 1
        if self.metrics is not None:
            self.metrics.shadows.labels(experiment, result).inc()

    # -- one shadow ------------------------------------------------------------------------------

    def open_clients(self) -> None:
        """Make every backend's client now (the gateway, at start: building an SSL context
        costs ~0.3 s of CPU, which must not stall the event loop the primaries share)."""
        for backend in self.backends.values():
            self._client(backend)

    def _client(self, backend: Backend) -> httpx.AsyncClient:
        client = self._clients.get(backend.name)
        if client is None:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            # Its own pool: a hanging shadow backend can hold these connections, never the primaries'.
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=32, keepalive_expiry=30.0)
            client = self._clients[backend.name] = httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits,
                                                                     verify=self._ssl)
        return client

    def problems(self, spec: ShadowSpec) -> tuple[str, ...]:
        found = self._problems.get(spec.key)
        if found is None:
            found = self._problems[spec.key] = tuple(strategy_problems(
                spec.strategy, backends=self.backends, templates=self.templates, can_compress=self.compress is not None))
            if found:
                log.error("shadow %s cannot be served here: %s", spec.key, "; ".join(found))
        return found

    async def run(self, job: ShadowJob, slot: Slot) -> dict[str, Any] | None:
        """Send, meter and record one shadow; returns its inference event (also recorded)."""
        spec = job.spec
        ts = datetime.now(UTC)
        start = time.perf_counter()
        backend = self.backends.get(spec.strategy.get("backend") or self.default_backend) or self.backends[self.default_backend]
        out = _Outcome(start=start)
        model = None
        entered = False
        if self.metrics is not None:
            self.metrics.shadow_inflight.labels(job.experiment).inc()
        try:
            if self.problems(spec):
                out.error = "strategy_unsupported"
                return self._finish(job, backend, model, ts, out)
            deadline = asyncio.get_running_loop().time() + spec.timeout_s  # one budget for the whole shadow
            async with asyncio.timeout_at(deadline):  # the rewrite may ask the backend (a tokenizer)
                if self.rewrite is not None:
                    body = await self.rewrite(job.body, spec.strategy, chat=job.chat, backend=backend, trace_id=job.trace_id)
                else:
                    body = apply_strategy(job.body, spec.strategy, chat=job.chat, templates=self.templates,
                                          compress=self.compress if "compression" in spec.strategy else None)
            stream = body.get("stream") is True
            translator = translator_for(backend.kind)
            body = translator.upstream_body(dict(body), stream=True) if stream else body
            model = body.get("model") if isinstance(body.get("model"), str) else None
            headers = {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": job.trace_id,
                       "x-ablab-experiment": job.experiment, "x-ablab-variant": job.variant,
                       "x-ablab-shadow-of": job.primary_trace, **job.extra_headers}
            if (key := backend.api_key()) is not None:
                headers["authorization"] = f"Bearer {key}"
            elif job.authorization:
                headers["authorization"] = job.authorization
            self.inflight[backend.name] = self.inflight.get(backend.name, 0) + 1
            entered = True
            out.inflight_at_start = self.inflight[backend.name]
            client = self._client(backend)
            async with asyncio.timeout_at(deadline):
                await self._exchange(client, backend.url + job.endpoint, orjson.dumps(body), headers, stream, translator, out)
        except TimeoutError:
            out.error = out.error or "shadow_timeout"
        except httpx.TimeoutException:
            out.error = "backend_timeout"
        except httpx.HTTPError:
            out.error = "backend_stream_broken" if out.connected else "backend_unreachable"
        except StrategyError:
            out.error = "strategy_unsupported"
        except asyncio.CancelledError:  # the gateway is stopping: still recorded
            out.error = "shadow_cancelled"
            self._finish(job, backend, model, ts, out, entered=entered)
            entered = False
            slot.release()
            raise
        except Exception:
            log.exception("shadow %s failed", job.trace_id)
            out.error = "shadow_internal_error"
        finally:
            slot.release()
            if self.metrics is not None:
                self.metrics.shadow_inflight.labels(job.experiment).dec()
        return self._finish(job, backend, model, ts, out, entered=entered)

    async def _exchange(self, client: httpx.AsyncClient, url: str, content: bytes, headers: dict[str, str], stream: bool,
                        translator: Any, out: _Outcome) -> None:
        clock = time.perf_counter
        async with client.stream("POST", url, content=content, headers=headers) as resp:
            out.connected = True
            if resp.status_code >= 400 or not stream:
                data = bytearray()
                async for piece in resp.aiter_raw():
                    if len(data) + len(piece) > self.body_limit:
                        out.error = "shadow_response_too_large"
                        break
                    data += piece
                out.end = clock()
                if resp.status_code >= 400:
                    out.error = f"backend_http_{resp.status_code}"
                    return
                if out.error:
                    return
                try:
                    parsed = orjson.loads(data)
                except orjson.JSONDecodeError:
                    out.error = "backend_invalid_json"
                    return
                out.usage, out.chars = protocol.response_view(parsed)
                out.text = protocol.response_text(parsed)[:self.answer_limit]
                out.metrics = translator.server_metrics(parsed) if isinstance(parsed, dict) else {}
                return
            meter = StreamMeter(translator=translator, strip_usage=True, text_limit=self.answer_limit)
            async for piece in resp.aiter_raw():
                meter.feed(piece, clock())  # the bytes are dropped here: only the meter's figures stay
                if meter.pending > self.body_limit:
                    out.error = "shadow_response_too_large"
                    break
            meter.close()
            s = meter.stats
            out.end, out.first = s.last_chunk_at or clock(), s.first_token_at
            out.usage, out.chars, out.chunks = s.usage, s.generated_chars, s.generated_chunks
            out.itl, out.metrics, out.text = (s.itl_sum_s, s.itl_max_s), s.server_metrics, meter.text()
            if out.error is None:
                if s.stream_error is not None:
                    out.error = "backend_stream_error"
                elif s.malformed:
                    out.error = "backend_malformed_chunk"
                elif not s.done:
                    out.error = "backend_stream_incomplete"

    def _finish(self, job: ShadowJob, backend: Backend, model: str | None, ts: datetime, out: _Outcome,
                *, entered: bool = False) -> dict[str, Any] | None:
        end = out.end if out.end is not None else time.perf_counter()
        concurrency = 1.0
        if entered:
            now = self.inflight.get(backend.name, 1)
            concurrency = (out.inflight_at_start + now) / 2.0
            self.inflight[backend.name] = now - 1
        translator = translator_for(backend.kind)
        prompt_tokens, output_tokens = translator.usage_tokens(out.usage)
        m = Measurement(start=out.start, end=end, first_token=out.first, prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens, est_prompt_tokens=protocol.estimate_tokens(len(protocol.message_text(job.body))),
                        est_output_tokens=out.chunks or protocol.estimate_tokens(out.chars), generated_chunks=out.chunks,
                        itl_sum_s=out.itl[0], itl_max_s=out.itl[1], concurrency=concurrency, error=out.error,
                        server_metrics=out.metrics or None)
        if out.error is None:
            self._count(job.experiment, "ok")
        else:
            self._count(job.experiment, "failed")
            with self._lock:
                self.failures[(job.experiment, out.error)] += 1
            if self.metrics is not None:
                self.metrics.shadow_failures.labels(job.experiment, out.error).inc()
        if len(self.last_answers) > 256:
            self.last_answers.clear()
        self.last_answers[job.trace_id] = out.text
        fields = inference_fields()
        if SHADOW_OF not in fields:
            # Without the field the event would count as one more request of the variant.
            if not self._warned_schema:
                self._warned_schema = True
                log.warning("this build's event schema has no `%s`: shadow events are not recorded", SHADOW_OF)
            return None
        event = inference_event(m, ts=ts, trace_id=job.trace_id, experiment=job.experiment, variant=job.variant,
                                unit_id=job.unit_id, strategy=job.spec.strategy_id, backend=backend, model=model,
                                with_measures=self.with_measures)
        event[SHADOW_OF] = job.primary_trace
        if OUTPUT_TEXT in fields and out.text:
            event[OUTPUT_TEXT] = out.text
        if self.record is not None:
            try:
                self.record([event])
            except Exception:
                log.exception("recording shadow %s failed", job.trace_id)
        return event

    async def aclose(self) -> None:
        """Cancel the shadows in flight (each still records its event) and close the clients."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


@dataclass(slots=True)
class _Outcome:
    start: float
    end: float | None = None
    first: float | None = None
    usage: dict[str, Any] | None = None
    chars: int = 0
    chunks: int = 0
    itl: tuple[float, float] = (0.0, 0.0)
    metrics: dict[str, float] | None = None
    text: str = ""
    error: str | None = None
    connected: bool = False
    inflight_at_start: int = 1


class BackgroundShadows:
    """A :class:`ShadowRunner` on its own event loop in a daemon thread, for callers that may
    have no loop of their own (the SDK's sync client) or must not share theirs. ``reserve``
    and ``submit`` may be called from any thread; neither waits for the shadow."""

    def __init__(self, runner_factory: Callable[[], ShadowRunner]) -> None:
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.runner = runner_factory()
        self._thread = threading.Thread(target=self._run, name="ablab-shadows", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._ready.set()
        loop.run_forever()
        loop.close()

    def decide(self, trace_id: str, experiment: str, spec: ShadowSpec | None) -> tuple[str | None, Slot | None]:
        return self.runner.decide(trace_id, experiment, spec)

    def submit(self, job: ShadowJob, slot: Slot) -> concurrent.futures.Future[dict[str, Any] | None] | None:
        loop = self._loop
        if loop is None or loop.is_closed():
            slot.release()
            return None
        return asyncio.run_coroutine_threadsafe(self._start(job, slot), loop)

    async def _start(self, job: ShadowJob, slot: Slot) -> dict[str, Any] | None:
        return await self.runner.launch(job, slot)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Wait until no shadow is in flight (tests, and a clean exit)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.runner.tasks or self.runner.total.inflight):
            time.sleep(0.01)

    def close(self, timeout_s: float = 10.0) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        done: Awaitable[None] = self.runner.aclose()
        try:
            asyncio.run_coroutine_threadsafe(done, loop).result(timeout_s)  # type: ignore[arg-type]
        except Exception:
            log.warning("shadows did not stop within %.0f s", timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout_s)
