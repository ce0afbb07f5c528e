"""Targeting rules: which units an experiment may see, decided from their attributes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
import operator
from functools import cached_property, lru_cache
from typing import Any


class Op(StrEnum):
    eq = "eq"
    ne = "ne"
    in_ = "in"
    not_in = "not_in"
    gt = "gt"
    gte = "gte"
    lt = "lt"
    lte = "lte"
    regex = "regex"
    semver_eq = "semver_eq"
    semver_gt = "semver_gt"
    semver_gte = "semver_gte"
    semver_lt = "semver_lt"
    semver_lte = "semver_lte"


_SEMVER = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.\-]+))?(?:\+[0-9A-Za-z.\-]+)?$")


@lru_cache(maxsize=4096)  # attribute values repeat (app versions): parse each once
def parse_semver(text: str) -> tuple[int, int, int, int, tuple[Any, ...]]:
    """Sort key of a semantic version; a pre-release sorts before its release."""
    match = _SEMVER.match(str(text).strip())
    if not match:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, pre = match.groups()
    pre_key: tuple[Any, ...] = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split(".")) if pre else ()
    return int(major), int(minor or 0), int(patch or 0), 0 if pre else 1, pre_key


@dataclass(frozen=True)
class Condition:
    attribute: str
    op: Op
    value: Any

    def __post_init__(self) -> None:
        # Fail at configuration time, not on the hot path.
        if self.op in (Op.in_, Op.not_in) and not isinstance(self.value, (list, tuple)):
            raise ValueError(f"targeting op '{self.op}' needs a list value")
        if self.op is Op.regex:
            try:
                re.compile(str(self.value))
            except re.error as exc:
                raise ValueError(f"invalid regular expression {self.value!r}: {exc}") from exc
        if self.op.value.startswith("semver_"):
            parse_semver(self.value)

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(str(self.value))

    @cached_property
    def _semver(self) -> tuple[Any, ...]:
        return parse_semver(self.value)

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        if self.attribute not in attributes:
            return False
        actual = attributes[self.attribute]
        op = self.op
        try:
            if op is Op.eq:
                return actual == self.value
            if op is Op.ne:
                return actual != self.value
            if op is Op.in_:
                return actual in self.value
            if op is Op.not_in:
                return actual not in self.value
            if op is Op.regex:
                return self._pattern.search(str(actual)) is not None
            compare = _SEMVER_OPS.get(op)
            if compare is not None:
                return compare(parse_semver(str(actual)), self._semver)
            return _NUMERIC_OPS[op](float(actual), float(self.value))
        except (TypeError, ValueError):
            return False  # an attribute of the wrong type never matches


_SEMVER_OPS = {
    Op.semver_eq: operator.eq,
    Op.semver_gt: operator.gt,
    Op.semver_gte: operator.ge,
    Op.semver_lt: operator.lt,
    Op.semver_lte: operator.le,
}
_NUMERIC_OPS = {Op.gt: operator.gt, Op.gte: operator.ge, Op.lt: operator.lt, Op.lte: operator.le}


def matches_all(conditions: tuple[Condition, ...], attributes: Mapping[str, Any] | None) -> bool:
    if not conditions:
        return True
    attrs = attributes or {}
    return all(condition.matches(attrs) for condition in conditions)
