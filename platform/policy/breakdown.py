"""A policy variant in results: which arms took its requests, how each arm did, and whether
the variant met its SLOs (``results.policies``, issue 33).

Pure: the experiment's logged requests (:func:`.logs.requests_from_table`, the one reading
that off-policy evaluation and refits use) and its policies in, result models out. Both faces
call :func:`policy_results` on an Arrow table of events: ``GET …/results`` with the store's
``logged_events``, ``ablab analyze`` with the event file, so they give the same numbers.

Every interval is over randomization units (requests of one unit are dependent), as a ratio
of per-unit sums (:mod:`.ope`'s delta method): a mean is ``Σᵤ sumᵤ / Σᵤ nᵤ``, an arm's share
``Σᵤ armᵤ / Σᵤ nᵤ``. An SLO's quantile interval inverts the unit-robust interval of the share
of requests at or below the observed quantile (Woodruff's method), so it widens with the
clustering as the mean's does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from ablab.platform import fields
from ablab.platform.stats.result_models import ArmMetric, ArmRow, PolicyBreakdown, SloCompliance
from ablab.platform.stats.spec import ExperimentSpec

from .ope import LoggedRequests, unit_ratio
from .spec import PER_REQUEST_METRICS, PolicyT, SloBound, SloRouter, objective_of, policy_of

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
UNIFORM_PREFIX = "uniform:"  # the version a router logs before it has a model (evaluate.Decider)
ARM_METRICS: tuple[str, ...] = ("accuracy", "error_rate", fields.HEADLINE_LATENCY, fields.SLA_LATENCY, fields.COST_FIELD)
"""Per-arm metrics besides the objective (accuracy only where the variant has labels)."""


def has_policies(spec: ExperimentSpec) -> bool:
    """Whether any variant's strategy is a policy (no parsing: results pay nothing otherwise)."""
    return any(policy_of(v.strategy) is not None for v in spec.variants)


def custom_metrics(spec: ExperimentSpec) -> dict[str, Any]:
    return {m.name: m for m in spec.custom}


def variant_shares(spec: ExperimentSpec) -> dict[str, float]:
    """Each variant's weight share: what :mod:`.logs` multiplies a policy's propensity by."""
    total = sum(v.weight for v in spec.variants) or 1.0
    return {v.key: v.weight / total for v in spec.variants}


def variant_rows(logs: LoggedRequests, key: str) -> Ints:
    """Rows of variant ``key``: its own action (a fixed variant) or any ``<key>.<arm>``."""
    mine = np.array([a == key or a.startswith(key + ".") for a in logs.actions], dtype=bool)
    if not mine.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(mine[logs.action]).astype(np.int64)


def arm_action(logs: LoggedRequests, key: str, arm: str) -> int:
    """Index of ``<key>.<arm>`` among the logged actions (−1: never configured)."""
    name = f"{key}.{arm}"
    return logs.actions.index(name) if name in logs.actions else -1


def unit_mean(unit: Ints, x: Floats, alpha: float, weights: Floats | None = None) -> dict[str, Any]:
    """Σx / Σweights (default: the count) with its interval over the units of the rows given."""
    codes, inv = np.unique(unit, return_inverse=True)
    inv = inv.reshape(-1)
    den = np.ones(x.size) if weights is None else weights
    return unit_ratio(np.bincount(inv, weights=x, minlength=codes.size).astype(float),
                      np.bincount(inv, weights=den, minlength=codes.size).astype(float), alpha)


def default_metric(spec: ExperimentSpec, policy: PolicyT) -> str:
    """The policy's objective; else the experiment's first primary metric with a per-request
    value; else accuracy (what ``ablab ope`` defaults to)."""
    if isinstance(policy, SloRouter):
        return policy.objective
    custom = custom_metrics(spec)
    for name in spec.primary:
        try:
            objective_of(name, custom)
        except ValueError:
            continue
        return name
    return "accuracy"


def logged_sources(spec: ExperimentSpec, policies: Mapping[str, PolicyT]) -> list[str]:
    """The per-request values the breakdown and the credit read beyond the always-read ones."""
    custom = custom_metrics(spec)
    out = [objective_of(default_metric(spec, p), custom).source for p in policies.values()]
    return [s for s in dict.fromkeys(out) if s.startswith("measures.")]


# --------------------------------------------------------------------------- SLOs


def _quantile(x: Floats, q: float) -> float:
    return float(np.quantile(x, q, method="inverted_cdf"))


def slo_compliance(slo: SloBound, x: Floats, unit: Ints, alpha: float) -> SloCompliance:
    """The variant's statistic of ``slo.latency`` (``x``: per request, NaN absent) against the bound."""
    ok = np.isfinite(x)
    x, unit = x[ok], unit[ok]
    out = SloCompliance(metric=slo.key, field=slo.latency, quantile=slo.quantile, bound=slo.max_ms, n=int(x.size))
    if not x.size:
        return out
    z = NormalDist().inv_cdf(1 - alpha / 2)
    if slo.quantile is None:
        res = unit_mean(unit, x, alpha)
        observed, ci = float(res["estimate"]), list(res["ci"])
    else:
        observed = _quantile(x, slo.quantile)
        se = unit_mean(unit, (x <= observed).astype(float), alpha)["se"]
        ci = [None, None] if se is None else [_quantile(x, max(slo.quantile - z * se, 0.0)),
                                              _quantile(x, min(slo.quantile + z * se, 1.0))]
    out.observed, out.ci = observed, ci
    out.compliance = float(np.mean(x <= slo.max_ms))
    out.met = bool(observed <= slo.max_ms)
    return out


