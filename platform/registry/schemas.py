"""Request and response schemas of the registry (``ExperimentCreate/Update/Read/Page``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from ablab.platform import fields
from ablab.platform.assignment.targeting import MAX_ATTRIBUTE_NAME_CHARS, MAX_PATTERN_CHARS, Condition, Op
from ablab.platform.stats.custom_metric import CustomMetricModel
from ablab.platform.strategy import OpenStrategy

KEY_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,63}$"
MAX_RULES = 32  # targeting rules per experiment: each is evaluated on every assignment


class UnitType(StrEnum):
    user = "user"
    session = "session"
    request = "request"


class Status(StrEnum):
    draft = "draft"
    running = "running"
    paused = "paused"
    stopped = "stopped"


class Scope(StrEnum):
    admin = "admin"
    editor = "editor"
    viewer = "viewer"
    sdk = "sdk"


class _Strict(BaseModel):
    # NaN and infinity ("NaN" strings included) would be stored as null: a bound that
    # silently bounds nothing. Refuse them with the field named.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


MAX_SHADOW_CONCURRENCY = 1024
MAX_SHADOW_TIMEOUT_S = 600.0


class ShadowIn(_Strict):
    """Shadow traffic: for ``fraction`` of the requests (chosen by their trace id), the
    gateway and the SDK's instrumented client also send the caller's request rewritten by
    ``strategy`` and record what it did; its answer is never returned. At most
    ``max_concurrency`` run at once (more are dropped and counted, never queued), each within
    ``timeout_s``."""

    strategy: OpenStrategy = Field(default=OpenStrategy(), description="A whole strategy, as a variant's, applied "
                                   "to the caller's own request (not on top of the variant's).")
    fraction: Annotated[float, Strict()] = Field(ge=0, le=1, description="Share of the requests shadowed, in [0, 1].")
    max_concurrency: Annotated[int, Strict()] = Field(
        default=8, ge=1, le=MAX_SHADOW_CONCURRENCY, description="Shadows in flight at once; one more is dropped.")
    timeout_s: Annotated[float, Strict()] = Field(
        default=30.0, gt=0, le=MAX_SHADOW_TIMEOUT_S, description="Each shadow's whole time budget, in seconds.")

    def stored(self) -> dict[str, Any]:
        return {"strategy": self.strategy.model_dump(mode="json"), "fraction": self.fraction,
                "max_concurrency": self.max_concurrency, "timeout_s": self.timeout_s}


class ShadowOut(BaseModel):
    strategy: dict[str, Any]
    strategy_hash: str
    fraction: float
    max_concurrency: int
    timeout_s: float


def shadow_out(stored: dict[str, Any] | None) -> ShadowOut | None:
    if not stored:
        return None
    from ablab.platform.strategy import content_hash

    return ShadowOut(strategy=stored["strategy"], strategy_hash=content_hash(stored["strategy"]),
                     fraction=stored["fraction"], max_concurrency=stored["max_concurrency"], timeout_s=stored["timeout_s"])


class VariantIn(_Strict):
    key: str = Field(pattern=KEY_PATTERN)
    weight: float = Field(gt=0, le=1_000_000)
    strategy: OpenStrategy = OpenStrategy()
    shadow: ShadowIn | None = Field(default=None, description="This variant's own shadow (replaces the experiment's).")


class VariantOut(BaseModel):
    key: str
    weight: float
    strategy: dict[str, Any]
    strategy_hash: str
    paused: bool = False
    paused_reason: str | None = None
    shadow: ShadowOut | None = None


class TargetingRule(_Strict):
    attribute: str = Field(min_length=1, max_length=MAX_ATTRIBUTE_NAME_CHARS)
    op: Op
    value: Any = Field(description=f"A regex is RE2 syntax (linear time; no backreferences or lookaround), "
                                   f"at most {MAX_PATTERN_CHARS} characters.")

    @field_validator("value")
    @classmethod
    def _valid(cls, value: Any, info: ValidationInfo) -> Any:
        attribute, op = info.data.get("attribute"), info.data.get("op")
        if attribute is None or op is None:
            return value  # already refused on its own field
        try:
            Condition(attribute, op, value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"invalid {op.value} rule on '{attribute}': {exc}") from exc
        return value


def _engine_check(metrics: Metrics | None, guardrails: list[dict[str, Any]] | None = None) -> None:
    """Validate with the stats engine's own parser (one set of rules for the API, the CLI and
    analysis), so an experiment the registry accepts can always be analyzed. Custom metrics
    go as the models already validated, not re-parsed."""
    from ablab.platform.stats.spec import SpecError, parse_spec

    data: dict[str, Any] = {"key": "check", "variants": [{"key": "a"}, {"key": "b"}]}
    if metrics is not None:
        given = {k: v for k, v in metrics.model_dump(exclude={"custom"}).items() if v is not None}
        mde = given.pop("mde", None)
        data["metrics"] = {**given, "custom": metrics.custom}
        if mde:
            data["analysis"] = {"mde": mde}
    if guardrails:
        data["guardrails"] = guardrails
    try:
        parse_spec(data)
    except SpecError as exc:  # the API keeps the MDE with the metrics
        raise ValueError(str(exc).replace("analysis.mde", "metrics.mde")) from None


class Guardrail(_Strict):
    """Same shape the stats engine reads (``ablab.platform.stats.spec``)."""

    metric: str
    max: float | None = Field(default=None, description="SLA ceiling on the variant's value (e.g. p95 TTFT ms).")
    min: float | None = Field(default=None, description="SLA floor (e.g. accuracy).")
    margin: float | None = Field(default=None, ge=0, description="Non-inferiority margin against control.")
    relative: bool = Field(default=False, description="Margin is relative to control's value.")
    pause: bool = Field(default=True, description="A breach pauses the variant automatically.")

    @model_validator(mode="after")
    def _something(self) -> Guardrail:
        if self.max is None and self.min is None and self.margin is None:
            raise ValueError("a guardrail needs max, min (SLA) or margin (non-inferiority)")
        return self


class Metrics(_Strict):
    """What to report and decide on; SLOs define goodput; metrics and segments the team defines.

    ``custom`` entries have the shape of docs/contracts.md ("Analysis output"), e.g.
    ``{name: judge_score, type: mean, column: score}``; ``segments`` names ``dims.<name>``;
    ``mde`` the relative minimum detectable effect per metric for the power estimate.
    """

    primary: list[str] = Field(default_factory=lambda: [fields.HEADLINE_LATENCY], min_length=1)
    report: list[str] | None = Field(default=None, description="Metrics to report; all by default.")
    slos: dict[str, float] = Field(default_factory=dict, description=f"metric → max, e.g. {{{fields.SLA_LATENCY}: 500}}.")
    custom: list[CustomMetricModel] = Field(default_factory=list, max_length=32,
                                         description="Experiment-defined metrics (mean, proportion, ratio, quantile).")
    segments: list[str] = Field(default_factory=list, max_length=5, description="Breakdowns, e.g. ['dims.domain'].")
    mde: dict[str, float] = Field(default_factory=dict, description="metric → relative MDE for power (default 0.05).")

    @field_validator("custom", mode="before")
    @classmethod
    def _custom(cls, raw: Any) -> list[CustomMetricModel]:
        """One model per type (ablab.platform.stats.custom_metric, the spec's own), with the
        spec's messages: each names its field (``metrics.custom[2].column: …``)."""
        from ablab.platform.stats.spec import validate_custom

        return list(validate_custom(raw))

    @field_serializer("custom")
    def _stored(self, custom: list[CustomMetricModel]) -> list[dict[str, Any]]:
        return [m.stored() for m in custom]  # as written: defaults stay implicit

    @model_validator(mode="after")
    def _analyzable(self) -> Metrics:
        _engine_check(self)
        return self

    @field_validator("slos")
    @classmethod
    def _slos(cls, slos: dict[str, float]) -> dict[str, float]:
        from ablab.platform.stats.metrics import SLO_METRICS

        for name, bound in slos.items():
            if name not in SLO_METRICS:
                raise ValueError(f"SLOs may bound {', '.join(SLO_METRICS)}, not {name!r}")
            if bound <= 0:
                raise ValueError(f"SLO for {name} must be positive")
        return slos


def _check_variants(variants: list[VariantIn], control: str | None) -> None:
    keys = [v.key for v in variants]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"variant keys must be unique; repeated: {', '.join(duplicates)}")
    if control is not None and control not in keys:
        raise ValueError(f"control '{control}' is not one of the variants ({', '.join(keys)})")


