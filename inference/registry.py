"""One registry of strategy components: the built-in factor pack. Each factor of
:class:`Strategy` is owned by a component that checks it against the loaded model and
contributes to the serving plan. A variant's whole strategy (an ``OpenStrategy``, which is
a ``Strategy``) may also set gateway and declared factors; those are not the runtime's,
and the plan reads only the built-in ones.

A component returns the reasons it cannot serve a configuration (vLLM backend-registry
style); :func:`plan_for` raises :class:`StrategyNotServable` with every reason at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ablab.inference.prompts import TEMPLATES
from ablab.inference.runtime.executor import RuntimeConfig
from ablab.inference.scheduler import BatchingConfig
from ablab.platform.strategy import FACTOR_NAMES, Strategy

AUTO_ADAPTER = "auto"  # route by the request's domain hint
MAX_BATCH_SLOTS = 64
TRAINED_COT_DEPTH = 8


class StrategyNotServable(ValueError):
    def __init__(self, reasons: list[str]):
        super().__init__("strategy cannot be served: " + "; ".join(reasons))
        self.reasons = reasons


@dataclass(frozen=True)
class ServingContext:
    d_ff: int
    max_len: int
    adapters: frozenset[str]
    device: str = "cpu"
    has_predictor: bool = True


@dataclass
class ServingPlan:
    """Everything the worker needs to serve one strategy."""

    template: str = "plain"
    cot_depth: int = 0
    compression: tuple[str, float, int] = ("none", 0.18, 32)  # method, tau, window
    adapter: str | None = None  # a name, AUTO_ADAPTER, or None
    runtime: RuntimeConfig = RuntimeConfig()
    batching: BatchingConfig = BatchingConfig()
    validation_threshold: float | None = None
    components: list[str] = field(default_factory=list)

    @property
    def engine_key(self) -> tuple:
        return (self.runtime, self.batching)


class Component(Protocol):
    name: str
    fields: tuple[str, ...]

    def reasons(self, s: Strategy, ctx: ServingContext) -> list[str]: ...

    def apply(self, s: Strategy, plan: ServingPlan) -> None: ...


class PromptTemplate:
    name, fields = "prompt-template", ("prompt_template",)

    def reasons(self, s, ctx):
        return [] if s.prompt_template in TEMPLATES else [f"prompt_template={s.prompt_template!r}: known templates are {TEMPLATES}"]

    def apply(self, s, plan):
        plan.template = s.prompt_template


class EntropyCompression:
    name, fields = "entropy-pruning", ("compression.method", "compression.tau", "compression.window")

    def reasons(self, s, ctx):
        c = s.compression
        if c.method.value == "entropy" and c.window > ctx.max_len:
            return [f"compression.window={c.window}: longer than the model's context ({ctx.max_len})"]
        return []

    def apply(self, s, plan):
        c = s.compression
        plan.compression = (c.method.value, c.tau, c.window)


class LoRARouting:
    name, fields = "lora", ("lora_adapter",)

    def reasons(self, s, ctx):
        a = s.lora_adapter
        if a is None or a == AUTO_ADAPTER or a in ctx.adapters:
            return []
        return [f"lora_adapter={a!r}: no such adapter; shipped: {sorted(ctx.adapters)} or {AUTO_ADAPTER!r}"]

    def apply(self, s, plan):
        plan.adapter = s.lora_adapter


class SparseFFN:
    name, fields = "sparse-ffn", ("sparse_ffn_k",)

    def reasons(self, s, ctx):
        k = s.sparse_ffn_k
        out = []
        if k is not None and k > ctx.d_ff:
            out.append(f"sparse_ffn_k={k}: exceeds the model's d_ff={ctx.d_ff}")
        if k is not None and not ctx.has_predictor:
            out.append("sparse_ffn_k: the neuron predictor is not loaded")
        return out

    def apply(self, s, plan):
        plan.runtime = RuntimeConfig(plan.runtime.precision, s.sparse_ffn_k, plan.runtime.kv_shards)


class ShardedKV:
    name, fields = "sharded-kv", ("kv_shards",)

    def reasons(self, s, ctx):
        return [] if s.kv_shards <= ctx.max_len else [f"kv_shards={s.kv_shards}: more shards than cache positions ({ctx.max_len})"]

    def apply(self, s, plan):
        plan.runtime = RuntimeConfig(plan.runtime.precision, plan.runtime.sparse_ffn_k, s.kv_shards)


class PrecisionComponent:
    name, fields = "precision", ("precision",)

    def reasons(self, s, ctx):
        if s.precision.value == "int8" and ctx.device != "cpu":
            return [f"precision=int8: dynamic INT8 kernels are CPU-only, device is {ctx.device}"]
        return []

    def apply(self, s, plan):
        plan.runtime = RuntimeConfig(s.precision.value, plan.runtime.sparse_ffn_k, plan.runtime.kv_shards)


class BatchingComponent:
    name, fields = "batching", (
        "batching.policy", "batching.max_batch", "batching.window_ms", "batching.ttft_slo_ms", "batching.tpot_slo_ms", "batching.shed_late",
    )

    def reasons(self, s, ctx):
        b = s.batching
        return [] if b.max_batch <= MAX_BATCH_SLOTS else [f"batching.max_batch={b.max_batch}: above the {MAX_BATCH_SLOTS} KV slots an engine holds"]

    def apply(self, s, plan):
        b = s.batching
        plan.batching = BatchingConfig(
            b.policy.value, b.max_batch if b.policy.value != "none" else 1, b.window_ms,
            tpot_slo_ms=b.tpot_slo_ms, ttft_slo_ms=b.ttft_slo_ms, shed_late=b.shed_late,
        )


class ChainOfThought:
    """cot_depth = pause ("think") tokens appended to the prompt; the base is trained on 0..8."""

    name, fields = "cot-pause", ("cot_depth",)

    def reasons(self, s, ctx):
        return [] if s.cot_depth <= TRAINED_COT_DEPTH else [f"cot_depth={s.cot_depth}: the model is trained up to {TRAINED_COT_DEPTH}"]

    def apply(self, s, plan):
        plan.cot_depth = s.cot_depth


class PostValidation:
    name, fields = "post-validation", ("validation_threshold",)

    def reasons(self, s, ctx):
        return []

    def apply(self, s, plan):
        plan.validation_threshold = s.validation_threshold


REGISTRY: tuple[Component, ...] = (
    PromptTemplate(),
    EntropyCompression(),
    LoRARouting(),
    SparseFFN(),
    ShardedKV(),
    PrecisionComponent(),
    BatchingComponent(),
    ChainOfThought(),
    PostValidation(),
)


def handled_fields() -> set[str]:
    return {f for c in REGISTRY for f in c.fields}


def unhandled_factors() -> set[str]:
    return set(FACTOR_NAMES) - handled_fields()


def reasons_for(strategy: Strategy, ctx: ServingContext) -> list[str]:
    return [r for c in REGISTRY for r in c.reasons(strategy, ctx)]


def plan_for(strategy: Strategy, ctx: ServingContext) -> ServingPlan:
    reasons = reasons_for(strategy, ctx)
    if reasons:
        raise StrategyNotServable(reasons)
    plan = ServingPlan()
    for component in REGISTRY:
        component.apply(strategy, plan)
        plan.components.append(component.name)
    return plan
