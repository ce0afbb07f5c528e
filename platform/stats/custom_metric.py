"""An experiment-defined metric (``metrics.custom[i]``), one closed model per ``type``.

The registry validates request bodies with these models and the spec reads the same
objects (:func:`ablab.platform.stats.spec.validate_custom`), so an experiment the API
accepts is one the engine can analyze, by one set of rules. ``type`` discriminates: a
``ratio`` has no ``column``, a ``mean`` no ``quantile``; every other key is refused.
Shapes and defaults: docs/contracts.md ("Analysis output").

A model keeps what its author wrote (``lower_is_better``/``direction`` may both be
absent); :attr:`CustomMetricBase.prefers_lower` resolves the direction, and
:meth:`CustomMetricBase.definition` gives the engine's runtime definition
(:class:`.metrics.CustomMetric`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .metrics import (
    ERROR_SOURCE,
    INFERENCE_SOURCES,
    LABEL_SOURCES,
    LOWER_IS_BETTER_SOURCES,
    MEASURE_PREFIX,
    CustomMetric,
)

Kind = Literal["mean", "proportion", "ratio", "quantile"]
Aggregation = Literal["request", "unit_mean", "unit_sum"]
KINDS: tuple[str, ...] = ("mean", "proportion", "ratio", "quantile")
AGGREGATIONS: tuple[str, ...] = ("request", "unit_mean", "unit_sum")

# Sources (the metric catalogue's, from the field catalogue): every measured field of an
# inference event, a custom measure, the trace's label (score/correct) and the error flag.
# The default direction is the catalogue's too (LOWER_IS_BETTER_SOURCES).
EXTRA_SOURCES: tuple[str, ...] = (*LABEL_SOURCES, ERROR_SOURCE)
KNOWN_SOURCES: tuple[str, ...] = (*INFERENCE_SOURCES, f"{MEASURE_PREFIX}<name>", *EXTRA_SOURCES)
BINARY_SOURCES = frozenset({ERROR_SOURCE, "correct"})  # a proportion also takes measures.* and score
MAX_NAME = 64
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def snake_name(value: object, max_len: int = MAX_NAME) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > max_len:
        raise ValueError(f"{value!r} is not a snake_case name of at most {max_len} characters")
    return value


def check_source(value: object) -> str:
    if isinstance(value, str):
        if value in INFERENCE_SOURCES or value in EXTRA_SOURCES:
            return value
        if value.startswith(MEASURE_PREFIX):
            snake_name(value.removeprefix(MEASURE_PREFIX))
            return value
    raise ValueError(f"unknown source {value!r}; known: {', '.join(KNOWN_SOURCES)}")


def _covariate(value: object) -> str:
    return "pre_period" if value == "pre_period" else check_source(value)


Source = Annotated[str, BeforeValidator(check_source)]
Covariate = Annotated[str, BeforeValidator(_covariate)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CupedCovariate(_Closed):
    """``{covariate: pre_period | <source>}``: the same metric before the experiment's
    ``start``, or another source measured in the period (unaffected by the treatment)."""

    covariate: Covariate

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValueError(f"expected {{covariate: pre_period | <source>}}, got {data!r}")
        return data


class CustomMetricBase(_Closed):
    """The fields every type shares."""

    name: str = Field(description="snake_case, at most 64 characters; not a built-in metric's name.")
    type: Kind
    aggregation: Aggregation = Field(default="request", description="request | unit_mean | unit_sum.")
    lower_is_better: StrictBool | None = Field(default=None, description="Default: lower for latencies, "
                                               "device_s, cost_usd and error, higher for everything else.")
    direction: Literal["lower", "higher"] | None = Field(default=None, description="lower | higher: the same, in words.")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        return snake_name(value)

    @field_validator("direction")
    @classmethod
    def _one_direction(cls, value: str | None, info: ValidationInfo) -> str | None:
        said = info.data.get("lower_is_better")
        if value is not None and said is not None and said != (value == "lower"):
            raise ValueError("contradicts lower_is_better; give one of them")
        return value

    @property
    def kind(self) -> Kind:
        return self.type

    @property
    def natural_source(self) -> str:
        """The source whose nature sets the default direction."""
        raise NotImplementedError

    @property
    def prefers_lower(self) -> bool:
        if self.lower_is_better is not None:
            return self.lower_is_better
        if self.direction is not None:
            return self.direction == "lower"
        return self.natural_source in LOWER_IS_BETTER_SOURCES

    def definition(self) -> CustomMetric:
        """The engine's runtime definition of this metric."""
        cuped: CupedCovariate | None = getattr(self, "cuped", None)
        return CustomMetric(
            name=self.name, kind=self.type, column=getattr(self, "column", None),
            numerator=getattr(self, "numerator", None), denominator=getattr(self, "denominator", None),
            aggregation=self.aggregation, scale=float(getattr(self, "scale", 1.0)),
            quantile=getattr(self, "quantile", None), lower_is_better=self.prefers_lower,
            cuped=cuped.covariate if cuped is not None else None,
        )

    def stored(self) -> dict[str, Any]:
        """The JSON as its author wrote it (defaults left out), as the registry stores it."""
        return self.model_dump(mode="json", exclude_unset=True)


