"""Strategy → upstream request body. Only the fields a strategy sets are rewritten.

Gateway factors (read from the assignment's plain strategy mapping):
``backend`` (a configured backend's name), ``model``, ``params`` (request-body overrides
such as ``temperature``, ``top_p``, ``max_tokens``), ``system_prompt``, ``prompt_template``
(a named template rendered around the caller's last user message), ``cot_depth`` (an
instruction to reason in at most N steps), ``compression`` (``{method: entropy, tau,
window}``: token-entropy pruning of the user's text with the in-repo model as scorer).
The prompt strategies ``dialogue_state``, ``prompt_split`` and ``context_prune`` are applied
after this rewrite by :mod:`ablab.platform.gateway.prompting` (they talk to the backend).
Other factors (the in-repo runtime's, a team's own) are not the gateway's to apply: the
backend learns the variant from the ``X-Ablab-Variant`` header.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

BUILTIN_TEMPLATES = {
    "plain": "{input}",
    "structured": "Task:\n{input}\n\nAnswer with only what the task asks for.",
}
PROTECTED_PARAMS = frozenset({"stream", "messages", "prompt"})
MAX_COT_DEPTH = 16


class StrategyError(ValueError):
    """A variant's strategy cannot be served by this gateway; the message says why."""


def cot_instruction(depth: int) -> str:
    return f"Think step by step, in at most {depth} short steps, then give the final answer."


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def strategy_problems(strategy: Mapping[str, Any], *, backends: Mapping[str, Any], templates: Mapping[str, str],
                      can_compress: bool | None = None) -> list[str]:
    """Why this gateway cannot serve the strategy (empty when it can). ``can_compress``: whether
    the gateway was given a prompt compressor (default: whether torch, its scorer's need, is installed)."""
    problems = []
    backend = strategy.get("backend")
    if backend is not None and backend not in backends:
        problems.append(f"backend={backend!r}: not configured in this gateway (known: {sorted(backends)})")
    params = strategy.get("params")
    if params is not None:
        if not isinstance(params, Mapping):
            problems.append(f"params: a mapping of request-body fields, got {type(params).__name__}")
        elif bad := sorted(PROTECTED_PARAMS & set(params)):
            problems.append(f"params: {bad} are the caller's, not a strategy's")
    template = strategy.get("prompt_template")
    if template is not None and template not in templates and template not in BUILTIN_TEMPLATES:
        problems.append(f"prompt_template={template!r}: not a named template (known: {sorted({*BUILTIN_TEMPLATES, *templates})})")
    depth = strategy.get("cot_depth")
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_COT_DEPTH):
        problems.append(f"cot_depth={depth!r}: an integer in 0..{MAX_COT_DEPTH}")
    compression = strategy.get("compression")
    if can_compress is None:
        can_compress = torch_available()
    if isinstance(compression, Mapping) and compression.get("method", "none") == "entropy" and not can_compress:
        problems.append("compression.method='entropy' needs the in-repo scorer: install ablab[inference] (torch)")
    problems += prompt_strategy_problems(strategy)
    return problems


def prompt_strategy_problems(strategy: Mapping[str, Any]) -> list[str]:
    """Why a prompt strategy's settings cannot be served (the registry refuses these with a
    422 first; a gateway still checks what its assignment config holds)."""
    from pydantic import ValidationError

    from ablab.platform.strategy import ContextPrune, DialogueState, PromptSplit

    out = []
    for name, model in (("dialogue_state", DialogueState), ("prompt_split", PromptSplit), ("context_prune", ContextPrune)):
        value = strategy.get(name)
        if value is None:
            continue
        try:
            model.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            out.append(f"{'.'.join(str(p) for p in (name, *first['loc']))}: {first['msg']}")
    return out


def _render(text: str, template: str) -> str:
    return template.replace("{input}", text)


def _last_user(messages: list[Any]) -> dict[str, Any] | None:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return m
    return None


def _map_text(message: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": fn(content)}
    if isinstance(content, list):
        parts, done = [], False
        for part in content:
            if not done and isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                part, done = {**part, "text": fn(part["text"])}, True
            parts.append(part)
        return {**message, "content": parts}
    return message


def apply_strategy(
    body: dict[str, Any],
    strategy: Mapping[str, Any],
    *,
    chat: bool,
    templates: Mapping[str, str],
    compress: Callable[[str, float, int], str] | None = None,
) -> dict[str, Any]:
    """The upstream body for ``strategy``. ``body`` is the caller's parsed body (not mutated);
    fields the strategy does not set stay as the caller sent them."""
    if not strategy:
        return body
    out = dict(body)
    if (model := strategy.get("model")) is not None:
        out["model"] = model
    params = strategy.get("params")
    if isinstance(params, Mapping):
        out.update(params)
    text_fns: list[Callable[[str], str]] = []
    compression = strategy.get("compression")
    if isinstance(compression, Mapping) and compression.get("method", "none") == "entropy":
        if compress is None:
            raise StrategyError("compression.method='entropy' needs the in-repo scorer: install ablab[inference] (torch)")
        tau, window = float(compression.get("tau", 0.18)), int(compression.get("window", 32))
        text_fns.append(lambda t: compress(t, tau, window))
    if (name := strategy.get("prompt_template")) is not None:
        template = templates.get(name) or BUILTIN_TEMPLATES.get(name)
        if template is None:
            raise StrategyError(f"prompt_template={name!r}: not a named template")
        if template != "{input}":
            text_fns.append(lambda t: _render(t, template))

    def text_fn(text: str) -> str:
        for fn in text_fns:
            text = fn(text)
        return text

    system = strategy.get("system_prompt")
    depth = strategy.get("cot_depth") or 0
    extra = cot_instruction(depth) if depth else None
    if chat:
        messages = list(out.get("messages") or ())
        if text_fns and (last := _last_user(messages)) is not None:
            messages[messages.index(last)] = _map_text(last, text_fn)
        if system is not None or extra:
            idx = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") in ("system", "developer")), None)
            current = messages[idx].get("content") if idx is not None else None
            base = system if system is not None else (current if isinstance(current, str) else "")
            content = f"{base}\n\n{extra}".strip() if extra else base
            if idx is None:
                messages.insert(0, {"role": "system", "content": content})
            else:
                messages[idx] = {**messages[idx], "content": content}
        out["messages"] = messages
    else:
        prompt = out.get("prompt")
        if isinstance(prompt, str):
            prompt = text_fn(prompt) if text_fns else prompt
            head = "\n\n".join(p for p in (system, extra) if p)
            out["prompt"] = f"{head}\n\n{prompt}" if head else prompt
    return out
