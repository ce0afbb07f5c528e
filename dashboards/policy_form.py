"""The policy editor's logic without Streamlit: form values ↔ a variant's ``{policy: {...}}``
strategy (docs/policies.md), and the API's policy refusals placed under their widgets.

The form is a flat description a person fills in (arms by name, each an ordinary strategy
from the factor pickers; features; SLO rows of latency, quantile and bound; the objective;
the exploration floor; for a rule, ordered rows of conditions and a default arm). The
registry validates what this produces (``parse_policy``): nothing here second-guesses it, so
a refusal reads the same whether it came from the dashboard or the API. What is read back
from a stored policy and written again is the same mapping, so an edit that touches nothing
changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ablab.platform.policy.spec import ATTR_PREFIX, LATENCIES, NUMERIC_FEATURES, PER_REQUEST_METRICS, SLO_QUANTILES

KINDS: tuple[str, ...] = ("slo_router", "rule")
MEAN = "mean"
"""The SLO row's quantile that bounds the latency's mean (the key is the bare latency)."""
SLO_STATISTICS: tuple[str, ...] = (*SLO_QUANTILES, MEAN)
OPS: tuple[str, ...] = ("lt", "le", "gt", "ge", "eq", "ne", "in", "not_in")
OP_LABELS: dict[str, str] = {"lt": "<", "le": "≤", "gt": ">", "ge": "≥", "eq": "=", "ne": "≠", "in": "in", "not_in": "not in"}
LIST_OPS = ("in", "not_in")
DEFAULT_EXPLORE = 0.05
MAX_SLOS = 4


@dataclass(frozen=True, slots=True)
class SloRow:
    latency: str
    statistic: str  # a key of SLO_QUANTILES, or MEAN
    bound: float | None  # ms; None: not filled in (the row is left out)


@dataclass(frozen=True, slots=True)
class ConditionRow:
    feature: str
    op: str
    value: str  # as typed: a number, a text, or comma-separated values for in / not_in


@dataclass(frozen=True, slots=True)
class RuleRow:
    arm: str
    conditions: tuple[ConditionRow, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyForm:
    kind: str = "slo_router"
    arms: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, strategy) in the form's order
    features: tuple[str, ...] = ("prompt_tokens",)
    slos: tuple[SloRow, ...] = ()
    objective: str = ""
    explore: float | None = DEFAULT_EXPLORE
    rules: tuple[RuleRow, ...] = ()
    default: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # keys the form has no widget for, sent back as read


# -- SLO keys ------------------------------------------------------------------------------------
def slo_key(latency: str, statistic: str) -> str:
    """``(ttft_ms, p95)`` → ``ttft_ms_p95``; the mean is the bare latency."""
    return latency if statistic == MEAN else f"{latency}_{statistic}"


def split_slo(key: str) -> tuple[str, str]:
    """The inverse of :func:`slo_key` for the catalogue's latencies; a key that is none of them
    comes back whole as the latency, so the API names it when the form is sent."""
    for latency in LATENCIES:
        if key == latency:
            return latency, MEAN
        if key.startswith(latency + "_") and key[len(latency) + 1:] in SLO_QUANTILES:
            return latency, key[len(latency) + 1:]
    return key, MEAN


# -- features ------------------------------------------------------------------------------------
def attribute_names(text: str) -> list[str]:
    """``plan, attr.tier`` → ``["attr.plan", "attr.tier"]`` (order kept, no repeats); the API
    checks each name."""
    out: list[str] = []
    for part in text.replace("\n", ",").split(","):
        name = part.strip()
        if not name:
            continue
        name = name if name.startswith(ATTR_PREFIX) else ATTR_PREFIX + name
        if name not in out:
            out.append(name)
    return out


def split_features(features: Sequence[str]) -> tuple[list[str], str]:
    """A policy's features as the form shows them: the token counts picked, the attributes typed."""
    counts = [f for f in features if f in NUMERIC_FEATURES]
    attrs = [f.removeprefix(ATTR_PREFIX) for f in features if f not in NUMERIC_FEATURES]
    return counts, ", ".join(attrs)


