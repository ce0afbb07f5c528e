"""The strategy object: which serving choices a variant makes.

A strategy names only factors the runtime implements (``ablab.inference`` registers a
component per factor). Unknown fields are rejected with their name, so a typo in an
experiment YAML never silently serves the default. ``content_hash`` is stable across
processes and Python versions: it hashes the canonical JSON of the fully-defaulted
object, so ``{}`` and an explicit all-defaults strategy hash the same. Fields added
after the schema's first release (``ADDED_FIELDS``) are left out of that JSON while at
their default, so adding them changed no stored strategy's hash.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

STRATEGY_SCHEMA_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompressionMethod(StrEnum):
    none = "none"
    entropy = "entropy"  # token-entropy pruning (DESIGN.md, prompt side)


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"  # dynamic INT8 quantization of linear layers


class BatchingPolicy(StrEnum):
    none = "none"  # one request at a time
    fixed = "fixed"  # fixed batch size, flush on window
    adaptive = "adaptive"  # batch size and window follow the live arrival rate


class PromptCompression(_Frozen):
    method: CompressionMethod = CompressionMethod.none
    tau: float = Field(default=0.18, ge=0.0, le=1.0, description="Entropy threshold below which tokens are pruned.")
    window: int = Field(default=32, ge=1, le=4096, description="Tokens per pruning window.")


class Batching(_Frozen):
    policy: BatchingPolicy = BatchingPolicy.none
    max_batch: int = Field(default=8, ge=1, le=1024)
    window_ms: float = Field(default=5.0, ge=0.0, le=10_000.0, description="Longest wait to fill a batch.")
    ttft_slo_ms: float | None = Field(
        default=None, gt=0.0, le=600_000.0, description="Adaptive only: admit requests that can still meet this TTFT first."
    )
    tpot_slo_ms: float | None = Field(
        default=None, gt=0.0, le=60_000.0, description="Adaptive only: size each step so running sequences keep this TPOT."
    )
    shed_late: bool = Field(
        default=False, description="Adaptive with a TTFT SLO: refuse (HTTP 503) requests that can no longer meet it."
    )

    @model_validator(mode="after")
    def _slo_needs_adaptive(self) -> "Batching":
        slo_set = [name for name in ("ttft_slo_ms", "tpot_slo_ms", "shed_late") if getattr(self, name) not in (None, False)]
        if slo_set and self.policy is not BatchingPolicy.adaptive:
            raise ValueError(f"batching.{slo_set[0]} is set but batching.policy is '{self.policy.value}'; SLOs steer the adaptive policy only")
        if self.shed_late and self.ttft_slo_ms is None:
            raise ValueError("batching.shed_late needs batching.ttft_slo_ms: shedding refuses requests past that SLO")
        return self


# (object, field) pairs added after schema version 1 was released: omitted from the
# canonical JSON while at their default, which keeps every earlier content_hash
ADDED_FIELDS: frozenset[tuple[str, str]] = frozenset({("batching", "ttft_slo_ms"), ("batching", "tpot_slo_ms"), ("batching", "shed_late")})


class Strategy(_Frozen):
    """Serving choices of one variant. Defaults describe the plain baseline."""

    schema_version: Literal[1] = STRATEGY_SCHEMA_VERSION
    prompt_template: str = Field(default="plain", min_length=1, max_length=64, pattern=r"^[a-z0-9_\-]+$")
    compression: PromptCompression = PromptCompression()
    lora_adapter: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9_\-]+$")
    sparse_ffn_k: int | None = Field(default=None, ge=1, le=65_536, description="Top-k FFN neurons per token; None = dense.")
    kv_shards: int = Field(default=1, ge=1, le=64, description="KV-cache chunks along the token axis.")
    batching: Batching = Batching()
    precision: Precision = Precision.fp32
    cot_depth: int = Field(default=0, ge=0, le=8, description="Chain-of-thought steps requested in the prompt.")
    validation_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Re-run when answer confidence falls below this."
    )

    @model_validator(mode="after")
    def _coherent(self) -> "Strategy":
        if self.batching.policy is BatchingPolicy.none and self.batching.max_batch != Batching().max_batch:
            raise ValueError("batching.max_batch is set but batching.policy is 'none'")
        return self

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        for obj, name in ADDED_FIELDS:
            if data[obj][name] == type(getattr(self, obj)).model_fields[name].default:
                del data[obj][name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def factors(self) -> dict[str, object]:
        """Flat factor → level map, for factorial attribution (``compression.tau`` style keys)."""
        flat: dict[str, object] = {}
        for key, value in self.model_dump(mode="json").items():
            if key == "schema_version":
                continue
            if isinstance(value, dict):
                flat.update({f"{key}.{sub}": v for sub, v in value.items()})
            else:
                flat[key] = value
        return flat


FACTOR_NAMES: tuple[str, ...] = tuple(Strategy().factors())
