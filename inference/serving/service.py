"""The inference service: turns (prompt, domain, serving plan) into an answer with its
measurements. It owns one engine per runtime configuration (precision, sparse-FFN k,
KV shards, batching), built lazily, each with every shipped adapter loaded so one
batch can mix adapters.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ablab.inference import prompts
from ablab.inference.assets import Bundle
from ablab.inference.engine import Engine, GenRequest
from ablab.inference.registry import AUTO_ADAPTER, ServingContext, ServingPlan
from ablab.inference.runtime.executor import Executor, RuntimeConfig
from ablab.inference.tasks import PAUSE


@dataclass
class Served:
    output: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    e2e_s: float
    device_s: float
    confidence: float
    revalidated: bool
    adapter: str | None
    compression_ratio: float  # kept prompt tokens / original prompt tokens
    error: str | None = None
    overloaded: bool = False  # refused by load shedding (batching.shed_late)

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class InferenceService:
    def __init__(self, bundle: Bundle, *, device: str = "cpu", max_new_tokens: int = 8, start_engines: bool = True):
        self.bundle = bundle
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.start_engines = start_engines
        self._engines: dict[tuple, Engine] = {}
        self._lock = threading.Lock()
        self._scorer = bundle.model.to(device).eval()  # fp32 base for entropy scores
        cfg = bundle.model.cfg
        self.context = ServingContext(
            d_ff=cfg.d_ff, max_len=cfg.max_len, adapters=frozenset(bundle.adapters), device=torch.device(device).type
        )

    @property
    def device_kind(self) -> str:
        return torch.device(self.device).type

    def engine(self, plan: ServingPlan) -> Engine:
        key = plan.engine_key
        with self._lock:
            eng = self._engines.get(key)
            if eng is None:
                ex = Executor(
                    self.bundle.model,
                    runtime=plan.runtime,
                    predictors=self.bundle.predictors,
                    adapters=self.bundle.adapters,
                    device=self.device,
                )
                eng = Engine(ex, batching=plan.batching, eos_id=self.bundle.tokenizer.eos_id, slots=max(plan.batching.max_batch, 8))
                if self.start_engines:
                    eng.start()
                self._engines[key] = eng
            return eng

    def close(self) -> None:
        with self._lock:
            for eng in self._engines.values():
                eng.stop()
            self._engines.clear()

    def resolve_adapter(self, plan: ServingPlan, domain: str | None) -> str | None:
        if plan.adapter == AUTO_ADAPTER:
            return self.bundle.adapter_domains.get(domain or "")
        return plan.adapter

    # ------------------------------------------------------------------ prompt side
    def prompt_ids(self, text: str, *, domain: str, plan: ServingPlan) -> tuple[list[int], int, float]:
        """Token ids after template, CoT pauses and compression; also the uncompressed length."""
        tok = self.bundle.tokenizer
        body = prompts.apply_template(text, domain=domain, template=plan.template)
        ids = tok.encode(body)
        full = len(ids) + plan.cot_depth
        method, tau, window = plan.compression
        if method == "entropy" and len(ids) > 2:
            ids = prompts.prune_by_entropy(ids, self.surprisal(ids), tau=tau, window=window)
        kept = len(ids) + plan.cot_depth
        ids = ids + tok.encode(PAUSE * plan.cot_depth, bos=False)
        return ids, full, kept / full

    @torch.inference_mode()
    def surprisal(self, ids: list[int]) -> list[float]:
        """−log p(token | prefix) / log V per token (BOS gets 1.0: never pruned for being predictable)."""
        x = torch.tensor([ids], device=self.device)
        logp = torch.log_softmax(self._scorer(x)[0, :-1].float(), dim=-1)
        s = -logp.gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1) / math.log(logp.shape[-1])
        return [1.0, *s.clamp(0, 1).tolist()]

    # ------------------------------------------------------------------ serving
    def serve(
        self, *, text: str, domain: str, plan: ServingPlan, started: float | None = None, max_new_tokens: int | None = None,
        on_submit: Callable[[GenRequest], None] | None = None,
    ) -> Served:
        """Serve one request under `plan`; `started` is the request's perf_counter start;
        `on_submit` sees the first generation queued (its ``tokens`` grow as it decodes)."""
        t0 = started if started is not None else time.perf_counter()
        adapter = self.resolve_adapter(plan, domain)
        n_new = max_new_tokens or self.max_new_tokens
        try:
            t_prep = time.perf_counter()
            ids, full_len, ratio = self.prompt_ids(text, domain=domain, plan=plan)
            prep_s = time.perf_counter() - t_prep if plan.compression[0] == "entropy" else 0.0
            eng = self.engine(plan)
            req = eng.generate(ids, adapter=eng.executor.adapter_row(adapter), max_new_tokens=n_new, on_submit=on_submit)
        except (ValueError, KeyError) as exc:
            now = time.perf_counter()
            return Served("", 0, 0, now - t0, now - t0, 0.0, 0.0, False, adapter, 1.0, error=f"bad_request: {exc}"[:256])
        first_at = req.first_token_at or time.perf_counter()
        device_s = req.device_s + prep_s
        conf = prompts.confidence(req.logprobs)
        revalidated = False
        final = req
        if plan.validation_threshold is not None and conf < plan.validation_threshold and not req.error:
            # re-run on the exact configuration: dense FFN, fp32, one KV shard, uncompressed prompt
            exact = ServingPlan(
                template=plan.template, cot_depth=plan.cot_depth, adapter=plan.adapter,
                runtime=RuntimeConfig(), batching=plan.batching,
            )
            ids2, _, _ = self.prompt_ids(text, domain=domain, plan=exact)
            eng2 = self.engine(exact)
            again = eng2.generate(ids2, adapter=eng2.executor.adapter_row(adapter), max_new_tokens=n_new)
            device_s += again.device_s
            conf2 = prompts.confidence(again.logprobs)
            revalidated = True
            if conf2 >= conf:
                final, conf = again, conf2
        end = time.perf_counter()
        return Served(
            output=self.bundle.tokenizer.decode(final.tokens),
            prompt_tokens=len(ids),
            output_tokens=len(final.tokens),
            ttft_s=first_at - t0,
            e2e_s=end - t0,
            device_s=device_s,
            confidence=conf,
            revalidated=revalidated,
            adapter=adapter,
            compression_ratio=ratio,
            error=final.error[:256] if final.error else None,
            overloaded=final.shed,
        )
