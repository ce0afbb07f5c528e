"""Where a policy variant's gain over the control comes from (``attribution.policies``, issue 33).

Pure: the experiment's logged requests and its policies in, :class:`PolicyCredit` models out;
both faces call :func:`policy_credits_from_events` on an Arrow table of events (the store's
``logged_events``, or an event file), so they give the same numbers. For each policy variant
and its metric (the router's objective, else the experiment's first per-request primary):

- **gain**: the policy's measured mean minus the control's, each a ratio of per-unit sums,
  the interval from their two unit-robust standard errors (the variants' units are disjoint);
- **arms**: ``contribution = share × (mean − control mean)`` per arm, shares over the
  policy's requests that have a value, so the contributions add up to the gain exactly;
- **routing**: V(policy) − V(best single arm), both by the doubly robust estimator
  (:func:`.ope.estimate`) on the policy's own requests, whose logged propensities are the
  policy's probabilities (its explore floor gives every arm support);
- **features**: Shapley values over the policy's features (at most :data:`MAX_FEATURES`) of
  V(policy) − V(policy blind to a set of features), "blind" meaning the decider sees that
  feature fixed at its logged median (a token count) or most frequent value (an attribute).

The decider an estimate evaluates: a rule is its own; a router's is its model refitted from
the variant's logs and cross-fitted over units (the model that scores one half of the units
is fitted on the other, as :mod:`.candidate` evaluates a router candidate), because the
served models are not in the logs, only their versions.

The doubly robust estimate is linear in the target policy's probabilities (the reward model
does not depend on them), so a difference of two values is the estimate of the difference of
their probability matrices: one interval over units for each difference, and the feature
credits add up to V(full) − V(blind to all) exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from itertools import combinations
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from ablab.platform.stats.result_models import ArmCredit, FeatureCredit, PolicyCredit, PolicyEstimate
from ablab.platform.stats.spec import ExperimentSpec

from .breakdown import (
    arm_action,
    custom_metrics,
    default_metric,
    has_policies,
    logged_sources,
    unit_mean,
    variant_rows,
    variant_shares,
)
from .evaluate import Decider
from .model import Binning, NotEnoughData, PolicyModel, fit_model
from .ope import LoggedRequests, estimate
from .spec import PolicyT, SloRouter, is_numeric, objective_of

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
MAX_FEATURES = 6  # 2^6 blinded deciders; more and the Shapley sum is not attempted
Probabilities = Callable[[Mapping[str, Any]], Floats]


def _estimate(res: Mapping[str, Any]) -> PolicyEstimate:
    return PolicyEstimate(estimate=res.get("estimate"), ci=list(res.get("ci") or [None, None]))


def _normal(value: float, se: float | None, alpha: float) -> PolicyEstimate:
    if se is None or not math.isfinite(se):
        return PolicyEstimate(estimate=value)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return PolicyEstimate(estimate=value, ci=[value - z * se, value + z * se])


def blind_value(feature: str, column: Any) -> Any:
    """What a decider blind to ``feature`` sees: the logged median of a token count, the most
    frequent value of an attribute (ties: the first in sort order); absent when none is logged."""
    if is_numeric(feature):
        x = np.asarray(column, dtype=float)
        x = x[np.isfinite(x)]
        return float(np.median(x)) if x.size else math.nan
    present = [str(v) for v in np.asarray(column, dtype=object) if v is not None and v == v and str(v) != ""]
    if not present:
        return None
    values, counts = np.unique(np.asarray(present, dtype=object).astype(str), return_counts=True)
    return str(values[int(np.argmax(counts))])  # np.unique sorts, argmax takes the first of the most frequent


def blinded(columns: Mapping[str, Any], blind: Mapping[str, Any], n: int) -> dict[str, Any]:
    """``columns`` with each feature in ``blind`` replaced by its constant."""
    out = dict(columns)
    for f, value in blind.items():
        out[f] = np.full(n, value, dtype=float) if is_numeric(f) else np.full(n, value, dtype=object)
    return out


def own_logs(logs: LoggedRequests, key: str, policy: PolicyT, share: float, source: str) -> LoggedRequests:
    """The variant's requests alone, its arms as the actions and the policy's own propensities."""
    rows = variant_rows(logs, key)
    index = np.full(len(logs.actions), -1, dtype=np.int64)
    for j, arm in enumerate(policy.arm_names):
        a = arm_action(logs, key, arm)
        if a >= 0:
            index[a] = j
    values = {s: np.asarray(v, dtype=float)[rows] for s, v in logs.values.items()}
    values.setdefault(source, np.full(rows.size, np.nan))
    return LoggedRequests(actions=policy.arm_names, action=index[logs.action[rows]],
                          propensity=logs.propensity[rows] / share, unit=logs.unit[rows],
                          features={f: np.asarray(v)[rows] for f, v in logs.features.items()}, values=values,
                          policy_version=None if logs.policy_version is None else
                          [logs.policy_version[i] for i in rows])


def decider_probabilities(policy: PolicyT, logs: LoggedRequests, *, lower_is_better: bool,
                          source: str) -> tuple[Probabilities, list[str]]:
    """A function from feature columns (one value per request of ``logs``) to the n × K
    probabilities of the policy's decider, and notes on how it was made."""
    if not isinstance(policy, SloRouter):
        decider = Decider(policy)
        return (lambda columns: decider.probability_matrix(columns, logs.n)), []
    slos = policy.slos()
    latencies = {s.latency: np.asarray(logs.values.get(s.latency, np.full(logs.n, np.nan)), dtype=float) for s in slos}
    objective = np.asarray(logs.values.get(source, np.full(logs.n, np.nan)), dtype=float)
    fold = logs.unit % 2
    models: list[PolicyModel] = []
    try:
        for f in (0, 1):
            train = fold != f
            models.append(fit_model(policy, np.where(train, logs.action, -1), logs.features, latencies, objective,
                                    lower_is_better=lower_is_better))
    except NotEnoughData as exc:
        k = len(policy.arm_names)
        return (lambda columns: np.full((logs.n, k), 1.0 / k)), [
            f"the router's model could not be refitted from its logs ({exc}); it is evaluated as uniform"]
    deciders = [Decider(policy, m) for m in models]

    def probabilities(columns: Mapping[str, Any]) -> Floats:
        out = np.zeros((logs.n, len(policy.arm_names)))
        for f, decider in enumerate(deciders):
            test = fold == f
            out[test] = decider.probability_matrix({k: np.asarray(v)[test] for k, v in columns.items()}, int(test.sum()))
        return out
    return probabilities, ["the router's decider is its model refitted from the variant's logs, cross-fitted over "
                           "units (the served models are known by version only)"]


