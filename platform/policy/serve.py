"""Serving a policy variant, per request: the one helper the gateway, the SDK and
``POST /v1/assign`` share.

A :class:`PolicyServer` keeps one :class:`~.evaluate.Decider` per (experiment, variant),
rebuilt only when the variant's policy mapping or its model changes (by identity: a config
refresh hands new objects, an unchanged config the same ones), so a request costs a dict
lookup, the features and one decision. A model that fails to load keeps the previous decider
(or the uniform one) and is counted in ``failures``; a refresh's equal copy of the policy
counts as the same policy, so that previous decider survives the refresh that brought the
broken model.

What a request logs (docs/policies.md, "What a policy request logs"): ``arm``,
``propensity`` and ``policy_version`` on its exposure and inference events, and on the
inference event the features the decision saw: ``measures.policy_prompt_tokens`` (the
prompt-token count known before the call, which the backend's usage may later contradict),
``measures.max_tokens`` and ``dims.<name>`` for ``attr.<name>``. :mod:`.logs` reads them
back, so a logged propensity is recomputed exactly from its event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .evaluate import Decider, Decision
from .model import PolicyModel
from .spec import ATTR_PREFIX, PolicyT, parse_policy

log = logging.getLogger(__name__)

PROMPT_MEASURE = "policy_prompt_tokens"
"""The inference event's measure holding the prompt-token count the decision saw."""
MAX_DIM_CHARS = 128  # an event's dims value (ablab.platform.events)


@dataclass(frozen=True, slots=True)
class Served:
    """One request's choice: the arm's strategy to serve and what its events carry."""

    experiment: str
    variant: str
    decision: Decision
    strategy: Mapping[str, Any]
    features: Mapping[str, Any]

    def choice_fields(self) -> dict[str, Any]:
        d = self.decision
        return {"arm": d.arm, "propensity": d.propensity, "policy_version": d.model_version}

    def annotate(self, event: dict[str, Any]) -> None:
        """Add the choice to this variant's exposure or inference event (other events unchanged)."""
        if event.get("experiment") != self.experiment or event.get("variant") != self.variant:
            return
        event.update(self.choice_fields())
        if event.get("type") != "inference":
            return  # an exposure has no measures or dims
        measures: dict[str, Any] = dict(event.get("measures") or {})
        dims: dict[str, Any] = dict(event.get("dims") or {})
        for name, value in self.features.items():
            if value is None:
                continue
            # measures are floats, as every other measure (the outbox's fast check wants the type)
            if name == "prompt_tokens":
                measures[PROMPT_MEASURE] = float(value)
            elif name == "max_tokens":
                measures["max_tokens"] = float(value)
            elif name.startswith(ATTR_PREFIX) and (text := str(value)[:MAX_DIM_CHARS]):
                dims[name[len(ATTR_PREFIX):]] = text
        if measures:
            event["measures"] = measures
        if dims:
            event["dims"] = dims


def features_of(names: tuple[str, ...], *, prompt_tokens: Callable[[], int | None],
                max_tokens: Any, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request's value of each feature the policy reads (None: absent). ``prompt_tokens``
    is called only when the policy reads it (counting costs a pass over the prompt)."""
    out: dict[str, Any] = {}
    for name in names:
        if name == "prompt_tokens":
            out[name] = prompt_tokens()
        elif name == "max_tokens":
            ok = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 0
            out[name] = max_tokens if ok else None
        elif name.startswith(ATTR_PREFIX):
            value = (attributes or {}).get(name[len(ATTR_PREFIX):])
            out[name] = None if value is None or value == "" else str(value)
    return out


def served_strategy(strategies: Sequence[Mapping[str, Any]], owner: int, arm: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy a request that drew ``arm`` is served with: the unit's assignments'
    strategies (``strategies``, in assignment order, ``owner`` the policy variant's) merged as
    the gateway merges any plan — the first to set a factor decides it — with the arm's
    strategy in the policy's place and no ``policy`` key left. The gateway's arm plans and
    ``POST /v1/assign``'s ``decision.strategy`` are this one function."""
    merged: dict[str, Any] = {}
    for i, strategy in enumerate(strategies):
        for k, v in (arm if i == owner else strategy).items():
            if k != "policy":
                merged.setdefault(k, v)
    return merged


def policy_features(policy: PolicyT) -> tuple[str, ...]:
    return tuple(getattr(policy, "features", ()))


@dataclass(slots=True)
class _Entry:
    policy_src: Mapping[str, Any]
    model_src: Any
    policy: PolicyT
    decider: Decider
    features: tuple[str, ...]


@dataclass
class PolicyServer:
    """Deciders per (experiment, variant); see the module's docstring."""

    entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # reason → count (policy, model)

    def _fail(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def entry(self, experiment: str, variant: str, policy: Mapping[str, Any], model: Any = None) -> _Entry | None:
        """The decider of this variant's ``policy`` (a strategy's ``policy`` mapping) under
        ``model`` (a model's JSON, text or mapping; None: none yet). None when the policy
        itself cannot be read (the registry validated it, so a gateway older than it)."""
        key = (experiment, variant)
        e = self.entries.get(key)
        if e is not None and e.policy_src is policy and e.model_src is model:
            return e
        if e is not None and e.policy_src is not policy and e.policy_src == policy:
            e.policy_src = policy  # a refreshed config's copy of the same policy: its decider stands
        if e is None or e.policy_src is not policy:
            try:
                parsed = parse_policy(policy)
            except (ValidationError, ValueError):
                self._fail("policy")
                log.exception("experiment %s variant %s: its policy cannot be read; its requests get no strategy", *key)
                return None
            previous: Decider | None = None
        else:
            parsed, previous = e.policy, e.decider
        salt = f"{experiment}:{variant}"
        decider = previous
        try:
            loaded = PolicyModel.from_json(model) if model is not None else None
            decider = Decider(parsed, loaded, salt=salt)
        except (ValueError, KeyError, TypeError):
            self._fail("model")
            log.exception("experiment %s variant %s: its policy model cannot be loaded; keeping %s", *key,
                          previous.version if previous is not None else "uniform")
            if decider is None:
                decider = Decider(parsed, None, salt=salt)
        e = _Entry(policy, model, parsed, decider, policy_features(parsed))
        self.entries[key] = e
        return e

    def decide(self, experiment: str, variant: str, policy: Mapping[str, Any], *, draw_key: str,
               model: Any = None, prompt_tokens: Callable[[], int | None] = lambda: None,
               max_tokens: Any = None, attributes: Mapping[str, Any] | None = None) -> Served | None:
        """The arm this request draws and its strategy; None when the policy cannot be read."""
        e = self.entry(experiment, variant, policy, model)
        if e is None:
            return None
        features = features_of(e.features, prompt_tokens=prompt_tokens, max_tokens=max_tokens, attributes=attributes)
        d = e.decider.decide(features, draw_key)
        return Served(experiment, variant, d, getattr(e.policy, "arms", {}).get(d.arm, {}), features)
