"""What a backend offers the prompt strategies: its tokenizer and its prompt-token probabilities.

**Tokenizer** (``prompt_split``'s counts and cuts), probed once per backend in this order:
llama-cpp-python's ``POST /extras/tokenize`` / ``/extras/detokenize``, llama.cpp's server
``POST /tokenize`` / ``/detokenize`` (``content``), vLLM's ``POST /tokenize`` /
``/detokenize`` (``model``, ``prompt``), all at the backend URL without its ``/v1``. A token
sequence the tokenizer prepends to every text (BOS) is measured on the empty text and not
counted. A backend offering none is counted at ~4 characters a token (marked ``estimate``).

**Probabilities** (``context_prune``'s scorer): ``POST /v1/completions`` with ``echo: true``,
``logprobs: 20``, ``max_tokens: 1`` — the OpenAI protocol's way to get the prompt's own
token log-probabilities. llama-cpp-python's server and vLLM answer it; llama.cpp's C++
server and hosted chat-only APIs do not (then the in-repo scorer is used, and the event says
so). The vocabulary size normalising surprisal is llama.cpp's ``meta.n_vocab`` from
``GET /v1/models`` where given, else :data:`DEFAULT_VOCAB`.

A backend found lacking is asked again after :data:`RETRY_S`. The auxiliary calls carry
the backend's ``api_key_env`` key (not the caller's ``Authorization``) and no
``X-Request-Id``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx

from ablab.platform.gateway.prompting.transforms import Scored, surprisal_from_echo
from ablab.platform.gateway.settings import Backend

log = logging.getLogger(__name__)

DEFAULT_VOCAB = 65_536
TOP_K = 20
RETRY_S = 300.0
AUX_TIMEOUT_S = 10.0  # a tokenizer call; the scorer's call runs under the backend's own timeout
SCORE_CACHE = 256

# (tokenize path, request body, detokenize path, detokenize body, detokenized text's key)
_FLAVOURS: dict[str, tuple[str, Callable[[str, str | None], dict[str, Any]], str,
                           Callable[[list[int], str | None], dict[str, Any]], str]] = {
    "llama-cpp-python": ("/extras/tokenize", lambda t, m: {"input": t}, "/extras/detokenize",
                         lambda ids, m: {"tokens": ids}, "text"),
    "llama.cpp": ("/tokenize", lambda t, m: {"content": t}, "/detokenize", lambda ids, m: {"tokens": ids}, "content"),
    "vllm": ("/tokenize", lambda t, m: {"model": m, "prompt": t}, "/detokenize",
             lambda ids, m: {"model": m, "tokens": ids}, "prompt"),
}


def _ids(data: Any) -> list[int] | None:
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        return None
    out = []
    for t in tokens:
        if isinstance(t, dict):  # llama.cpp with_pieces
            t = t.get("id")
        if not isinstance(t, int) or isinstance(t, bool):
            return None
        out.append(t)
    return out


class BackendTools:
    """One backend's tokenizer and scorer, probed lazily and remembered."""

    def __init__(self, backend: Backend, client: Callable[[], httpx.AsyncClient]) -> None:
        self.backend = backend
        self._client = client
        url = backend.url.rstrip("/")
        self.root = url[: -len("/v1")] if url.endswith("/v1") else url
        self.flavour: str | None = None
        self.prefix: list[int] = []  # what the tokenizer prepends to every text (BOS)
        self._tokenizer_checked = -math.inf
        self.logprobs: bool | None = None
        self._logprobs_checked = -math.inf
        self.vocab: int | None = None
        self._scores: OrderedDict[tuple[str, str], Scored] = OrderedDict()

    def _headers(self, trace_id: str, what: str) -> dict[str, str]:
        # No X-Request-Id: llama-cpp-python's server refuses (400) one that is not a UUID, and
        # the request's own trace id belongs to the request it serves.
        headers = {"content-type": "application/json"}
        if (key := self.backend.api_key()) is not None:
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def _post(self, url: str, body: dict[str, Any], headers: dict[str, str], timeout: float | None) -> Any:
        kwargs: dict[str, Any] = {"json": body, "headers": headers}
        if timeout is not None:
            kwargs["timeout"] = timeout
        r = await self._client().post(url, **kwargs)
        if r.status_code != 200:
            return None
        try:
            return r.json()
        except ValueError:
            return None

    # ------------------------------------------------------------ tokenizer

    async def _probe_tokenizer(self, model: str | None, trace_id: str) -> None:
        self._tokenizer_checked = time.monotonic()
        for name, (path, body, *_rest) in _FLAVOURS.items():
            try:
                empty = _ids(await self._post(self.root + path, body("", model), self._headers(trace_id, "tokenize"), AUX_TIMEOUT_S))
                probe = _ids(await self._post(self.root + path, body("a b", model), self._headers(trace_id, "tokenize"),
                                              AUX_TIMEOUT_S))
            except httpx.HTTPError:
                continue
            if empty is not None and probe and len(probe) > len(empty) and probe[: len(empty)] == empty:
                self.flavour, self.prefix = name, empty
                log.info("backend %s: tokenizer %s (prefix %s)", self.backend.name, name, empty)
                return
        self.flavour = None
        log.info("backend %s offers no tokenizer endpoint: prompt_split counts ~4 characters a token", self.backend.name)

    async def tokenizer(self, model: str | None, trace_id: str) -> str | None:
        """The tokenizer flavour this backend offers (None: none; counts are estimated)."""
        if self.flavour is None and time.monotonic() - self._tokenizer_checked > RETRY_S:
            await self._probe_tokenizer(model, trace_id)
        return self.flavour

    async def tokenize(self, text: str, model: str | None, trace_id: str) -> list[int] | None:
        if self.flavour is None:
            return None
        path, body, *_rest = _FLAVOURS[self.flavour]
        try:
            ids = _ids(await self._post(self.root + path, body(text, model), self._headers(trace_id, "tokenize"), AUX_TIMEOUT_S))
        except httpx.HTTPError:
            return None
        if ids is not None and self.prefix and ids[: len(self.prefix)] == self.prefix:
            ids = ids[len(self.prefix):]
        return ids

    async def detokenize(self, ids: list[int], model: str | None, trace_id: str) -> str | None:
        if self.flavour is None:
            return None
        _p, _b, path, body, key = _FLAVOURS[self.flavour]
        if not ids:
            return ""
        try:
            data = await self._post(self.root + path, body(ids, model), self._headers(trace_id, "tokenize"), AUX_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        text = data.get(key) if isinstance(data, dict) else None
        return text if isinstance(text, str) else None

    # ------------------------------------------------------------ scorer

    async def _vocab(self, trace_id: str) -> int:
        if self.vocab is None:
            self.vocab = DEFAULT_VOCAB
            try:
                r = await self._client().get(self.backend.url.rstrip("/") + "/models", headers=self._headers(trace_id, "models"),
                                             timeout=AUX_TIMEOUT_S)
                for m in (r.json().get("data") or []) if r.status_code == 200 else []:
                    n = (m.get("meta") or {}).get("n_vocab") if isinstance(m, dict) else None
                    if isinstance(n, int) and n > 1:
                        self.vocab = n
                        break
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
        return self.vocab

    def offers_logprobs(self) -> bool:
        return self.logprobs is not False or time.monotonic() - self._logprobs_checked > RETRY_S

    async def score(self, text: str, model: str | None, trace_id: str) -> Scored | None:
        """The prompt's tokens and their normalised surprisal by the backend itself, or None
        (it does not offer prompt log-probabilities, or the call failed)."""
        if not self.offers_logprobs():
            return None
        key = (model or "", hashlib.sha256(text.encode()).hexdigest())
        if (hit := self._scores.get(key)) is not None:
            self._scores.move_to_end(key)
            return hit
        vocab = await self._vocab(trace_id)
        body = {"prompt": text, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": TOP_K}
        if model:
            body["model"] = model
        try:
            r = await self._client().post(self.backend.url.rstrip("/") + "/completions", json=body,
                                          headers=self._headers(trace_id, "prune"))
        except httpx.HTTPError as exc:
            log.warning("backend %s: the scoring call failed (%s)", self.backend.name, type(exc).__name__)
            return None
        self._logprobs_checked = time.monotonic()
        scored = None
        if r.status_code == 200:
            try:
                choice = (r.json().get("choices") or [None])[0]
                logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
                scored = surprisal_from_echo(text, logprobs, vocab=vocab, top_k=TOP_K) if isinstance(logprobs, dict) else None
            except (ValueError, AttributeError):
                scored = None
            if scored is None and self.logprobs is not True:
                log.info("backend %s gives no prompt log-probabilities: context_prune uses the in-repo scorer", self.backend.name)
            self.logprobs = scored is not None if self.logprobs is not True else True
        elif r.status_code in (400, 404, 405, 422, 501) and self.logprobs is None:
            self.logprobs = False
        if scored is not None:
            self._scores[key] = scored
            while len(self._scores) > SCORE_CACHE:
                self._scores.popitem(last=False)
        return scored
