"""Attribution: which variants are worth having, and which strategy factors earned the gain.

1. The Pareto frontier over latency (min), cost (min) and accuracy (max).
2. Factor effects: weighted least squares of the variants' estimates on treatment-coded
   factor dummies (baseline = the control's levels) plus every identifiable interaction.
   In a full 2^k factorial the fit is saturated: a main effect is the factor's effect with
   the others at control levels; an interaction is the departure from additivity.
3. Exact Shapley decomposition of the best variant's gain over control into factor shares:
   v(S) is the value with the factors in S switched to the best variant's levels (the
   observed variant where it exists, the fitted model otherwise), and by construction
   v(all) − v(none) is the observed gain, so the shares sum to it exactly.

Everything is linear in the variants' estimates, so every effect and share carries a
variance Σ wᵢ² Var(estimateᵢ) over independent arms and gets a normal interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ablab.platform import fields

from . import _dist
from .aggregates import VariantStats
from .engine import arm_estimate, empty_variant, json_ready
from .result_models import Attribution, Factorial, Pareto, ParetoPoint
from .spec import ExperimentSpec

PARETO_OBJECTIVES = {fields.HEADLINE_LATENCY: "min", fields.COST_FIELD: "min", "accuracy": "max"}
ATTRIBUTION_METRICS = (fields.HEADLINE_LATENCY, "accuracy", fields.COST_FIELD)


def pareto_frontier(points: Mapping[str, Mapping[str, float]], objectives: Mapping[str, str] = PARETO_OBJECTIVES) -> list[dict[str, Any]]:
    """Each point with ``on_frontier`` and the variants that dominate it. Missing values rank worst."""

    def value(v: str, k: str) -> float:
        x = points[v].get(k)
        bad = math.inf if objectives[k] == "min" else -math.inf
        return bad if x is None or not math.isfinite(x) else float(x)

    def better_or_equal(a: str, b: str, k: str) -> bool:
        return value(a, k) <= value(b, k) if objectives[k] == "min" else value(a, k) >= value(b, k)

    out = []
    for v in points:
        dominators = [
            o for o in points
            if o != v and all(better_or_equal(o, v, k) for k in objectives)
            and any(value(o, k) != value(v, k) for k in objectives)
        ]
        out.append({"variant": v, **{k: points[v].get(k) for k in objectives}, "on_frontier": not dominators, "dominated_by": dominators})
    return out


def varying_factors(levels: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names = sorted({f for lv in levels.values() for f in lv})
    return [f for f in names if len({repr(lv.get(f)) for lv in levels.values()}) > 1]


Levels = Mapping[str, Mapping[str, Any]]  # variant → factor → level
Term = tuple[tuple[str, Any], ...]  # (factor, level) dummies multiplied together; () is the intercept
FloatArray = NDArray[np.float64]


def _dummies(levels: Levels, control: str, factors: Sequence[str]) -> list[tuple[str, Any]]:
    """Columns (factor, level) for every non-control level present."""
    cols: list[tuple[str, Any]] = []
    for f in factors:
        base = levels[control].get(f)
        seen: list[Any] = []
        for v in levels:
            lv = levels[v].get(f)
            if lv != base and lv not in seen:
                seen.append(lv)
        cols += [(f, lv) for lv in seen]
    return cols


def _design(levels: Levels, variants: Sequence[str], control: str, factors: Sequence[str]) -> tuple[list[Term], FloatArray]:
    """Treatment-coded design with the identifiable interactions (greedy by order, full rank kept)."""
    dummies = _dummies(levels, control, factors)
    # by position: a level may be a mapping (a policy variant's whole policy), which is unhashable
    indicator = [np.array([1.0 if levels[v].get(d[0]) == d[1] else 0.0 for v in variants]) for d in dummies]
    terms: list[Term] = [()]
    cols = [np.ones(len(variants))]
    for order in range(1, len(factors) + 1):
        for combo in itertools.combinations(range(len(dummies)), order):
            if len({dummies[i][0] for i in combo}) < order:
                continue  # two levels of one factor never co-occur
            col = np.prod([indicator[i] for i in combo], axis=0)
            if not col.any():
                continue
            trial = np.column_stack([*cols, col])
            if np.linalg.matrix_rank(trial) == trial.shape[1]:
                terms.append(tuple(dummies[i] for i in combo))
                cols.append(col)
    return terms, np.column_stack(cols)


def _level_label(level: Any) -> str:
    """Short enough for a table: a long level (a system prompt) is cut, keeping its start."""
    text = str(level)
    return text if len(text) <= 48 else text[:45] + "..."


def _term_name(term: Term) -> str:
    return " × ".join(f"{f}={_level_label(lv)}" for f, lv in term) if term else "intercept"


def _normal(est: float, var: float, alpha: float) -> dict[str, Any]:
    if not (math.isfinite(var) and var > 0):
        return {"estimate": est, "ci": [math.nan, math.nan], "p_value": math.nan}
    se = math.sqrt(var)
    z = float(_dist.norm_ppf(1 - alpha / 2))
    return {"estimate": est, "ci": [est - z * se, est + z * se], "p_value": float(2 * _dist.norm_sf(abs(est) / se))}


def factorial_analysis(
    *,
    levels: Mapping[str, Mapping[str, Any]],
    estimates: Mapping[str, float],
    variances: Mapping[str, float],
    control: str,
    lower_is_better: bool,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Factor effects (with CIs) and the exact Shapley split of the best variant's gain."""
    variants = [v for v in levels if math.isfinite(estimates.get(v, math.nan)) and variances.get(v, 0) > 0]
    if control not in variants or len(variants) < 2:
        return {"error": "not_enough_data", "effects": [], "shapley": None}
    factors = varying_factors({v: levels[v] for v in variants})
    y = np.array([estimates[v] for v in variants])
    var = np.array([variances[v] for v in variants])
    terms, X = _design(levels, variants, control, factors)
    W = np.diag(1 / var)
    A = np.linalg.solve(X.T @ W @ X, X.T @ W)  # β = A y: each coefficient is linear in the estimates
    beta = A @ y
    effects = [
        {"term": _term_name(t), "factors": [f for f, _ in t], "order": len(t), **_normal(float(b), float((a**2 * var).sum()), alpha)}
        for t, b, a in zip(terms[1:], beta[1:], A[1:])
    ]
    treatments = [v for v in variants if v != control]
    best = min(treatments, key=lambda v: estimates[v]) if lower_is_better else max(treatments, key=lambda v: estimates[v])
    return {
        "factors": factors,
        "design": "saturated" if X.shape[0] == X.shape[1] else "partial",
        "effects": effects,
        "shapley": _shapley(levels, variants, control, best, factors, terms, A, y, var, alpha),
    }


