"""Targeting rules: which units an experiment may see, decided from their attributes.

Every rule runs in time bounded by its own size and the attribute's, because rules are
evaluated on the API's event loop (``/v1/assign``) and in services' request paths (the
SDK): regexes are compiled by RE2, a linear-time engine with no backtracking, and
patterns it cannot compile (backreferences, lookaround) are refused when the rule is
made. Attribute values longer than :data:`MAX_VALUE_CHARS` never match a text rule.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Any

import re2

log = logging.getLogger(__name__)

MAX_PATTERN_CHARS = 256
"""Longest regex a rule may hold."""
MAX_VALUE_CHARS = 1024
"""Longest attribute value a text rule (regex, semver) looks at; the API refuses longer ones."""
MAX_LIST_ITEMS = 1000
"""Most values an ``in`` / ``not_in`` rule may list."""
MAX_ATTRIBUTES = 64
"""Most attributes one unit may carry in an assignment request."""
MAX_ATTRIBUTE_NAME_CHARS = 64
# RE2 refuses to compile programs above this memory budget ("pattern too large") and
# bounds its DFA cache with it, so one rule can never take a large share of the heap.
_RE2_MAX_MEM = 1 << 20


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


# Fixed, linear pattern (no nested quantifiers over overlapping classes); inputs capped anyway.
_SEMVER = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.\-]+))?(?:\+[0-9A-Za-z.\-]+)?$")
_SCALARS = (str, int, float, bool, type(None))


@lru_cache(maxsize=4096)  # attribute values repeat (app versions): parse each once
def parse_semver(text: str) -> tuple[int, int, int, int, tuple[Any, ...]]:
    """Sort key of a semantic version; a pre-release sorts before its release."""
    match = _SEMVER.match(str(text).strip())
    if not match:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, pre = match.groups()
    pre_key: tuple[Any, ...] = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split(".")) if pre else ()
    return int(major), int(minor or 0), int(patch or 0), 0 if pre else 1, pre_key


def compile_regex(pattern: Any) -> Any:
    """The RE2 program of ``pattern``; ValueError says why one is refused."""
    if not isinstance(pattern, str):
        raise ValueError(f"a regex rule needs a string pattern, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the pattern is {len(pattern)} characters; at most {MAX_PATTERN_CHARS} are allowed")
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True  # only "does it match" is asked: no submatch bookkeeping
    options.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(
            f"{pattern!r} cannot be compiled by RE2 ({reason}); targeting regexes run in linear time, so "
            "backreferences (\\1) and lookaround ((?=, (?!, (?<=, (?<!) are not supported"
        ) from exc


def _searcher(program: Any) -> Callable[[str], bool]:
    """``text -> found?`` for a compiled RE2 program. The binding's ``search`` builds a
    match object and maps byte offsets back to characters (~5 µs a call); the boolean
    from its underlying ``Match`` costs ~0.8 µs. Falls back to ``search`` should a
    binding version lack it (the unit tests hold both paths equal)."""
    low = getattr(program, "_regexp", None)
    anchor = getattr(getattr(getattr(re2, "_re2", None), "RE2", None), "Anchor", None)
    if low is None or anchor is None or not hasattr(low, "Match"):
        return lambda text: program.search(text) is not None
    match, unanchored = low.Match, anchor.UNANCHORED

    def found(text: str) -> bool:
        data = text.encode()
        return match(unanchored, data, 0, len(data))[0][0] != -1

    return found


def _finite_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"needs a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"needs a finite number, not {value!r}")
    return number


def _scalar(value: Any, what: str) -> None:
    if not isinstance(value, _SCALARS):
        raise ValueError(f"{what} must be a string, number, boolean or null, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, not {value!r}")
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        raise ValueError(f"{what} is {len(value)} characters; at most {MAX_VALUE_CHARS} are allowed")


@dataclass(frozen=True)
class Condition:
    attribute: str
    op: Op
    value: Any

    def __post_init__(self) -> None:
        # Fail at configuration time, not on the hot path.
        op = self.op
        if op in (Op.in_, Op.not_in):
            if not isinstance(self.value, (list, tuple)):
                raise ValueError(f"targeting op '{op}' needs a list value")
            if len(self.value) > MAX_LIST_ITEMS:
                raise ValueError(f"lists {len(self.value)} values; at most {MAX_LIST_ITEMS} are allowed")
            for item in self.value:
                _scalar(item, "each listed value")
        elif op is Op.regex:
            compile_regex(self.value)
        elif op in _NUMERIC_OPS:
            _finite_number(self.value)
        elif op in _SEMVER_OPS:
            parse_semver(self.value)
        else:
            _scalar(self.value, "the value")

    @cached_property
    def _search(self) -> Callable[[str], bool]:
        return _searcher(compile_regex(self.value))

    @cached_property
    def _semver(self) -> tuple[Any, ...]:
        return parse_semver(self.value)

    @cached_property
    def _number(self) -> float:
        return float(self.value)

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
            if not isinstance(actual, _SCALARS):
                return False  # a list or object attribute is no text and no number
            text = actual if isinstance(actual, str) else str(actual)
            if len(text) > MAX_VALUE_CHARS:
                return False  # bounded work per rule, whoever supplied the value
            if op is Op.regex:
                return self._search(text)
            compare = _SEMVER_OPS.get(op)
            if compare is not None:
                return compare(parse_semver(text), self._semver)
            return _NUMERIC_OPS[op](float(actual), self._number)
        except (TypeError, ValueError):
            return False  # an attribute of the wrong type never matches


@dataclass(frozen=True)
class Unsatisfiable:
    """A stored rule this engine cannot evaluate (e.g. a regex saved before RE2 was
    required): it matches no unit, so the experiment sees nobody it was not meant to."""

    attribute: str
    reason: str

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        return False


Rule = Condition | Unsatisfiable

_SEMVER_OPS = {
    Op.semver_eq: operator.eq,
    Op.semver_gt: operator.gt,
    Op.semver_gte: operator.ge,
    Op.semver_lt: operator.lt,
    Op.semver_lte: operator.le,
}
_NUMERIC_OPS = {Op.gt: operator.gt, Op.gte: operator.ge, Op.lt: operator.lt, Op.lte: operator.le}


def rules_from_stored(rules: Iterable[Mapping[str, Any]], *, experiment: str = "") -> tuple[Rule, ...]:
    """Conditions from stored rule dicts; a rule that no longer compiles matches nobody
    (logged) instead of failing the whole config, which would stop every experiment."""
    out: list[Rule] = []
    for rule in rules:
        try:
            out.append(Condition(rule["attribute"], Op(rule["op"]), rule["value"]))
        except (KeyError, ValueError, TypeError) as exc:
            attribute = str(rule.get("attribute", "?")) if isinstance(rule, Mapping) else "?"
            log.warning("experiment %r: targeting rule on %r matches no unit: %s; fix it with PATCH", experiment, attribute, exc)
            out.append(Unsatisfiable(attribute, str(exc)))
    return tuple(out)


def attributes_problem(attributes: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """``(attribute name, why)`` for the first attribute an assignment request may not
    carry, or None: at most :data:`MAX_ATTRIBUTES` scalars, names and values bounded."""
    if not attributes:
        return None
    if len(attributes) > MAX_ATTRIBUTES:
        return "", f"{len(attributes)} attributes sent; at most {MAX_ATTRIBUTES} are allowed"
    for name, value in attributes.items():
        if len(name) > MAX_ATTRIBUTE_NAME_CHARS:
            return name[:MAX_ATTRIBUTE_NAME_CHARS], f"attribute names may be at most {MAX_ATTRIBUTE_NAME_CHARS} characters"
        try:
            _scalar(value, f"attribute '{name}'")
        except ValueError as exc:
            return name, str(exc)
    return None


def matches_all(conditions: tuple[Rule, ...], attributes: Mapping[str, Any] | None) -> bool:
    if not conditions:
        return True
    attrs = attributes or {}
    return all(condition.matches(attrs) for condition in conditions)
