"""A cheap acceptance check for the events the gateway builds itself, in front of the full
pydantic validation of :mod:`ablab.platform.events`.

Why: validating the exposure and inference event of each request through the pydantic models
cost ≈ 100 µs per request (a tenth of a streamed request's gateway CPU); the gateway builds
these events in code, so their shape is known: plain dicts of scalars, each value of the
exact type and within the catalogue's bounds (:data:`ablab.platform.events.FIELD_BOUNDS`,
a view of :mod:`ablab.platform.fields`).

:func:`fast_accepts` is *sound, not complete*: True only for an event the models accept
(only keys it knows for the event's type, each value checked at least as strictly as the
model: exact types, the identifier pattern, the bounds, the catalogue's order rules); False
for anything else, which then goes through ``validate_event`` as before. So what the outbox
accepts and refuses is exactly what ``ablab.platform.events`` accepts and refuses; the fast
path only decides how soon (``tests/unit/platform/gateway/test_event_check.py`` checks both on
the catalogue's boundary values, wrong types, extra keys and the order rules). A field the
models gain or change that this table does not know sends events that carry it to the full
validation: slower, never wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ablab.platform.events import (
    FIELD_BOUNDS,
    MAX_DIMS,
    MAX_MEASURES,
    MEASURE_BOUND,
    TS_RANGE,
    ExposureEvent,
    InferenceEvent,
)
from ablab.platform.fields import AT_MOST

_IDENT = re.compile(r"[A-Za-z0-9_.:\-]{1,128}").fullmatch
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}").fullmatch
# What the gateway writes: "2026-12-06T05:46:15.187716Z" (no other offset, 0, 3 or 6 digits)
_TS = re.compile(r"(\d{4})-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3}|\.\d{6})?Z").fullmatch

Check = Callable[[Any], bool]


def _ident(v: Any) -> bool:
    return type(v) is str and _IDENT(v) is not None


def _opt_ident(v: Any) -> bool:
    return v is None or _ident(v)


def _ts(v: Any) -> bool:
    if type(v) is not str or (m := _TS(v)) is None:
        return False
    lo, hi = TS_RANGE
    if not lo.year < int(m.group(1)) < hi.year - 1:  # well inside the range: no edge to get wrong
        return False
    try:
        datetime.fromisoformat(v).astimezone(UTC)
    except ValueError:  # a 31st of February
        return False
    return True


def _bounded_float(name: str, *, optional: bool = False) -> Check:
    lo, hi = FIELD_BOUNDS[name].lo, FIELD_BOUNDS[name].hi

    def check(v: Any) -> bool:
        if v is None:
            return optional
        return type(v) is float and lo <= v <= hi and math.isfinite(v)

    return check


def _bounded_int(name: str) -> Check:
    lo, hi = FIELD_BOUNDS[name].lo, FIELD_BOUNDS[name].hi

    def check(v: Any) -> bool:
        return type(v) is int and lo <= v <= hi

    return check


def _error(v: Any) -> bool:
    return v is None or (type(v) is str and 1 <= len(v) <= 256)


def _measures(v: Any) -> bool:
    if v is None:
        return True
    if type(v) is not dict or len(v) > MAX_MEASURES:
        return False
    lo, hi = MEASURE_BOUND.lo, MEASURE_BOUND.hi
    for k, x in v.items():
        if type(k) is not str or _NAME(k) is None or type(x) is not float or not (lo <= x <= hi and math.isfinite(x)):
            return False
    return True


def _dims(v: Any) -> bool:
    if v is None:
        return True
    if type(v) is not dict or len(v) > MAX_DIMS:
        return False
    for k, x in v.items():
        if type(k) is not str or _NAME(k) is None or type(x) is not str or not 1 <= len(x) <= 128:
            return False
    return True


def _arm(v: Any) -> bool:
    return v is None or (type(v) is str and _NAME(v) is not None)


def _propensity(v: Any) -> bool:
    return v is None or (type(v) is float and 0.0 < v <= 1.0)


def _shadow(v: Any) -> bool:
    return v is None or (type(v) is str and v in ("sent", "dropped"))


def _version(v: Any) -> bool:
    return type(v) is int and v == 1


def _absent(v: Any) -> bool:
    return v is None  # fields whose rules span the event (a shadow's own): the full validation judges them


_COMMON: dict[str, Check] = {
    "v": _version, "event_id": _ident, "ts": _ts, "trace_id": _ident, "experiment": _ident, "variant": _ident,
    "unit_id": _ident, "arm": _arm, "propensity": _propensity, "policy_version": _opt_ident,
}
_INFERENCE: dict[str, Check] = {
    **_COMMON,
    "ttft_ms": _bounded_float("ttft_ms"), "e2e_ms": _bounded_float("e2e_ms"),
    "tpot_ms": _bounded_float("tpot_ms", optional=True), "prompt_tokens": _bounded_int("prompt_tokens"),
    "output_tokens": _bounded_int("output_tokens"), "device_s": _bounded_float("device_s"),
    "cost_usd": _bounded_float("cost_usd"), "price_version": _ident, "error": _error, "strategy": _ident,
    "measures": _measures, "dims": _dims, "shadow": _shadow, "shadow_of": _absent, "output_text": _absent,
}


def _known(checks: dict[str, Check], model: Any) -> tuple[dict[str, Check], frozenset[str]]:
    """The checks for fields the model still has, and its required fields (a field the model
    dropped is then an unknown key: the full validation refuses it)."""
    fields = model.model_fields
    known = {k: c for k, c in checks.items() if k in fields}
    required = frozenset(k for k, f in fields.items() if f.is_required())
    return known, required


_TYPES: dict[str, tuple[dict[str, Check], frozenset[str]]] = {
    "exposure": _known(_COMMON, ExposureEvent),
    "inference": _known(_INFERENCE, InferenceEvent),
}
_ORDER = tuple((name, bound) for name, bound, _ in AT_MOST)


def fast_accepts(event: Mapping[str, Any]) -> bool:
    """True only when ``ablab.platform.events.validate_event`` accepts ``event`` (see the module
    docstring); False: undecided, validate it fully."""
    if type(event) is not dict:
        return False
    kind = event.get("type")
    entry = _TYPES.get(kind) if type(kind) is str else None
    if entry is None:
        return False
    checks, required = entry
    for name in required:
        if name != "type" and name not in event:
            return False
    for name, value in event.items():
        if name == "type":
            continue
        check = checks.get(name)
        if check is None or not check(value):
            return False
    if kind == "inference":
        for name, bound in _ORDER:
            a, b = event.get(name), event.get(bound)
            if a is None or b is None or a > b:
                return False
    return True