def _shapley(
    levels: Levels, variants: Sequence[str], control: str, best: str, factors: Sequence[str], terms: Sequence[Term],
    A: FloatArray, y: FloatArray, var: FloatArray, alpha: float,
) -> dict[str, Any]:
    players = [f for f in factors if levels[best].get(f) != levels[control].get(f)]
    index = {v: i for i, v in enumerate(variants)}
    e_control = np.eye(len(variants))[index[control]]

    def cell_weights(subset: frozenset[str]) -> FloatArray:
        """Weights over the estimates giving v(S) = value(cell S) − value(control)."""
        cell = {f: (levels[best].get(f) if f in subset else levels[control].get(f)) for f in factors}
        for v in variants:  # an observed variant at exactly this cell
            if all(levels[v].get(f) == cell[f] for f in factors):
                hit: FloatArray = np.eye(len(variants))[index[v]] - e_control
                return hit
        row = np.array([1.0 if all(cell[f] == lv for f, lv in t) else 0.0 for t in terms])
        fitted: FloatArray = row @ A - e_control
        return fitted

    n = len(players)
    cache = {frozenset(s): cell_weights(frozenset(s)) for r in range(n + 1) for s in itertools.combinations(players, r)}
    shares = []
    for p in players:
        others = [q for q in players if q != p]
        w = np.zeros(len(variants))
        for r in range(n):
            coef = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
            for s in itertools.combinations(others, r):
                w += coef * (cache[frozenset(s) | {p}] - cache[frozenset(s)])
        shares.append((p, w))
    total_w = cache[frozenset(players)]
    total = float(total_w @ y)
    out = []
    for p, w in shares:
        share = float(w @ y)
        out.append({"factor": p, "from": levels[control].get(p), "to": levels[best].get(p),
                    **_normal(share, float((w**2 * var).sum()), alpha),
                    "fraction": share / total if total else math.nan})
    return {"best_variant": best, "total": _normal(total, float((total_w**2 * var).sum()), alpha), "shares": out,
            "sum_of_shares": float(sum(s["estimate"] for s in out))}