# -- objective -----------------------------------------------------------------------------------
def objective_choices(custom: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Metrics a policy may optimize: the catalogue's per-request means and proportions, then the
    experiment's custom means and proportions over requests."""
    names = list(PER_REQUEST_METRICS)
    for m in custom or ():
        name = m.get("name")
        if (name and name not in names and m.get("type") in ("mean", "proportion")
                and m.get("aggregation", "request") == "request"):
            names.append(str(name))
    return names


# -- conditions ----------------------------------------------------------------------------------
def _number(text: str) -> float | int | str:
    try:
        value = float(text)
    except ValueError:
        return text  # left as typed: the API says a token count compares with numbers
    return int(value) if value.is_integer() else value


def condition_value(feature: str, op: str, text: str) -> Any:
    """What one typed value means: token counts are numbers, attributes text; ``in`` /
    ``not_in`` take comma-separated values."""
    parts = [p.strip() for p in text.split(",") if p.strip()] if op in LIST_OPS else [text.strip()]
    values = [_number(p) if feature in NUMERIC_FEATURES else p for p in parts]
    return values if op in LIST_OPS else values[0]


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_shown(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def rule_mapping(row: RuleRow) -> dict[str, Any]:
    """One rule row → ``{when: {feature: {op: value, …}}, arm}``; rows on one feature join into
    one condition (``prompt_tokens > 100`` and ``≤ 800``)."""
    when: dict[str, dict[str, Any]] = {}
    for c in row.conditions:
        if not c.feature:
            continue
        when.setdefault(c.feature, {})[c.op] = condition_value(c.feature, c.op, c.value)
    return {"when": when, "arm": row.arm}


def rule_row(rule: Mapping[str, Any]) -> RuleRow:
    """A stored rule → its row (one condition per feature and operator)."""
    conditions = [ConditionRow(str(feature), str(op), _shown(value))
                  for feature, cond in (rule.get("when") or {}).items() for op, value in (cond or {}).items()]
    return RuleRow(str(rule.get("arm", "")), tuple(conditions))


# -- the strategy --------------------------------------------------------------------------------
def policy_strategy(form: PolicyForm) -> dict[str, Any]:
    """The form → the variant's strategy ``{policy: {...}}`` the registry validates."""
    policy: dict[str, Any] = {**form.extra, "kind": form.kind, "arms": {name: dict(s) for name, s in form.arms}}
    if form.kind == "slo_router":
        policy["features"] = list(form.features)
        policy["slo"] = {slo_key(r.latency, r.statistic): float(r.bound) for r in form.slos if r.bound is not None}
        policy["objective"] = form.objective
        if form.explore is not None:
            policy["explore"] = float(form.explore)
    else:
        policy["rules"] = [rule_mapping(r) for r in form.rules]
        policy["default"] = form.default
        if form.explore:  # a rule's floor is optional (0: none)
            policy["explore"] = float(form.explore)
    return {"policy": policy}


_KNOWN = {"kind", "arms", "features", "slo", "objective", "explore", "rules", "default"}


def policy_form(strategy: Mapping[str, Any] | None) -> PolicyForm:
    """A variant's stored ``{policy: {...}}`` → the form's values; anything else → a fresh form."""
    policy = (strategy or {}).get("policy")
    if not isinstance(policy, Mapping):
        return PolicyForm()
    kind = str(policy.get("kind") or "slo_router")
    arms = tuple((str(k), dict(v or {})) for k, v in (policy.get("arms") or {}).items())
    extra = {k: v for k, v in policy.items() if k not in _KNOWN}
    if kind == "rule":
        return PolicyForm(kind=kind, arms=arms, features=(), explore=policy.get("explore"),
                          rules=tuple(rule_row(r) for r in policy.get("rules") or []), default=str(policy.get("default") or ""),
                          extra=extra)
    slos = tuple(SloRow(*split_slo(str(k)), float(v)) for k, v in (policy.get("slo") or {}).items())
    features = tuple(policy["features"]) if "features" in policy else ("prompt_tokens",)
    return PolicyForm(kind=kind, arms=arms, features=features, slos=slos, objective=str(policy.get("objective") or ""),
                      explore=policy.get("explore"), extra=extra)


def rule_features(form: PolicyForm, typed: Sequence[str] = ()) -> list[str]:
    """Features a rule's condition may name: the token counts, the attributes typed, and any the
    stored rules already use."""
    out = [*NUMERIC_FEATURES, *typed]
    for r in form.rules:
        out.extend(c.feature for c in r.conditions)
    return list(dict.fromkeys(out))


# -- errors --------------------------------------------------------------------------------------
def policy_errors(errors: Mapping[str, str], where: str) -> dict[str, str]:
    """The refusals about the policy of the strategy at ``where`` (``variants.1.strategy``), keyed
    by the policy's own field (``explore``, ``arms.fast``, ``rules.1``, or ``""`` for the
    policy as a whole), each message without the field the API prefixed it with."""
    out: dict[str, str] = {}
    base = f"{where}.policy"
    for key, message in errors.items():
        if key == base or key.startswith(base + "."):
            sub = key[len(base) + 1:]
        elif key == where:
            sub = ""
        else:
            continue
        out[sub] = message.removeprefix(f"{key}: ")
    return out


def errors_for(errors: Mapping[str, str], name: str) -> list[str]:
    """The messages about policy field ``name`` and its sub-fields (``slo`` takes ``slo.ttft_ms_p95``),
    each with the sub-path that locates it."""
    return [f"{key[len(name) + 1:]}: {msg}" if key != name else msg for key, msg in errors.items()
            if key == name or key.startswith(name + ".")]
