"""The gateway's whole request rewrite: :func:`~ablab.platform.gateway.rewrite.apply_strategy`
(model, params, system prompt, template, CoT, compression), then the prompt strategies in this
order — ``dialogue_state`` (chat only), ``prompt_split``, ``context_prune`` — each reading the
previous one's output. Splitting before pruning keeps the scorer's forward pass inside the
budget the split enforces.

What each strategy did is filed as the request's notes (:mod:`.rates`) and lands in its
inference event's ``measures`` and ``dims`` (names in docs/gateway.md). A strategy never
silently serves something else: where the backend lacks a tokenizer or probabilities, the
fallback used is named in ``dims`` (``split_tokenizer``, ``prune_scorer``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from ablab.platform.gateway import protocol
from ablab.platform.gateway.prompting import transforms as tf
from ablab.platform.gateway.prompting.backend import BackendTools
from ablab.platform.gateway.prompting.rates import Notes, PrefillRates, file_notes
from ablab.platform.gateway.rewrite import StrategyError, apply_strategy
from ablab.platform.gateway.settings import Backend
from ablab.platform.strategy import ContextPrune, DialogueState, PromptSplit, compile_slot_pattern

log = logging.getLogger(__name__)

PROMPT_FACTORS: dict[str, type[BaseModel]] = {"dialogue_state": DialogueState, "prompt_split": PromptSplit, "context_prune": ContextPrune}


@dataclass
class PromptRuntime:
    """Per gateway: the measured prefill rates and each backend's tokenizer and scorer."""

    state: Any  # serving.GatewayState
    rates: PrefillRates = field(default_factory=PrefillRates)
    tools: dict[str, BackendTools] = field(default_factory=dict)

    def tools_for(self, backend: Backend) -> BackendTools:
        found = self.tools.get(backend.name)
        if found is None:
            pool = self.state.clients[backend.name]
            found = self.tools[backend.name] = BackendTools(backend, pool.client)
        return found


def runtime(state: Any) -> PromptRuntime:
    """The state's prompt runtime, made on first use (kept in the state's own attributes)."""
    found: PromptRuntime | None = vars(state).get("_prompting")
    if found is None:
        found = vars(state)["_prompting"] = PromptRuntime(state)
    return found


@lru_cache(maxsize=512)
def _spec(name: str, canonical: str) -> Any:
    return PROMPT_FACTORS[name].model_validate(json.loads(canonical))


def spec(name: str, value: Any) -> Any:
    """The validated factor (cached by its canonical JSON); StrategyError says what is wrong."""
    try:
        return _spec(name, json.dumps(value, sort_keys=True, separators=(",", ":")))
    except (ValidationError, TypeError, ValueError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in (name, *first["loc"]))
        raise StrategyError(f"{where}: {first['msg']}") from None


@lru_cache(maxsize=1024)
def _program(pattern: str) -> Any:
    return compile_slot_pattern(pattern)


def slot_programs(state_spec: DialogueState) -> dict[str, Any]:
    return {name: _program(pattern) for name, pattern in state_spec.slots.items()}


async def rewrite_request(state: Any, body: dict[str, Any], strategy: Mapping[str, Any], *, chat: bool, backend: Backend,
                          trace_id: str, events: int) -> dict[str, Any]:
    """The upstream body for ``strategy`` (``body`` is the caller's, never mutated; returned
    itself when nothing changes). ``events``: how many inference events the request will
    write (its experiments); with any, its notes are filed under ``trace_id``."""
    started = time.perf_counter()
    upstream = apply_strategy(body, strategy, chat=chat, templates=state.settings.templates,
                              compress=state.compressor() if "compression" in strategy else None)
    rt = runtime(state)
    notes = Notes(rt.rates, backend.name, events)
    if any(strategy.get(name) is not None for name in PROMPT_FACTORS):
        out = dict(upstream)
        if chat:
            out["messages"] = list(out.get("messages") or ())
        model = out.get("model") if isinstance(out.get("model"), str) else None
        if chat and (value := strategy.get("dialogue_state")) is not None:
            _dialogue_state(out, spec("dialogue_state", value), notes)
        if (value := strategy.get("prompt_split")) is not None:
            await _prompt_split(out, spec("prompt_split", value), rt, backend, model, trace_id, notes, chat=chat)
        if (value := strategy.get("context_prune")) is not None:
            await _context_prune(out, spec("context_prune", value), rt, backend, model, trace_id, notes, chat=chat)
        upstream = out
        notes.measures["prompt_rewrite_ms"] = round((time.perf_counter() - started) * 1000.0, 3)
    if events > 0:
        notes.est_prompt_tokens = protocol.estimate_tokens(len(protocol.message_text(upstream)))
        notes.sent_at = time.perf_counter()
        file_notes(trace_id, notes)
    return upstream


# ---------------------------------------------------------------- dialogue_state


def _dialogue_state(out: dict[str, Any], ds: DialogueState, notes: Notes) -> None:
    result = tf.apply_dialogue_state(out["messages"], slot_programs(ds), roles=ds.roles, header=ds.header)
    out["messages"] = result.messages
    notes.measures.update(ds_turns_in=result.turns_in, ds_turns_out=result.turns_out, ds_slots=len(result.slots))


# ---------------------------------------------------------------- prompt_split


