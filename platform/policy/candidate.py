"""Off-policy evaluation of one candidate policy on logged requests: the document
``ablab ope`` prints and ``POST /v1/experiments/{key}/ope`` returns.

A candidate's arms are logged actions, by name: a fixed variant's key, a policy variant's
arm as ``<variant>.<arm>``, or the bare arm name where only one policy variant has it. An arm
given with a strategy must be that logged action's strategy (same content hash): OPE can
only re-weigh what was served. An ``slo_router`` candidate without a model gets one fitted
on the logs, cross-fitted (the model that scores one half of the units is fitted on the
other half), so it is not graded on the requests it learned from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ablab.platform.strategy import content_hash

from .evaluate import Decider
from .model import Binning, NotEnoughData, PolicyModel, fit_model
from .ope import LoggedRequests, estimate, logged_means
from .spec import FixedArm, PolicyInvalid, PolicyT, SloRouter, objective_of

Floats = npt.NDArray[np.float64]


class CandidateError(PolicyInvalid):
    """The candidate cannot be evaluated on these logs; ``field`` names where."""


def resolve_arms(candidate: PolicyT, logs: LoggedRequests) -> list[int]:
    """Index into ``logs.actions`` of each candidate arm (the candidate's order)."""
    out = []
    where = "arm" if isinstance(candidate, FixedArm) and not candidate.arms else "arms"
    for name in candidate.arm_names:
        if name in logs.actions:
            i = logs.actions.index(name)
        else:
            hits = [i for i, a in enumerate(logs.actions) if a.endswith("." + name)]
            if len(hits) != 1:
                why = "is never logged" if not hits else "names arms of several policy variants; write <variant>.<arm>"
                raise CandidateError(f"{name!r} {why}; logged arms: {', '.join(logs.actions)}",
                                     f"{where}.{name}" if where == "arms" else where)
            i = hits[0]
        given = getattr(candidate, "arms", {}).get(name)
        logged = logs.strategies.get(logs.actions[i])
        if given and logged is not None and content_hash(given) != content_hash(logged):
            raise CandidateError(f"{name!r}: its strategy differs from the logged {logs.actions[i]!r}'s; off-policy "
                                 "evaluation can only re-weigh strategies that were served", f"arms.{name}")
        out.append(i)
    return out


def candidate_probabilities(candidate: PolicyT, logs: LoggedRequests, arms: list[int], *,
                            model: PolicyModel | None = None, custom: Mapping[str, Any] | None = None,
                            ) -> tuple[Floats, dict[str, Any]]:
    """The candidate's n × A probabilities over the logged actions, and how they were made."""
    n, a_count = logs.n, len(logs.actions)
    info: dict[str, Any] = {"kind": candidate.kind, "policy_hash": candidate.content_hash}
    small = np.zeros((n, len(arms)))
    if isinstance(candidate, SloRouter) and model is None:
        objective = objective_of(candidate.objective, custom)
        own = np.full(a_count, -1, dtype=np.int64)
        own[arms] = np.arange(len(arms))
        arm = own[logs.action]
        fold = logs.unit % 2
        versions = []
        try:
            for f in (0, 1):
                train = fold != f
                m = fit_model(candidate, np.where(train, arm, -1), logs.features, dict(logs.values),
                              np.asarray(logs.values.get(objective.source, np.full(n, np.nan))),
                              lower_is_better=objective.lower_is_better)
                test = ~train
                small[test] = Decider(candidate, m).probability_matrix(
                    {k: np.asarray(v)[test] for k, v in logs.features.items()}, int(test.sum()))
                versions.append(m.version)
            info["model"] = "cross-fitted"
            info["model_versions"] = versions
        except NotEnoughData as exc:
            small[:] = 1.0 / len(arms)
            info["model"] = f"uniform ({exc})"
    else:
        try:
            decider = Decider(candidate, model)
        except ValueError as exc:  # a model fitted for another policy
            raise CandidateError(str(exc), "model") from None
        small = decider.probability_matrix(logs.features, n)
        info["model"] = model.version if model is not None else ("fixed" if isinstance(candidate, FixedArm) else "rule")
    target = np.zeros((n, a_count))
    for j, i in enumerate(arms):
        target[:, i] += small[:, j]
    return target, info


def off_policy(logs: LoggedRequests, candidate: PolicyT, *, metric: str, custom: Mapping[str, Any] | None = None,
               model: PolicyModel | None = None, features: list[str] | None = None, alpha: float = 0.05,
               experiment: str | None = None) -> dict[str, Any]:
    """The OPE document: ips, snips and dr estimates of ``metric`` under ``candidate`` with
    their intervals over units, effective sample size, support, and each logged arm's own mean."""
    try:
        source = objective_of(metric, custom).source
    except ValueError as exc:
        raise CandidateError(str(exc), "metric") from None
    arms = resolve_arms(candidate, logs)
    target, info = candidate_probabilities(candidate, logs, arms, model=model, custom=custom)
    names = [f for f in dict.fromkeys([*(features or []), *getattr(candidate, "features", [])]) if f in logs.features]
    binning = Binning.fit(names, logs.features, logs.n) if names else None
    doc: dict[str, Any] = {"experiment": experiment, "metric": metric, "candidate": info}
    doc.update(estimate(logs, target, source, binning=binning, alpha=alpha))
    doc["logged"] = logged_means(logs, source, alpha)
    doc["notes"] = list(logs.notes)
    if info.get("model", "").startswith("uniform"):
        doc["notes"].append(f"the candidate's model could not be fitted ({info['model']}); evaluated as uniform")
    finite: dict[str, Any] = _finite(doc)
    return finite


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def ope_from_events(table: Any, spec: Any, policy: Any, *, metric: str | None = None,
                    model: PolicyModel | None = None, alpha: float = 0.05) -> dict[str, Any]:
    """``ablab ope`` and ``POST …/ope`` in one: events (an Arrow table, see :mod:`.logs`), the
    experiment (:class:`ablab.platform.stats.spec.ExperimentSpec`), the candidate's mapping.
    ``metric``: default the candidate's objective (a router), else the experiment's first
    primary metric that is a per-request mean, else accuracy. Raises :class:`CandidateError`
    naming the field at fault."""
    from pydantic import ValidationError

    from .logs import policy_features, requests_from_table
    from .spec import PER_REQUEST_METRICS, error_field, parse_policy

    custom = {m.name: m for m in spec.custom}
    try:
        candidate = parse_policy(policy, custom=custom)
    except ValidationError as exc:
        field, message = error_field(exc, "policy.")
        raise CandidateError(message, field) from None
    if metric is None:
        if isinstance(candidate, SloRouter):
            metric = candidate.objective
        else:
            metric = next((m for m in spec.primary if m in PER_REQUEST_METRICS or m in custom), "accuracy")
    try:
        source = objective_of(metric, custom).source
    except ValueError as exc:
        raise CandidateError(str(exc), "metric") from None
    features = list(dict.fromkeys([*policy_features(spec), *getattr(candidate, "features", [])]))
    logs = requests_from_table(table, spec, features=features, sources=[source])
    if logs.n == 0:
        raise CandidateError(f"experiment {spec.key!r} has no logged requests to evaluate on", "events")
    return off_policy(logs, candidate, metric=metric, custom=custom, model=model, features=features, alpha=alpha,
                      experiment=spec.key)
