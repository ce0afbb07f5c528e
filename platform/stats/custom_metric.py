"""An experiment-defined metric (``metrics.custom[i]``), one closed model per ``type``.

The registry validates request bodies with these models and the spec reads the same
objects (:func:`ablab.platform.stats.spec.validate_custom`), so an experiment the API
accepts is one the engine can analyze, by one set of rules. ``type`` discriminates: a
``ratio`` has no ``column``, a ``mean`` no ``quantile``; every other key is refused.
Shapes and defaults: docs/contracts.md ("Analysis output").

These models are also the engine's runtime definition (:data:`CustomMetric`): every type
answers ``kind``, ``column``, ``numerator``, ``denominator``, ``scale``, ``quantile``,
``covariate`` (the CUPED covariate's name or None) and ``sources``, so the engine reads any
custom metric the same way. ``lower_is_better`` is resolved at validation (an absent one
from ``direction``, else from the source's nature); :meth:`CustomMetricBase.stored` still
gives the JSON as its author wrote it, defaults left out.
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


_DIRECTION_DEFAULT = ("Default: lower for " + ", ".join(sorted(LOWER_IS_BETTER_SOURCES))
                      + "; higher for everything else. Resolved at validation when absent.")


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
    lower_is_better: StrictBool | None = Field(default=None, description=_DIRECTION_DEFAULT)
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

    @model_validator(mode="after")
    def _resolve_direction(self) -> CustomMetricBase:
        # The engine, the policy objective and the results all read ``lower_is_better`` as a
        # bool; resolving it once here keeps one answer. Set past ``frozen`` and outside
        # ``model_fields_set``, so :meth:`stored` still writes what the author wrote.
        if self.lower_is_better is None:
            lower = self.direction == "lower" if self.direction is not None else self.natural_source in LOWER_IS_BETTER_SOURCES
            object.__setattr__(self, "lower_is_better", lower)
        return self

    @property
    def prefers_lower(self) -> bool:
        """The resolved direction, typed as the bool it is after validation."""
        return bool(self.lower_is_better)

    @property
    def covariate(self) -> str | None:
        """The CUPED covariate: ``pre_period``, a source's name, or None (no adjustment)."""
        cuped: CupedCovariate | None = getattr(self, "cuped", None)
        return cuped.covariate if cuped is not None else None

    @property
    def sources(self) -> tuple[str, ...]:
        """The per-request sources this metric reads (a named covariate included)."""
        # the subclasses (and their mixins) answer every one of these names
        roles = ("numerator", "denominator") if self.type == "ratio" else ("column",)
        own = tuple(getattr(self, role) for role in roles)
        extra = (self.covariate,) if self.covariate not in (None, "pre_period") else ()
        return tuple(s for s in (*own, *extra) if s)

    def stored(self) -> dict[str, Any]:
        """The JSON as its author wrote it (defaults left out), as the registry stores it."""
        return self.model_dump(mode="json", exclude_unset=True)


# What a type does not have reads as the engine's neutral value, so code that handles every
# custom metric needs no per-type branches (mixins, not base-class properties: a field may
# not shadow a parent's attribute).
class _NoColumn:
    @property
    def column(self) -> None:
        return None


class _NotRatio:
    @property
    def numerator(self) -> None:
        return None

    @property
    def denominator(self) -> None:
        return None

    @property
    def scale(self) -> float:
        return 1.0


class _NotQuantile:
    @property
    def quantile(self) -> None:
        return None


def _request_only(what: str, value: str) -> str:
    if value != "request":
        raise ValueError(f"{what}; only 'request' applies")
    return value


class MeanMetric(CustomMetricBase, _NotRatio, _NotQuantile):
    """Mean of ``column`` over requests, or of each unit's mean or total (``aggregation``)."""

    type: Literal["mean"]
    column: Source
    cuped: CupedCovariate | None = None

    @property
    def natural_source(self) -> str:
        return self.column


class ProportionMetric(CustomMetricBase, _NotRatio, _NotQuantile):
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


class RatioMetric(CustomMetricBase, _NoColumn, _NotQuantile):
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


class QuantileMetric(CustomMetricBase, _NotRatio):
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

CustomMetric = MeanMetric | ProportionMetric | RatioMetric | QuantileMetric
"""The engine's runtime definition of an experiment-defined metric: one of the models."""
CUSTOM_METRIC_TYPES = (MeanMetric, ProportionMetric, RatioMetric, QuantileMetric)
CUSTOM_METRIC: TypeAdapter[CustomMetric] = TypeAdapter(CustomMetricModel)


def custom_columns(m: CustomMetric) -> dict[str, str]:
    """Per-unit column names for ``m``: role → column.

    ``x``/``y``: numerator/denominator sums of the unit (``request``: Σ value and the count of
    requests with a value; ``unit_mean``/``unit_sum``: the same sums, the engine divides or
    not); ``sq``: Σ value² over the unit's requests (a quantile's design effect);
    ``pre_x``/``pre_y``: the same sums over the pre-period (CUPED ``pre_period``);
    ``cov_x``/``cov_y``: in-period sums of the named covariate (CUPED ``covariate``).
    """
    base = f"c__{m.name}"
    out = {"x": f"{base}__x", "y": f"{base}__y"}
    if m.kind == "quantile":
        out["sq"] = f"{base}__sq"
    if m.covariate == "pre_period":
        out.update(pre_x=f"pre__{base}__x", pre_y=f"pre__{base}__y")
    elif m.covariate:
        out.update(cov_x=f"{base}__cov_x", cov_y=f"{base}__cov_y")
    return out

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
