"""The prompt strategies' transformations, as pure functions over a request's messages (or a
completion prompt): no I/O, fixed inputs → fixed outputs. :mod:`.pipeline` feeds them the
backend's token counts and probabilities.

- ``dialogue_state``: :func:`extract_slots`, :func:`render_state`, :func:`apply_dialogue_state`.
- ``prompt_split``: :func:`split_segments`, :func:`allocate`, :func:`cut_ids`, :func:`cut_chars`.
- ``context_prune``: :func:`prune_mask` (per-window entropy pruning) and
  :func:`surprisal_from_echo` (normalised surprisal from an OpenAI ``echo`` + ``logprobs``
  answer, aligned whichever way the server indexes it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SLOT_VALUE_CHARS = 256  # a slot's value is cut to this many characters
SYSTEM_ROLES = ("system", "developer")


# ---------------------------------------------------------------- message text


def texts(message: Any) -> list[str]:
    """The text of a chat message: its string content, or its text parts in order."""
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
    return []


def map_texts(message: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """``message`` with ``fn`` applied to its string content or to each of its text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": fn(content)}
    if isinstance(content, list):
        parts = [{**p, "text": fn(p["text"])} if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                 else p for p in content]
        return {**message, "content": parts}
    return message


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None


# ---------------------------------------------------------------- dialogue_state


def _value(match: Any, groups: int) -> str:
    text = match.group(1) if groups == 1 and match.group(1) is not None else match.group(0)
    return " ".join(str(text).split())[:SLOT_VALUE_CHARS]


def extract_slots(messages: Sequence[Any], programs: Mapping[str, Any], roles: Sequence[str]) -> dict[str, str]:
    """Each slot's value after the whole conversation: turns are read in order, and a slot
    changes only when a later turn (of one of ``roles``) matches its pattern; within a turn
    the last match counts. Slots come back in declared order; unset ones are absent."""
    found: dict[str, str] = {}
    for message in messages:
        if _role(message) not in roles:
            continue
        for text in texts(message):
            for name, program in programs.items():
                value = None
                for match in program.finditer(text):
                    value = _value(match, program.groups) or value
                if value:
                    found[name] = value
    return {name: found[name] for name in programs if name in found}


def render_state(slots: Mapping[str, str], header: str) -> str:
    return "\n".join([header, *(f"- {name}: {value}" for name, value in slots.items())])


@dataclass(frozen=True)
class DialogueStateResult:
    messages: list[Any]
    turns_in: int  # messages other than system/developer ones, before
    turns_out: int  # ... after (the last turn)
    slots: dict[str, str]


def apply_dialogue_state(messages: Sequence[Any], programs: Mapping[str, Any], *, roles: Sequence[str],
                         header: str) -> DialogueStateResult:
    """System and developer messages are kept where they are; every other message before the
    last user message is replaced by one system message holding the slots (after the leading
    system messages; none when no slot is set); the last turn (the last user message and
    whatever follows it) is kept whole."""
    msgs = list(messages)
    turns_in = sum(1 for m in msgs if _role(m) not in SYSTEM_ROLES)
    last = next((i for i in range(len(msgs) - 1, -1, -1) if _role(msgs[i]) == "user"), None)
    slots = extract_slots(msgs, programs, roles)
    if last is None:
        return DialogueStateResult(msgs, turns_in, turns_in, slots)
    head = [m for m in msgs[:last] if _role(m) in SYSTEM_ROLES]
    tail = msgs[last:]
    lead = 0
    while lead < len(head) and head[lead] is msgs[lead]:
        lead += 1
    state = [{"role": "system", "content": render_state(slots, header)}] if slots else []
    out = [*head[:lead], *state, *head[lead:], *tail]
    return DialogueStateResult(out, turns_in, sum(1 for m in tail if _role(m) not in SYSTEM_ROLES), slots)


# ---------------------------------------------------------------- prompt_split


