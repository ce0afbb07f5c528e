"""A policy variant in the gateway (issue #33, docs/policies.md): per request, the arm.

``serving.py`` calls :func:`choose_arm` when the request's plan holds a ``policy`` (one
line), and its events are annotated by the plan's :class:`~ablab.platform.policy.serve.Served`.
The rest is here:

- per (config, assignments), cached like the plan itself: which assignment owns the policy,
  its model (the SDK config's ``policy_models``), and per arm a ready plan — the arm's
  strategy merged with the other experiments' as any strategy is (the first experiment in
  layer order to set a factor decides it), its problems and strategy id computed once;
- per request: the features (the prompt-token estimate the gateway logs when the backend
  reports no usage, ``max_tokens`` of the body, ``attr.<name>`` from ``X-Ablab-Attr-<name>``),
  one decision drawn by the trace id, and that arm's plan with the decision attached.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily

from ablab.platform.gateway import protocol
from ablab.platform.gateway.metering import strategy_id
from ablab.platform.gateway.rewrite import strategy_problems
from ablab.platform.gateway.serving import GatewayState, Plan, _attributes
from ablab.platform.policy.serve import PolicyServer, Served, served_strategy
from ablab.platform.policy.spec import policy_of


@dataclass(frozen=True, slots=True)
class PolicyPlan(Plan):
    """The plan of the arm a policy request drew, with the decision its events carry."""

    served: Served | None = None


@dataclass(slots=True)
class _Owner:
    config: Any
    experiment: str
    variant: str
    policy: Mapping[str, Any]
    model: Any
    arms: dict[str, Plan]


_SERVERS: dict[int, PolicyServer] = {}
_OWNERS: dict[tuple[int, tuple[tuple[str, str], ...]], _Owner] = {}
MAX_OWNERS = 4096


class PolicyLoadFailures:
    """``ablab_gateway_policy_load_failures_total{reason}`` on the gateway's ``/metrics``: a
    policy (``policy``) or a published model (``model``) this gateway could not load. Each kept
    the previous decider, or uniform exploration, and failed no request (:class:`PolicyServer`)."""

    def __init__(self, st: GatewayState) -> None:
        self._st = st

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("ablab_gateway_policy_load_failures",
                                     "Policies or policy models this gateway could not load (the previous one kept), by reason.",
                                     labels=["reason"])
        for reason in ("policy", "model"):
            family.add_metric([reason], server_of(self._st).failures.get(reason, 0))
        yield family


def server_of(st: GatewayState) -> PolicyServer:
    """This gateway's deciders (one per state, so tests with several gateways stay apart)."""
    server = _SERVERS.get(id(st))
    if server is None:
        server = _SERVERS[id(st)] = PolicyServer()
    return server


def _owner(st: GatewayState, plan: Plan) -> _Owner | None:
    config = st.sdk.config
    key = (id(config), plan.assignments)
    found = _OWNERS.get(key)
    if found is not None and found.config is config:  # an id reused by a later config is a miss
        return found
    strategies: list[Mapping[str, Any]] = []
    for experiment, variant in plan.assignments:
        exp = next((e for e in config.experiments if e.key == experiment), None)
        v = next((v for v in exp.variants if v.key == variant), None) if exp is not None else None
        strategies.append(v.strategy if v is not None else {})
    owner = None
    for (experiment, variant), strategy in zip(plan.assignments, strategies):
        policy = policy_of(strategy)
        if policy is None:
            continue
        arms: dict[str, Plan] = {}
        owner_index = next(i for i, s in enumerate(strategies) if s is strategy)
        for arm, arm_strategy in (policy.get("arms") or {}).items():
            merged = served_strategy(strategies, owner_index, arm_strategy)
            problems = tuple(strategy_problems(merged, backends=st.settings.backends, templates=st.settings.templates,
                                               can_compress=st.compress is not None))
            arms[arm] = Plan(plan.assignments, merged, strategy_id(merged), problems, plan.shadows)
        owner = _Owner(config, experiment, variant, policy, config.policy_models.get((experiment, variant)), arms)
        break
    if owner is not None:
        if len(_OWNERS) > MAX_OWNERS:
            _OWNERS.clear()
        _OWNERS[key] = owner
    return owner


def choose_arm(st: GatewayState, plan: Plan, body: dict[str, Any], headers: Mapping[str, str], trace_id: str) -> Plan:
    """The plan of the arm this request draws (``plan`` itself when no assignment is a policy)."""
    owner = _owner(st, plan)
    if owner is None:
        return plan
    served = server_of(st).decide(
        owner.experiment, owner.variant, owner.policy, draw_key=trace_id, model=owner.model,
        prompt_tokens=lambda: protocol.estimate_tokens(len(protocol.message_text(body))),
        max_tokens=body.get("max_tokens", body.get("max_completion_tokens")), attributes=_attributes(headers))
    if served is None or served.decision.arm not in owner.arms:
        return plan
    arm = owner.arms[served.decision.arm]
    return PolicyPlan(arm.assignments, arm.strategy, arm.strategy_id, arm.problems, arm.shadows, served)


def annotate(plan: Plan, events: list[dict[str, Any]]) -> None:
    """Put a policy request's choice (and features) on its variant's events."""
    served = getattr(plan, "served", None)
    if served is not None:
        for event in events:
            served.annotate(event)
