"""Request and response schemas of declared factors (``FactorCreate/Update/Read/Page``)."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ablab.platform.registry.factors.catalog import FactorDef, definition_problems
from ablab.platform.strategy import DECLARED_NAME, PARAM_KEY, RESERVED_PARAMS, reserved_name

FACTOR_NAME = rf"{DECLARED_NAME}|^params\.{PARAM_KEY.removeprefix('^')}"
Scalar = bool | int | float | str


class FactorUpdate(BaseModel):
    """A factor's definition: its type, allowed values or range, default and description."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["number", "integer", "string", "boolean", "enum"]
    values: list[Scalar] | None = Field(default=None, min_length=1, max_length=256, description="enum: the allowed levels.")
    min: float | None = Field(default=None, description="number/integer: lowest allowed level.")
    max: float | None = Field(default=None, description="number/integer: highest allowed level.")
    default: Scalar | None = Field(default=None, description="The level of a variant that leaves the factor out.")
    description: str = Field(default="", max_length=2000)

    @field_validator("min", "max", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        # Lax pydantic reads JSON true/false as 1/0 (bool is an int in Python) and "1" as a
        # number; a bound given as anything but a number is a mistake to name, not to coerce.
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            kind = "boolean" if isinstance(value, bool) else "text" if isinstance(value, str) else type(value).__name__
            shown = json.dumps(value) if isinstance(value, bool | str) else repr(value)
            raise ValueError(f"expected a number, got {kind} {shown}")
        return value

    @field_validator("min", "max")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> FactorUpdate:
        # Each message starts with the field it is about, so the API's problem names it.
        levels = [(f"values[{i}]", v) for i, v in enumerate(self.values or ())] + [("default", self.default)]
        for where, level in levels:
            if isinstance(level, float) and not math.isfinite(level):
                raise ValueError(f"{where}: {level} is not a level: levels are finite numbers, text or booleans")
            if isinstance(level, str) and len(level) > 1000:
                raise ValueError(f"{where}: levels are at most 1000 characters")
        problems = definition_problems(self.definition(getattr(self, "name", None) or "factor"))
        if problems:
            raise ValueError("; ".join(f"{where}: {why}" for where, why in problems))
        return self

    def definition(self, name: str) -> FactorDef:
        return FactorDef(name, self.type, "declared", tuple(self.values) if self.values is not None else None,
                         self.min, self.max, self.default, self.description)


class FactorCreate(FactorUpdate):
    name: str = Field(pattern=FACTOR_NAME, max_length=80, description="`engine`, or `params.<body field>` to constrain a body override.")

    @model_validator(mode="after")
    def _not_builtin(self) -> FactorCreate:
        if reserved_name(self.name):
            raise ValueError(f"name: '{self.name}' is a built-in or gateway factor; "
                             "declare a factor of your own (or params.<field>)")
        field = self.name.removeprefix("params.")
        if self.name.startswith("params.") and field in RESERVED_PARAMS:
            # Every strategy that sets these is refused (OpenStrategy), so a declaration
            # would promise a factor no variant can ever set.
            raise ValueError(f"name: '{self.name}' cannot be declared: no strategy may set params.{field}, the gateway "
                             f"refuses it in every variant ({RESERVED_PARAMS[field]})")
        return self


class FactorRead(BaseModel):
    name: str
    origin: Literal["builtin", "gateway", "declared"]
    type: str
    values: list[Any] | None = None
    min: float | None = None
    max: float | None = None
    default: Any = None
    nullable: bool = False
    description: str = ""
    allowed: str = Field(description="What a level may be, in words.")
    json_schema: dict[str, Any] = Field(description="JSON Schema of one level of the factor.")

    @classmethod
    def of(cls, d: FactorDef) -> FactorRead:
        return cls(name=d.name, origin=d.origin, type=d.type, values=list(d.values) if d.values is not None else None,
                   min=d.min, max=d.max, default=d.default, nullable=d.nullable, description=d.description,
                   allowed=d.allowed(), json_schema=d.json_schema())


class FactorPage(BaseModel):
    items: list[FactorRead]
    total: int