async def _count(tools: BackendTools, text: str, model: str | None, trace_id: str,
                 exact: bool) -> tuple[int, list[int] | None, bool]:
    """(tokens, their ids, counted by the backend?) of ``text``."""
    if not text:
        return 0, [], True
    if exact:
        ids = await tools.tokenize(text, model, trace_id)
        if ids is not None:
            return len(ids), ids, True
    return protocol.estimate_tokens(len(text)), None, False


async def _prompt_split(out: dict[str, Any], ps: PromptSplit, rt: PromptRuntime, backend: Backend, model: str | None,
                        trace_id: str, notes: Notes, *, chat: bool) -> None:
    segments = tf.split_segments(out, ps.delimiter, chat=chat)
    soft = [s for s in segments if s.soft is not None]
    rate: float | None
    if ps.prefill_tps is not None:
        rate, how = ps.prefill_tps, "declared"
    else:
        measured = rt.rates.rate(backend.name)
        rate, how = measured, "measured" if measured is not None else "unmeasured"
    notes.dims["split_rate"] = how
    if not soft:
        notes.measures.update(split_soft_tokens=0, split_kept_tokens=0)
        return
    if rate is None:  # nothing measured yet: the delimiters go, the soft text stays whole
        for s in soft:
            tf.replace_segment(out, s, s.hard + (s.soft or ""))
        return
    tools = rt.tools_for(backend)
    flavour = await tools.tokenizer(model, trace_id)
    exact = flavour is not None
    counted = await asyncio.gather(_count(tools, "\n".join(s.hard for s in segments if s.hard), model, trace_id, exact),
                                   *(_count(tools, s.soft or "", model, trace_id, exact) for s in soft))
    hard_tokens = counted[0][0]
    soft_counts = [c for c, _, _ in counted[1:]]
    exact = exact and all(by_backend for _, _, by_backend in counted)
    budget = math.floor(rate * ps.latency_budget_ms / 1000.0)
    kept = tf.allocate(soft_counts, budget - hard_tokens, keep=ps.keep)
    for s, n, (total, ids, _) in zip(soft, kept, counted[1:]):
        text = s.soft or ""
        if n < total:
            cut = await tools.detokenize(tf.cut_ids(ids, n, keep=ps.keep), model, trace_id) if ids is not None else None
            if cut is None:
                exact = False
                cut = tf.cut_chars(text, n, total, keep=ps.keep)
            text = cut
        tf.replace_segment(out, s, s.hard + text)
    notes.dims["split_tokenizer"] = flavour if exact and flavour else "estimate"
    notes.measures.update(prefill_tps=round(rate, 3), split_budget_tokens=budget, split_hard_tokens=hard_tokens,
                          split_soft_tokens=sum(soft_counts), split_kept_tokens=sum(kept))


# ---------------------------------------------------------------- context_prune


def _replacing(replacements: Iterator[str]) -> Callable[[str], str]:
    """A text map that hands out ``replacements`` in order, one per text it is given."""
    return lambda _text: next(replacements)


def _prune_targets(out: dict[str, Any], cp: ContextPrune, *, chat: bool) -> list[int | None]:
    """Indexes of the messages to prune (None: the completion prompt)."""
    if not chat:
        return [None] if isinstance(out.get("prompt"), str) else []
    users: list[int | None] = [i for i, m in enumerate(out["messages"]) if isinstance(m, dict) and m.get("role") == "user"]
    return users if cp.scope == "user" else users[-1:]


async def _context_prune(out: dict[str, Any], cp: ContextPrune, rt: PromptRuntime, backend: Backend, model: str | None,
                         trace_id: str, notes: Notes, *, chat: bool) -> None:
    tools = rt.tools_for(backend)
    compress = rt.state.compressor()
    used: list[str] = []
    sums = {"prune_chars_in": 0, "prune_chars_out": 0, "prune_tokens_in": 0, "prune_tokens_out": 0}
    started = time.perf_counter()

    async def prune(text: str) -> str:
        if not text.strip():
            return text
        scored = await tools.score(text, model, trace_id) if "in_repo" not in used and "none" not in used else None
        if scored is not None:
            mask = tf.prune_mask(scored.surprisal, tau=cp.tau, window=cp.window)
            result = "".join(p for p, k in zip(scored.pieces, mask) if k)
            used.append("backend")
            sums["prune_tokens_in"] += len(mask)
            sums["prune_tokens_out"] += sum(mask)
        elif compress is not None:
            result = await asyncio.to_thread(compress, text, cp.tau, cp.window)
            used.append("in_repo")
        else:
            result = text
            used.append("none")
        sums["prune_chars_in"] += len(text)
        sums["prune_chars_out"] += len(result)
        return result

    for index in _prune_targets(out, cp, chat=chat):
        if index is None:
            out["prompt"] = await prune(out["prompt"])
            continue
        message = out["messages"][index]
        pruned = [await prune(t) for t in tf.texts(message)]
        out["messages"][index] = tf.map_texts(message, _replacing(iter(pruned)))
    if not used:
        return
    # the weakest scorer any text got: backend < in_repo < none
    notes.dims["prune_scorer"] = "none" if "none" in used else "in_repo" if "in_repo" in used else "backend"
    if notes.dims["prune_scorer"] != "backend":
        sums.pop("prune_tokens_in")
        sums.pop("prune_tokens_out")
    notes.measures.update(sums)
    notes.measures["prune_ms"] = round((time.perf_counter() - started) * 1000.0, 3)
