"""SLA-constrained Thompson sampling: re-weight variants every few windows (pure).

Each draw samples every arm's reward (Beta posterior of a success proportion, e.g.
accuracy or goodput) and its constrained metric (normal posterior, e.g. p95 TTFT with
the order-statistic standard error); the winner is the best reward among arms whose
draw meets the SLA (if none does, the arm closest to it). An arm's weight is its share
of wins, floored so no arm starves and the posterior keeps learning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ablab.platform.fields import SLA_METRIC

from .aggregates import VariantStats
from .engine import arm_estimate
from .spec import ExperimentSpec


@dataclass(frozen=True, slots=True)
class ArmState:
    successes: float
    trials: float
    constraint_mean: float
    constraint_se: float


def thompson_weights(
    arms: Mapping[str, ArmState], *, sla: float, draws: int = 20_000, floor: float = 0.02, seed: int = 0
) -> dict[str, float]:
    names = list(arms)
    if not names:
        return {}
    if floor * len(names) >= 1:
        raise ValueError(f"floor: {floor} × {len(names)} arms leaves nothing to allocate")
    rng = np.random.default_rng(seed)
    s = np.array([arms[k].successes for k in names], dtype=float)
    n = np.array([arms[k].trials for k in names], dtype=float)
    reward = rng.beta(s[:, None] + 1, np.maximum(n - s, 0)[:, None] + 1, (len(names), draws))
    mean = np.array([arms[k].constraint_mean for k in names], dtype=float)
    se = np.array([arms[k].constraint_se for k in names], dtype=float)
    unknown = ~np.isfinite(mean)  # no latency yet: optimistic at the SLA, wide
    mean = np.where(unknown, sla, mean)
    se = np.where(unknown | ~np.isfinite(se), max(abs(sla), 1.0), se)
    latency = rng.normal(mean[:, None], se[:, None], (len(names), draws))
    feasible = latency <= sla
    score = np.where(feasible, reward, -np.inf)
    winner = np.where(feasible.any(axis=0), score.argmax(axis=0), latency.argmin(axis=0))
    share = np.bincount(winner, minlength=len(names)) / draws
    weights = floor + (1 - floor * len(names)) * share
    return dict(zip(names, weights.tolist()))


def arms_from_stats(
    spec: ExperimentSpec, stats: Mapping[str, VariantStats], *, reward: str = "accuracy", constraint: str = SLA_METRIC
) -> dict[str, ArmState]:
    reward_def = spec.metric_def(reward)
    if reward_def.kind != "proportion" or reward_def.lower_is_better:
        raise ValueError(f"reward: {reward!r} must be a higher-is-better proportion (accuracy, goodput, or one defined so)")
    constraint_def = spec.metric_def(constraint)
    out = {}
    for v in spec.variants:
        vs = stats.get(v.key)
        if vs is None:
            out[v.key] = ArmState(0.0, 0.0, float("nan"), float("nan"))
            continue
        r = vs.ratios[reward]
        est, var, _, _ = arm_estimate(spec, constraint_def, vs)
        out[v.key] = ArmState(r.sum_x, r.sum_y, est, float(np.sqrt(var)) if var == var else float("nan"))
    return out