class ExperimentCreate(_Strict):
    key: str = Field(pattern=KEY_PATTERN)
    name: str = Field(min_length=1, max_length=200)
    hypothesis: str = Field(default="", max_length=10_000)
    owner: str = Field(default="", max_length=200)
    unit: UnitType = UnitType.user
    layer: str | None = Field(default=None, pattern=KEY_PATTERN)
    layer_share: float | None = Field(default=None, gt=0, le=1, description="Share of the layer's buckets.")
    holdout: str | None = Field(default=None, pattern=KEY_PATTERN)
    traffic: float = Field(ge=0, le=1)
    control: str = Field(pattern=KEY_PATTERN)
    variants: list[VariantIn] = Field(min_length=2, max_length=64)
    metrics: Metrics = Field(default_factory=Metrics)
    guardrails: list[Guardrail] = Field(default_factory=list)
    targeting: list[TargetingRule] = Field(default_factory=list, max_length=MAX_RULES)
    forced: dict[str, str] = Field(default_factory=dict, description="unit id → variant key, for test units.")
    shadow: ShadowIn | None = Field(default=None, description="Shadow traffic for every variant (one may set its own).")

    @model_validator(mode="after")
    def _coherent(self) -> ExperimentCreate:
        _check_variants(self.variants, self.control)
        if self.guardrails:  # a guardrail may name a custom metric: check them together
            _engine_check(self.metrics, [g.model_dump(exclude_none=True) for g in self.guardrails])
        keys = {v.key for v in self.variants}
        for unit, variant in self.forced.items():
            if variant not in keys:
                raise ValueError(f"forced unit '{unit}' names unknown variant '{variant}'")
        if self.layer_share is not None and self.layer is None:
            raise ValueError("layer_share needs a layer")
        return self


