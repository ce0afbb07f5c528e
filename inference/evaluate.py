"""Held-out accuracy of a bundle under a runtime configuration (used by ``ablab train``,
the accuracy test and the benchmarks)."""

from __future__ import annotations

from ablab.inference import tasks
from ablab.inference.assets import Bundle
from ablab.inference.engine import Engine, GenRequest
from ablab.inference.runtime.executor import Executor, RuntimeConfig
from ablab.inference.scheduler import BatchingConfig


def accuracy(
    bundle: Bundle,
    *,
    domain: str,
    adapter: str | None = None,
    runtime: RuntimeConfig | None = None,
    n: int = 200,
    template: str = "plain",
    cot_depth: int = 0,
    device: str = "cpu",
    batch: int = 16,
    executor: Executor | None = None,
) -> float:
    """Exact-match accuracy on `n` held-out examples of `domain` (greedy decoding)."""
    ex = executor or Executor(bundle.model, runtime=runtime or RuntimeConfig(), predictors=bundle.predictors, adapters=bundle.adapters, device=device)
    eng = Engine(ex, batching=BatchingConfig("adaptive", max_batch=batch, window_ms=0), eos_id=bundle.tokenizer.eos_id, slots=batch)
    row = ex.adapter_row(adapter)
    examples = tasks.heldout_set(domain, n)
    reqs = [
        eng.submit(GenRequest(prompt_ids=bundle.tokenizer.encode(tasks.render(e, template=template, cot_depth=cot_depth)), adapter=row, max_new_tokens=8))
        for e in examples
    ]
    while not all(r.done.is_set() for r in reqs):
        eng.step(block=False)
    correct = sum(tasks.grade(e, bundle.tokenizer.decode(r.tokens)) for e, r in zip(examples, reqs))
    return correct / len(examples)


def accuracy_report(bundle: Bundle, *, n: int = 200) -> dict:
    """Per domain: base accuracy, and for adapter domains the adapter's accuracy."""
    out: dict[str, dict[str, float]] = {}
    by_domain = bundle.adapter_domains
    for domain in tasks.DOMAINS:
        row = {"base": accuracy(bundle, domain=domain, n=n)}
        if domain in by_domain:
            row["adapter"] = accuracy(bundle, domain=domain, adapter=by_domain[domain], n=n)
        out[domain] = row
    return out