def _meets_every(slos: Sequence[SloBound], logs: LoggedRequests, rows: Ints) -> Floats:
    """Per row: 1 when every bounded latency is present and within its bound, 0 when one is
    over, NaN when one is absent (and none is over)."""
    met = np.ones(rows.size)
    for s in slos:
        x = np.asarray(logs.values.get(s.latency, np.full(logs.n, np.nan)), dtype=float)[rows]
        met = np.where(np.isnan(x), np.where(met == 0, 0.0, np.nan), np.where(x <= s.max_ms, met, 0.0))
    return met


# --------------------------------------------------------------------------- one variant


def breakdown(logs: LoggedRequests, spec: ExperimentSpec, key: str, policy: PolicyT, *,
              share: float, alpha: float) -> PolicyBreakdown:
    """One policy variant's breakdown. ``share``: the variant's weight share (the logged
    propensities are the policy's own probabilities times it)."""
    rows = variant_rows(logs, key)
    n = int(rows.size)
    unit = logs.unit[rows]
    custom = custom_metrics(spec)
    objective = policy.objective if isinstance(policy, SloRouter) else None
    out = PolicyBreakdown(variant=key, kind=policy.kind, requests=n, units=int(np.unique(unit).size),
                          objective=objective, notes=list(logs.notes))
    if not n:
        out.notes.append("no logged requests of this variant (with an arm and a propensity) yet")
    versions = [str(v) for v in np.asarray(logs.policy_version or [""] * logs.n, dtype=object)[rows]]
    counted = Counter(v for v in versions if v)
    if counted:
        out.model_version = min(counted, key=lambda v: (-counted[v], v))
        if len(counted) > 1:
            out.notes.append(f"its requests were decided under {len(counted)} model versions; model_version is the "
                             "most frequent")
    if isinstance(policy, SloRouter) and n:
        uniform = sum(1 for v in versions if v.startswith(UNIFORM_PREFIX)) / n
        out.exploring = uniform > 0.5
        if uniform > 0:
            out.notes.append(f"{uniform:.1%} of its requests were decided without a model (uniform exploration)"
                             + ("; exploring: the arms' shares reflect exploration, not the router's choices"
                                if out.exploring else ""))

    slos = policy.slos() if isinstance(policy, SloRouter) else ()
    for s in slos:
        x = np.asarray(logs.values.get(s.latency, np.full(logs.n, np.nan)), dtype=float)[rows]
        out.slo.append(slo_compliance(s, x, unit, alpha))

    names = [m for m in dict.fromkeys([*([objective] if objective else []), *ARM_METRICS])
             if m in PER_REQUEST_METRICS or m in custom]
    sources = {m: objective_of(m, custom).source for m in names}
    labelled = bool(np.isfinite(np.asarray(logs.values.get("correct", np.full(logs.n, np.nan)))[rows]).any())
    names = [m for m in names if m == objective or sources[m] != "correct" or labelled]
    within = logs.propensity[rows] / share if share > 0 else np.full(n, np.nan)
    for arm in policy.arm_names:
        a = arm_action(logs, key, arm)
        mine = logs.action[rows] == a
        row = ArmRow(arm=arm, requests=int(mine.sum()))
        if n:
            res = unit_mean(unit, mine.astype(float), alpha)
            row.share, row.share_ci = res["estimate"], list(res["ci"])
        if mine.any():
            row.mean_propensity = float(within[mine].mean())
            if slos:
                met = _meets_every(slos, logs, rows[mine])
                known = ~np.isnan(met)
                row.slo_compliance = float(met[known].mean()) if known.any() else None
        for m in names:
            r = np.asarray(logs.values.get(sources[m], np.full(logs.n, np.nan)), dtype=float)[rows[mine]]
            has = np.isfinite(r)
            metric = ArmMetric(metric=m, n=int(has.sum()))
            if has.any():
                res = unit_mean(unit[mine][has], r[has], alpha)
                metric.estimate, metric.ci = res["estimate"], list(res["ci"])
            row.metrics.append(metric)
        out.arms.append(row)
    return out


def policy_breakdowns(logs: LoggedRequests, spec: ExperimentSpec, policies: Mapping[str, PolicyT]) -> list[PolicyBreakdown]:
    """Every policy variant's breakdown, in the experiment's variant order."""
    shares = variant_shares(spec)
    return [breakdown(logs, spec, v.key, policies[v.key], share=shares[v.key], alpha=spec.alpha)
            for v in spec.variants if v.key in policies]


def policy_results(table: Any, spec: ExperimentSpec) -> list[PolicyBreakdown] | None:
    """``results.policies`` from an Arrow table of the experiment's events; None when the
    experiment has no policy variant. Raises :class:`~.spec.PolicyInvalid` for a bad policy."""
    if not has_policies(spec):
        return None
    from .logs import experiment_policies, requests_from_table

    policies = experiment_policies(spec)
    logs = requests_from_table(table, spec, sources=logged_sources(spec, policies))
    return policy_breakdowns(logs, spec, policies)
