"""Logged events → :class:`~.ope.LoggedRequests`: the one reading of an experiment's events for
off-policy evaluation, shared by ``ablab ope`` (an event file) and ``POST …/ope`` (the store's
``raw_events`` rows), so both give the same numbers. Pure: an Arrow table in.

Rules:

- a request is an ``inference`` event of the experiment (or with no experiment), with a
  trace and a unit, not a shadow (``shadow_of`` empty), of a configured variant, at or after
  the experiment's start; the first per ``trace_id`` (by event time, then position) counts;
- labels: the latest ``feedback`` per ``trace_id`` and field (``correct``, ``score``);
- the logged action: a fixed variant's key, or ``<variant>.<arm>`` for a policy variant's
  request (its event's ``arm``);
- its propensity: a fixed variant's logged ``propensity`` where the event has one, else its
  weight share of the configured variants; a policy variant's request: the variant's share ×
  the event's ``propensity`` (a policy request without ``arm`` or ``propensity`` is left out
  and counted);
- features: ``prompt_tokens`` (``measures.policy_prompt_tokens``, the count the decision saw,
  else the event's field), ``max_tokens`` (a ``max_tokens`` column or
  ``measures.max_tokens``), ``attr.<name>`` (``dims.<name>``);
- the randomization unit: ``unit_id`` (``trace_id`` for a request-randomized experiment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from ablab.platform import fields
from ablab.platform.stats.offline import nested_column
from ablab.platform.stats.spec import ExperimentSpec
from ablab.platform.stats.unit_agg import end_ms

from .ope import LoggedRequests
from .spec import ATTR_PREFIX, PolicyInvalid, PolicyT, error_field, parse_policy, policy_of

Floats = npt.NDArray[np.float64]
Objects = npt.NDArray[np.object_]
VALUE_FIELDS = fields.INFERENCE_FIELDS
LOG_COLUMNS = ("type", "ts", "trace_id", "experiment", "variant", "unit_id", "shadow_of", *VALUE_FIELDS, "error",
               "correct", "score", "arm", "propensity", "policy_version", "max_tokens")
"""Top-level columns the reading uses (plus ``measures``/``dims``, nested or flat)."""


def _column(table: pa.Table, name: str) -> pa.Array | None:
    """``name`` as a flat column, or ``dims.x``/``measures.x`` out of a struct or map column."""
    if name in table.column_names:
        return table[name].combine_chunks()
    head, _, key = name.partition(".")
    return nested_column(table, head, key) if key else None


def _text(table: pa.Table, name: str) -> Objects:
    col = _column(table, name)
    if col is None or pa.types.is_null(col.type):
        return np.full(table.num_rows, "", dtype=object)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return np.asarray(pc.fill_null(pc.cast(col, pa.string()), "").to_numpy(zero_copy_only=False), dtype=object)


def _num(table: pa.Table, name: str) -> Floats:
    col = _column(table, name)
    if col is None or pa.types.is_null(col.type):
        return np.full(table.num_rows, np.nan)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(pc.if_else(pc.equal(col, ""), pa.scalar(None, col.type), col), pa.float64())
    return np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), dtype=float)


def _ts_ms(table: pa.Table) -> Floats:
    if "ts" not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table["ts"].combine_chunks()
    target = pa.timestamp("ms", tz="UTC")
    try:
        ts = pc.cast(col, target, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import pandas as pd

        ts = pa.array(pd.to_datetime(col.to_pandas(), utc=True, errors="coerce", format="ISO8601")).cast(target, safe=False)
    return np.asarray(pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False), dtype=float)


def _latest(codes: npt.NDArray[np.int64], ts: Floats, values: Floats, n_codes: int) -> Floats:
    """Per code: the value of its latest row (event time, then position), NaN where none."""
    out = np.full(n_codes, np.nan)
    rows = np.flatnonzero((codes >= 0) & np.isfinite(values))
    if not rows.size:
        return out
    order = rows[np.lexsort((rows, np.nan_to_num(ts[rows], nan=-np.inf)))]  # oldest first; the last write wins
    out[codes[order]] = values[order]
    return out


def requests_from_table(table: pa.Table, spec: ExperimentSpec, *, features: Sequence[str] = (),
                        sources: Sequence[str] = ()) -> LoggedRequests:
    """The experiment's logged requests, with ``features`` and the per-request ``sources``
    (``correct``, ``score``, ``error``, a catalogue field of the request, ``measures.<name>``)."""
    kind = _text(table, "type")
    experiment = _text(table, "experiment")
    trace = _text(table, "trace_id")
    unit_id = _text(table, "unit_id")
    variant = _text(table, "variant")
    ts = _ts_ms(table)
    mine = (experiment == spec.key) | (experiment == "")
    has_trace = trace != ""

    shares = {v.key: v.weight for v in spec.variants}
    total = sum(shares.values()) or 1.0
    shares = {k: w / total for k, w in shares.items()}
    policies = experiment_policies(spec)

    inf = mine & (kind == "inference") & has_trace & (unit_id != "") & (_text(table, "shadow_of") == "")
    inf &= np.isin(variant, list(shares))
    if spec.start:
        start = datetime.fromisoformat(spec.start.replace("Z", "+00:00")).timestamp() * 1000.0
        inf &= ~(ts < start)
    if spec.end:  # analysis.end, or a ship: later requests are the shipped variant's alone, no logged policy
        inf &= ~(ts >= end_ms(spec.end))
    rows = np.flatnonzero(inf)
    # the first event per trace: by event time, then position
    order = rows[np.lexsort((rows, np.nan_to_num(ts[rows], nan=np.inf), trace[rows].astype(str)))]
    first = np.r_[True, trace[order][1:] != trace[order][:-1]] if order.size else np.zeros(0, dtype=bool)
    keep = order[first]  # by trace id: both readers sum in the same order, so their numbers are equal to the bit
    notes: list[str] = []
    duplicates = int(rows.size - keep.size)
    if duplicates:
        notes.append(f"{duplicates} duplicate inference events (same trace_id) counted once")

    # actions and propensities
    arm = _text(table, "arm")[keep]
    logged_p = _num(table, "propensity")[keep]
    v = variant[keep]
    actions: list[str] = []
    strategies: dict[str, Mapping[str, Any]] = {}
    for spec_v in spec.variants:
        policy = policies.get(spec_v.key)
        if policy is None:
            actions.append(spec_v.key)
            strategies[spec_v.key] = spec_v.strategy
        else:
            for name in policy.arm_names:
                actions.append(f"{spec_v.key}.{name}")
                strategies[f"{spec_v.key}.{name}"] = getattr(policy, "arms", {}).get(name, {})
    index = {a: i for i, a in enumerate(actions)}
    is_policy = np.isin(v, list(policies))
    names = np.where(is_policy, np.char.add(np.char.add(v.astype(str), "."), arm.astype(str)), v.astype(str))
    action = np.array([index.get(str(x), -1) for x in names], dtype=np.int64)
    share = np.array([shares[str(x)] for x in v], dtype=float)
    fixed_p = np.where(np.isfinite(logged_p) & (logged_p > 0) & (logged_p <= 1), logged_p, share)
    propensity = np.where(is_policy, share * logged_p, fixed_p)
    usable = (action >= 0) & np.isfinite(propensity) & (propensity > 0)
    unusable = int((~usable).sum())
    if unusable:
        notes.append(f"{unusable} requests of a policy variant lack a known arm or a propensity and are left out")
    if spec.adaptive:
        notes.append("the allocator re-weighted this experiment: fixed variants' propensities are the logged ones "
                     "where events carry them, else the configured weights (which the phases changed)")
    keep, action, propensity = keep[usable], action[usable], propensity[usable]

    # labels, by trace
    codes_u, trace_code = np.unique(trace.astype(str), return_inverse=True)
    trace_code = np.where(has_trace, trace_code.reshape(-1), -1).astype(np.int64)
    fb = mine & (kind == "feedback") & has_trace
    values: dict[str, Floats] = {}
    for label in ("correct", "score"):
        col = np.where(fb, _num(table, label), np.nan)
        values[label] = _latest(trace_code, ts, col, codes_u.size)[trace_code[keep]]
    err = _text(table, "error")
    values["error"] = (err[keep] != "").astype(float)
    for name in (*VALUE_FIELDS, *(s for s in sources if s.startswith("measures."))):
        values[name] = _num(table, name)[keep]

    feats: dict[str, Any] = {}
    for f in features:
        if f == "prompt_tokens":  # the count the decision saw (serve.py), else the backend's
            direct = _num(table, "prompt_tokens")[keep]
            seen = _num(table, "measures.policy_prompt_tokens")[keep]
            feats[f] = np.where(np.isfinite(seen), seen, direct)
        elif f == "max_tokens":
            direct = _num(table, "max_tokens")[keep]
            feats[f] = np.where(np.isfinite(direct), direct, _num(table, "measures.max_tokens")[keep])
        elif f.startswith(ATTR_PREFIX):
            name = f[len(ATTR_PREFIX):]
            col = _text(table, f"dims.{name}")[keep]
            feats[f] = np.array([None if x == "" else x for x in col], dtype=object)

    unit_src = trace if spec.request_randomized else unit_id
    _, unit = np.unique(unit_src[keep].astype(str), return_inverse=True)
    version = _text(table, "policy_version")[keep]
    return LoggedRequests(actions=tuple(actions), action=action, propensity=propensity,
                          unit=unit.reshape(-1).astype(np.int64), features=feats, values=values,
                          policy_version=[str(x) for x in version], strategies=strategies, notes=notes)


def experiment_policies(spec: ExperimentSpec) -> dict[str, PolicyT]:
    """The policy of each policy variant; :class:`~.spec.PolicyInvalid` names a bad one's field."""
    out: dict[str, PolicyT] = {}
    for i, v in enumerate(spec.variants):
        p = policy_of(v.strategy)
        if p is None:
            continue
        try:
            out[v.key] = parse_policy(p)
        except ValidationError as exc:
            field, message = error_field(exc, f"variants[{i}].strategy.policy.")
            raise PolicyInvalid(message, field) from None
    return out


def policy_features(spec: ExperimentSpec) -> list[str]:
    """Features the experiment's own policy variants read."""
    out: list[str] = []
    for policy in experiment_policies(spec).values():
        out.extend(getattr(policy, "features", []))
    return list(dict.fromkeys(out))