def _request_only(what: str, value: str) -> str:
    if value != "request":
        raise ValueError(f"{what}; only 'request' applies")
    return value


class MeanMetric(CustomMetricBase):
    """Mean of ``column`` over requests, or of each unit's mean or total (``aggregation``)."""

    type: Literal["mean"]
    column: Source
    cuped: CupedCovariate | None = None

    @property
    def natural_source(self) -> str:
        return self.column


class ProportionMetric(CustomMetricBase):
    """Share of requests where a 0/1 ``column`` is 1."""

    type: Literal["proportion"]
    column: Source
    cuped: CupedCovariate | None = None

    @field_validator("column")
    @classmethod
    def _binary(cls, value: str) -> str:
        if value not in BINARY_SOURCES and not value.startswith(MEASURE_PREFIX) and value != "score":
            raise ValueError(f"a proportion needs a 0/1 source (error, correct, score, measures.*), got {value!r}")
        return value

    @property
    def natural_source(self) -> str:
        return self.column


class RatioMetric(CustomMetricBase):
    """Σ numerator / Σ denominator over requests (delta method), times ``scale``."""

    type: Literal["ratio"]
    numerator: Source
    denominator: Source
    scale: float = Field(default=1.0, description="A finite factor > 0, e.g. 1000 for per-1k.")
    cuped: CupedCovariate | None = None

    @field_validator("aggregation")
    @classmethod
    def _request(cls, value: str) -> str:
        return _request_only("a ratio is Σ numerator / Σ denominator", value)

    @field_validator("scale")
    @classmethod
    def _scale(cls, value: float) -> float:
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"must be a finite number > 0, got {value}")
        return value

    @property
    def natural_source(self) -> str:
        return self.numerator


class QuantileMetric(CustomMetricBase):
    """The ``quantile`` of ``column`` over requests (no CUPED: it adjusts means)."""

    type: Literal["quantile"]
    column: Source
    quantile: float

    @field_validator("aggregation")
    @classmethod
    def _request(cls, value: str) -> str:
        return _request_only("a quantile is over requests", value)

    @field_validator("quantile")
    @classmethod
    def _open_unit(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError(f"must be in (0, 1), got {value}")
        return value

    @property
    def natural_source(self) -> str:
        return self.column


CustomMetricModel = Annotated[
    MeanMetric | ProportionMetric | RatioMetric | QuantileMetric, Field(discriminator="type")
]
"""One experiment-defined metric, by its ``type``."""

CUSTOM_METRIC_TYPES = (MeanMetric, ProportionMetric, RatioMetric, QuantileMetric)
CUSTOM_METRIC: TypeAdapter[MeanMetric | ProportionMetric | RatioMetric | QuantileMetric] = TypeAdapter(CustomMetricModel)

# A key that belongs to another type: what to say instead of "unknown field".
_ELSEWHERE = {
    "column": "a ratio takes numerator and denominator, not column",
    "numerator": "only a ratio takes numerator; use column",
    "denominator": "only a ratio takes denominator; use column",
    "scale": "only a ratio takes a scale",
    "quantile": "only type quantile takes a quantile",
    "cuped": "CUPED adjusts means and ratios, not quantiles",
}
_ALL_FIELDS = sorted({*CustomMetricBase.model_fields, "column", "numerator", "denominator", "scale", "quantile", "cuped"})


def error_text(exc: ValidationError, where: str) -> str:
    """The first error of ``exc`` as ``<where>.<field>: <what is wrong>``."""
    e = exc.errors()[0]
    loc = [str(p) for p in e["loc"]]
    if loc and loc[0] in KINDS:  # the discriminated union's tag
        loc = loc[1:]
    kind = e["type"]
    if kind == "union_tag_not_found":
        loc, message = ["type"], "required"
    elif kind == "union_tag_invalid":
        got = (e.get("ctx") or {}).get("tag")
        loc, message = ["type"], f"must be one of {', '.join(KINDS)}, got {got!r}"
    elif kind == "missing":
        message = "required"
    elif kind == "extra_forbidden":
        field = loc[-1] if loc else ""
        elsewhere = _ELSEWHERE.get(field) if len(loc) == 1 else None
        message = elsewhere or f"unknown field; known: {', '.join(_ALL_FIELDS)}"
    elif kind == "literal_error" and loc == ["aggregation"]:
        message = f"must be one of {', '.join(AGGREGATIONS)}, got {e['input']!r}"
    elif kind == "value_error":
        message = str((e.get("ctx") or {}).get("error", e["msg"]))
    elif kind == "bool_type":
        message = f"expected true or false, got {e['input']!r}"
    else:
        message = e["msg"]
    path = ".".join(loc)
    return f"{where}.{path}: {message}" if path else f"{where}: {message}"