class ExperimentUpdate(_Strict):
    """Every field optional; weights or variants may change only with ``new_phase: true``."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    hypothesis: str | None = Field(default=None, max_length=10_000)
    owner: str | None = Field(default=None, max_length=200)
    traffic: float | None = Field(default=None, ge=0, le=1)
    control: str | None = Field(default=None, pattern=KEY_PATTERN)
    variants: list[VariantIn] | None = Field(default=None, min_length=2, max_length=64)
    metrics: Metrics | None = None
    guardrails: list[Guardrail] | None = None
    targeting: list[TargetingRule] | None = Field(default=None, max_length=MAX_RULES)
    forced: dict[str, str] | None = None
    shadow: ShadowIn | None = Field(default=None, description="null removes the experiment's shadow.")
    new_phase: bool = Field(default=False, description="Reshuffle units: required to change weights or variants.")

    @field_validator("variants")
    @classmethod
    def _unique(cls, variants: list[VariantIn] | None) -> list[VariantIn] | None:
        if variants is not None:
            _check_variants(variants, None)
        return variants


class ExperimentRead(BaseModel):
    key: str
    name: str
    hypothesis: str
    owner: str
    unit: UnitType
    status: Status
    traffic: float
    control: str
    phase: int
    layer: str | None
    layer_range: tuple[int, int] | None
    holdout: str | None
    variants: list[VariantOut]
    metrics: dict[str, Any]
    guardrails: list[dict[str, Any]]
    targeting: list[dict[str, Any]]
    forced: dict[str, str]
    shadow: ShadowOut | None = None
    version: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    stopped_at: datetime | None
    archived_at: datetime | None = None


class ExperimentPage(BaseModel):
    items: list[ExperimentRead]
    total: int


class LayerCreate(_Strict):
    key: str = Field(pattern=KEY_PATTERN)
    name: str = Field(default="", max_length=200)


class LayerRead(BaseModel):
    key: str
    name: str
    allocated: list[dict[str, Any]] = Field(description="Bucket ranges held by experiments.")
    free_share: float


class HoldoutCreate(_Strict):
    key: str = Field(pattern=KEY_PATTERN)
    name: str = Field(default="", max_length=200)
    fraction: float = Field(gt=0, lt=1)


class HoldoutRead(BaseModel):
    key: str
    name: str
    fraction: float


class AuditRead(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    entity_type: str
    entity_key: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class ApiKeyCreate(_Strict):
    name: str = Field(min_length=1, max_length=200, description="Unique among active keys.")
    scope: Scope
    expires_at: AwareDatetime | None = Field(default=None, description="Refused from this moment on; must be in the future.")


class ApiKeyRead(BaseModel):
    """A key as admins see it: never the token or its hash."""

    id: int
    name: str
    prefix: str
    scope: Scope
    status: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class ApiKeyPage(BaseModel):
    items: list[ApiKeyRead]
    total: int


class ApiKeyCreated(BaseModel):
    id: int
    name: str
    scope: Scope
    prefix: str
    expires_at: datetime | None = None
    token: str = Field(description="Shown once; only its hash is stored.")