def strategy_levels(spec: ExperimentSpec, defaults: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Flat factor → level map per variant: built-in factors with their defaults filled in,
    gateway factors (``backend``, ``model``, ``system_prompt``, ``params.<field>``) and
    declared factors, where ``defaults`` (declared factors' defaults) fills what a variant
    leaves out. A factor a variant does not set has level None (the backend's default)."""
    from ablab.platform.strategy import open_strategy

    levels = {}
    for v in spec.variants:
        flat = open_strategy(v.strategy).factors()
        for name, default in (defaults or {}).items():
            flat.setdefault(name, default)
        levels[v.key] = flat
    return levels


def attribution_results(
    *,
    spec: ExperimentSpec,
    stats: Mapping[str, VariantStats],
    levels: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Sequence[str] | None = None,
    factor_defaults: Mapping[str, Any] | None = None,
    objectives: Mapping[str, str] | Sequence[str] | None = None,
) -> Attribution:
    """The ``GET /v1/experiments/{key}/attribution`` object, as the closed result models.

    ``metrics``: those to attribute to factors (default: latency, accuracy, cost and the
    experiment's custom primary metrics); ``objectives``: the Pareto frontier's axes, as
    ``{metric: min|max}`` or metric names (direction from the metric's definition).
    Custom metrics work in both.
    """
    if metrics is None:
        metrics = (*ATTRIBUTION_METRICS, *(m.name for m in spec.custom if m.name in spec.primary))
    if objectives is None:
        objectives = PARETO_OBJECTIVES
    elif not isinstance(objectives, Mapping):
        objectives = {n: "min" if spec.metric_def(n).lower_is_better else "max" for n in objectives}
    for name, goal in objectives.items():
        spec.metric_def(name)  # unknown names fail here, with the known ones listed
        if goal not in ("min", "max"):
            raise ValueError(f"objective {name}: must be min or max, got {goal!r}")
    stats = {v.key: stats.get(v.key) or empty_variant(spec.custom) for v in spec.variants}
    levels = dict(levels) if levels is not None else strategy_levels(spec, factor_defaults)
    arms = {name: {v: arm_estimate(spec, spec.metric_def(name), s) for v, s in stats.items()} for name in {*metrics, *objectives}}
    points = {v: {k: arms[k][v][0] for k in objectives} for v in stats}
    factorial = {}
    for name in metrics:
        factorial[name] = factorial_analysis(
            levels=levels,
            estimates={v: a[0] for v, a in arms[name].items()},
            variances={v: a[1] for v, a in arms[name].items()},
            control=spec.control,
            lower_is_better=bool(spec.metric_def(name).lower_is_better),  # resolved when validated
            alpha=spec.alpha,
        )
    return Attribution(
        experiment=spec.key,
        control=spec.control,
        # a point's objectives are open keys (metric names): made JSON-ready here, as no field checks them
        pareto=Pareto(objectives=dict(objectives), points=[ParetoPoint(**json_ready(p)) for p in pareto_frontier(points, objectives)]),
        factors={v: {f: levels[v].get(f) for f in varying_factors(levels)} for v in levels},
        factorial={name: Factorial.model_validate(f) for name, f in factorial.items()},
    )