def shapley_targets(features: list[str], value_of: Callable[[frozenset[str]], Floats]) -> dict[str, Floats]:
    """Per feature, Σ_S w(S) (π(S ∪ {f}) − π(S)) over the subsets S of the other features, with
    the Shapley weights w(S) = |S|! (n − |S| − 1)! / n!: the probability matrix whose doubly
    robust value is the feature's credit. ``value_of(S)``: the decider seeing only S."""
    n = len(features)
    cache: dict[frozenset[str], Floats] = {}

    def pi(s: frozenset[str]) -> Floats:
        if s not in cache:
            cache[s] = value_of(s)
        return cache[s]

    out: dict[str, Floats] = {}
    for f in features:
        others = [g for g in features if g != f]
        total: Floats | None = None
        for size in range(n):
            w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for subset in combinations(others, size):
                s = frozenset(subset)
                term = w * (pi(s | {f}) - pi(s))
                total = term if total is None else total + term
        out[f] = total if total is not None else np.zeros_like(pi(frozenset()))
    return out


def credit(logs: LoggedRequests, spec: ExperimentSpec, key: str, policy: PolicyT, *, share: float,
           alpha: float) -> PolicyCredit:
    """One policy variant's credit against the control."""
    custom = custom_metrics(spec)
    metric = default_metric(spec, policy)
    objective = objective_of(metric, custom)
    source = objective.source
    out = PolicyCredit(variant=key, metric=metric, baseline=spec.control, notes=list(logs.notes))
    r_all = np.asarray(logs.values.get(source, np.full(logs.n, np.nan)), dtype=float)

    control_rows = variant_rows(logs, spec.control)
    control_rows = control_rows[np.isfinite(r_all[control_rows])]
    mine = variant_rows(logs, key)
    mine = mine[np.isfinite(r_all[mine])]
    control = unit_mean(logs.unit[control_rows], r_all[control_rows], alpha)
    policy_mean = unit_mean(logs.unit[mine], r_all[mine], alpha)
    c_mean, c_se = control["estimate"], control["se"]
    if c_mean is None or policy_mean["estimate"] is None:
        out.notes.append(f"no {metric} values for the {'control' if c_mean is None else 'policy'} yet: no gain to credit")
    else:
        gain = float(policy_mean["estimate"]) - float(c_mean)
        se = None if policy_mean["se"] is None or c_se is None else math.hypot(policy_mean["se"], c_se)
        out.gain = _normal(gain, se, alpha)
        n = mine.size
        for arm in policy.arm_names:
            rows = mine[logs.action[mine] == arm_action(logs, key, arm)]
            if not rows.size:
                out.arms.append(ArmCredit(arm=arm, share=0.0, contribution=0.0))
                continue
            arm_share = rows.size / n
            arm_mean = float(r_all[rows].mean())
            # share × (mean − c) = Σᵤ(Σ r·1[arm] − c·Σ 1[arm]) / Σᵤ n: a ratio of per-unit sums over
            # the policy's units, plus the control mean's own variance (× share²)
            in_arm = (logs.action[mine] == arm_action(logs, key, arm)).astype(float)
            part = unit_mean(logs.unit[mine], in_arm * (r_all[mine] - float(c_mean)), alpha)
            se_a = None if part["se"] is None or c_se is None else math.hypot(part["se"], arm_share * c_se)
            contribution = arm_share * (arm_mean - float(c_mean))
            out.arms.append(ArmCredit(arm=arm, share=arm_share, mean=arm_mean, contribution=contribution,
                                      ci=_normal(contribution, se_a, alpha).ci))

    own = own_logs(logs, key, policy, share, source)
    if not np.isfinite(np.asarray(own.values[source])).any():
        out.notes.append(f"no {metric} values on the policy's requests: no routing or feature credit")
        return out
    features = [f for f in getattr(policy, "features", []) if f in logs.features]
    probabilities, how = decider_probabilities(policy, own, lower_is_better=objective.lower_is_better, source=source)
    out.notes.extend(how)
    binning = Binning.fit(features, own.features, own.n) if features else None

    def dr(target: Floats) -> dict[str, Any]:
        return estimate(own, target, source, binning=binning, alpha=alpha)

    full = probabilities(own.features)
    k = len(policy.arm_names)
    arm_values = []
    for j in range(k):
        one = np.zeros((own.n, k))
        one[:, j] = 1.0
        arm_values.append((dr(one), j, one))
    known = [(res, j, one) for res, j, one in arm_values if res["dr"]["estimate"] is not None]
    if known:
        pick = min if objective.lower_is_better else max
        best_res, best, one = pick(known, key=lambda t: float(t[0]["dr"]["estimate"]))
        out.routing = _estimate(dr(full - one)["dr"])
        out.notes.append(f"routing: against always {policy.arm_names[best]!r}, the best single arm by the same estimator")
        warning = best_res["support"]["warning"]
        if warning:
            out.notes.append(f"always {policy.arm_names[best]!r}: {warning}")

    if len(features) > MAX_FEATURES:
        out.notes.append(f"{len(features)} features: feature credit is computed for at most {MAX_FEATURES}")
        return out
    if not features:
        return out
    blind = {f: blind_value(f, own.features[f]) for f in features}

    def seeing(subset: frozenset[str]) -> Floats:
        if len(subset) == len(features):
            return full
        return probabilities(blinded(own.features, {f: v for f, v in blind.items() if f not in subset}, own.n))

    for f, target in shapley_targets(features, seeing).items():
        res = dr(target)["dr"]
        out.features.append(FeatureCredit(feature=f, credit=res["estimate"], ci=list(res["ci"])))
    return out


def policy_credits(logs: LoggedRequests, spec: ExperimentSpec, policies: Mapping[str, PolicyT]) -> list[PolicyCredit]:
    """Every policy variant's credit (the control itself, if a policy, is its own baseline: left out)."""
    shares = variant_shares(spec)
    return [credit(logs, spec, v.key, policies[v.key], share=shares[v.key], alpha=spec.alpha)
            for v in spec.variants if v.key in policies and v.key != spec.control]


def policy_credits_from_events(table: Any, spec: ExperimentSpec) -> list[PolicyCredit] | None:
    """``attribution.policies`` from an Arrow table of the experiment's events; None when the
    experiment has no policy variant."""
    if not has_policies(spec):
        return None
    from .logs import experiment_policies, policy_features, requests_from_table

    policies = experiment_policies(spec)
    logs = requests_from_table(table, spec, features=policy_features(spec), sources=logged_sources(spec, policies))
    return policy_credits(logs, spec, policies)