@dataclass
class Segment:
    """One piece of text of the prompt: a message's string content or one of its text parts
    (``part`` is its index, None for string content), or the completion prompt (``message`` None)."""

    message: int | None
    part: int | None
    hard: str
    soft: str | None  # None: the text holds no delimiter, all of it is hard


def _split(text: str, delimiter: str) -> tuple[str, str | None]:
    head, found, rest = text.partition(delimiter)
    return (head, rest.replace(delimiter, "")) if found else (text, None)


def split_segments(body: Mapping[str, Any], delimiter: str, *, chat: bool) -> list[Segment]:
    """Every text of the request, split at the first ``delimiter``: before it hard, after it
    soft (later delimiters in the soft text are removed). Text without a delimiter is hard."""
    if not chat:
        prompt = body.get("prompt")
        return [Segment(None, None, *_split(prompt, delimiter))] if isinstance(prompt, str) else []
    out = []
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            out.append(Segment(i, None, *_split(content, delimiter)))
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                    out.append(Segment(i, j, *_split(part["text"], delimiter)))
    return out


def allocate(soft_tokens: Sequence[int], budget: int, *, keep: str) -> list[int]:
    """Tokens each soft text keeps when together they may have ``budget``: with ``keep="end"``
    the latest soft text is served first (the oldest is cut first), with ``"start"`` the earliest."""
    order = range(len(soft_tokens) - 1, -1, -1) if keep == "end" else range(len(soft_tokens))
    left = max(0, budget)
    out = [0] * len(soft_tokens)
    for i in order:
        out[i] = min(soft_tokens[i], left)
        left -= out[i]
    return out


def cut_ids(ids: Sequence[int], n: int, *, keep: str) -> list[int]:
    """The ``n`` tokens of ``ids`` that survive: the last ``n`` (``keep="end"``) or the first."""
    if n <= 0:
        return []
    return list(ids[-n:]) if keep == "end" else list(ids[:n])


def cut_chars(text: str, tokens: int, total_tokens: int, *, keep: str) -> str:
    """The estimated cut when the backend offers no tokenizer: the same share of characters."""
    if tokens >= total_tokens:
        return text
    n = round(len(text) * tokens / total_tokens) if total_tokens else 0
    if n <= 0:
        return ""
    return text[-n:] if keep == "end" else text[:n]


def replace_segment(body: dict[str, Any], seg: Segment, text: str) -> None:
    """Write ``text`` in place of ``seg`` in ``body`` (a copy the caller owns: messages and
    content lists are copied, never the caller's)."""
    if seg.message is None:
        body["prompt"] = text
        return
    messages = body["messages"]
    message = dict(messages[seg.message])
    if seg.part is None:
        message["content"] = text
    else:
        parts = list(message["content"])
        parts[seg.part] = {**parts[seg.part], "text": text}
        message["content"] = parts
    messages[seg.message] = message


# ---------------------------------------------------------------- context_prune


def prune_mask(surprisal: Sequence[float], *, tau: float, window: int) -> list[bool]:
    """Which tokens stay: per window of ``window`` tokens, those whose normalised surprisal is
    at least ``tau``, and at least the window's most surprising one; the first token (it has no
    context to be predicted from) and the last are always kept. The rule of the in-repo
    runtime's ``prune_by_entropy``."""
    n = len(surprisal)
    keep = [False] * n
    if n == 0:
        return keep
    keep[0] = keep[-1] = True
    for start in range(1, n, window):
        idx = range(start, min(start + window, n))
        kept_any = False
        for i in idx:
            if surprisal[i] >= tau:
                keep[i] = kept_any = True
        if not kept_any and len(idx):
            keep[max(idx, key=lambda i: surprisal[i])] = True
    return keep


@dataclass(frozen=True)
class Scored:
    pieces: list[str]  # the prompt's tokens as text; "".join(pieces) == the prompt
    surprisal: list[float]  # normalised to [0, 1], one per piece
    alignment: str  # "same": token_logprobs[i] is token i's; "next": top_logprobs[i] predicts token i + 1


