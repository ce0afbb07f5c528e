"""Each backend kind's quirks in one small class (as Envoy AI Gateway and LiteLLM keep them).

- ``openai``: sends the usage chunk (``choices: []``) when asked with ``stream_options``.
- ``vllm``: the same, plus per-request server metrics (``--enable-per-request-metrics``) in
  a ``metrics`` object on the final usage chunk or the response body.
- ``llamacpp``: ``llama_cpp.server`` ignores ``stream_options`` (no usage in streams, so
  stream tokens are counted and marked estimated); non-streaming responses carry usage.
"""

from __future__ import annotations

from typing import Any


class Translator:
    kind = "openai"
    streams_usage = True

    def upstream_body(self, body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
        """Ask for the usage chunk on streams (the caller's other stream options are kept)."""
        if stream:
            opts = body.get("stream_options")
            opts = dict(opts) if isinstance(opts, dict) else {}
            if opts.get("include_usage") is not True:
                opts["include_usage"] = True
                body["stream_options"] = opts
        return body

    def usage_tokens(self, usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
        if not usage:
            return None, None
        prompt, out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return (prompt if _count(prompt) else None), (out if _count(out) else None)

    def server_metrics(self, obj: dict[str, Any]) -> dict[str, float]:
        return {}


class VllmTranslator(Translator):
    kind = "vllm"

    def server_metrics(self, obj: dict[str, Any]) -> dict[str, float]:
        metrics = obj.get("metrics")
        if not isinstance(metrics, dict):
            return {}
        return {f"server_{k}": float(v) for k, v in metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12}


class LlamaCppTranslator(Translator):
    kind = "llamacpp"
    streams_usage = False


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10_000_000


TRANSLATORS: dict[str, Translator] = {t.kind: t for t in (Translator(), VllmTranslator(), LlamaCppTranslator())}


def translator_for(kind: str) -> Translator:
    return TRANSLATORS[kind]
