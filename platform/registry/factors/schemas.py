"""Request and response schemas of declared factors (``FactorCreate/Update/Read/Page``)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ablab.platform.registry.factors.catalog import FactorDef, definition_problems
from ablab.platform.strategy import DECLARED_NAME, PARAM_KEY, reserved_name

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

    @model_validator(mode="after")
    def _coherent(self) -> "FactorUpdate":
        for bound in (self.min, self.max):
            if bound is not None and not math.isfinite(bound):
                raise ValueError("min and max must be finite numbers")
        for level in [*(self.values or ()), self.default]:
            if isinstance(level, float) and not math.isfinite(level):
                raise ValueError(f"{level} is not a level: levels are finite numbers, text or booleans")
            if isinstance(level, str) and len(level) > 1000:
                raise ValueError("levels are at most 1000 characters")
        problems = definition_problems(self.definition(getattr(self, "name", None) or "factor"))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def definition(self, name: str) -> FactorDef:
        return FactorDef(name, self.type, "declared", tuple(self.values) if self.values is not None else None,
                         self.min, self.max, self.default, self.description)


class FactorCreate(FactorUpdate):
    name: str = Field(pattern=FACTOR_NAME, max_length=80, description="`engine`, or `params.<body field>` to constrain a body override.")

    @model_validator(mode="after")
    def _not_builtin(self) -> "FactorCreate":
        if reserved_name(self.name):
            raise ValueError(f"'{self.name}' is a built-in or gateway factor; declare a factor of your own (or params.<field>)")
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
    def of(cls, d: FactorDef) -> "FactorRead":
        return cls(name=d.name, origin=d.origin, type=d.type, values=list(d.values) if d.values is not None else None,
                   min=d.min, max=d.max, default=d.default, nullable=d.nullable, description=d.description,
                   allowed=d.allowed(), json_schema=d.json_schema())


class FactorPage(BaseModel):
    items: list[FactorRead]
    total: int