def _pieces(text: str, tokens: Sequence[Any], offsets: Sequence[Any] | None) -> list[str] | None:
    """The prompt's tokens as text, from the answer's ``tokens`` (or ``text_offset``), so that
    they join to exactly ``text``; None when neither adds up."""
    out, total = [], 0
    for t in tokens:
        if total >= len(text):
            break
        if not isinstance(t, str):
            return None
        out.append(t)
        total += len(t)
    if "".join(out) == text:
        return out
    if offsets and len(offsets) >= 1 and all(isinstance(o, int) for o in offsets):
        cuts = [o for o in offsets if 0 <= o < len(text)]
        if cuts and cuts[0] == 0 and cuts == sorted(set(cuts)):
            return [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)])]
    return None


def _kth(top: Mapping[str, float], k: int) -> float:
    values = sorted((v for v in top.values() if isinstance(v, int | float)), reverse=True)
    return values[min(k, len(values)) - 1] if values else -math.inf


def surprisal_from_echo(text: str, logprobs: Mapping[str, Any], *, vocab: int, top_k: int) -> Scored | None:
    """Normalised surprisal −log p / log ``vocab`` (clamped to [0, 1]) of each prompt token,
    from the ``logprobs`` of a ``/v1/completions`` answer with ``echo: true``.

    Servers disagree on where a prompt token's probability sits. The OpenAI convention puts
    log p(token i | tokens < i) at ``token_logprobs[i]`` ("same"); llama-cpp-python (0.3.x,
    models without BOS) puts at index i the distribution *after* token i, so token i + 1's
    probability is in ``top_logprobs[i]`` when it is among the top ``top_k`` ("next"). "next"
    is read when at least half the tokens are found among the previous index's candidates and
    that reading gives the higher mean log-probability (a model predicts ordinary text well);
    else "same". Under "next", a token outside the top ``top_k``
    counts at the ``top_k``-th candidate's log-probability (an upper bound on its probability:
    its surprisal is at least that). A token with no probability (the first) counts as 1.
    None when the answer's tokens do not join to ``text``."""
    tokens = logprobs.get("tokens")
    if not isinstance(tokens, list):
        return None
    pieces = _pieces(text, tokens, logprobs.get("text_offset"))
    if not pieces:
        return None
    n = len(pieces)
    same_raw = logprobs.get("token_logprobs") or []
    top = logprobs.get("top_logprobs") or []
    same: list[float | None] = [v if isinstance(v, int | float) and math.isfinite(v) else None
                                for v in (list(same_raw) + [None] * n)[:n]]
    nxt: list[float | None] = [None] * n
    hits = looked = 0
    for j in range(1, n):
        dist = top[j - 1] if j - 1 < len(top) else None
        if isinstance(dist, Mapping) and dist:
            got = dist.get(pieces[j])
            found = isinstance(got, int | float) and math.isfinite(got)
            nxt[j] = float(got) if found and got is not None else _kth(dist, top_k)
            if pieces[j] != pieces[j - 1]:  # a repeated piece is in its own position's entry either way
                looked += 1
                hits += found
    both = [(s, x) for s, x in zip(same, nxt) if s is not None and x is not None and math.isfinite(x)]
    alignment = "same"
    # "next" when the following token is mostly among index i's candidates (under the OpenAI
    # convention it rarely is: those predict token i itself) and it reads as the likelier text
    if both and looked and hits >= 0.5 * looked and sum(x for _, x in both) > sum(s for s, _ in both):
        alignment = "next"
    chosen = nxt if alignment == "next" else same
    scale = math.log(max(vocab, 2))
    surprisal = [1.0 if lp is None or not math.isfinite(lp) else min(1.0, max(0.0, -lp / scale)) for lp in chosen]
    surprisal[0] = 1.0
    return Scored(pieces, surprisal, alignment)
