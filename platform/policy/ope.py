"""Off-policy evaluation: what a candidate policy would have achieved on the logged requests.

Pure numpy. Input: the logged requests (:class:`LoggedRequests`: which action each took, with
what probability, its randomization unit, features and per-request values) and the
candidate's probability of every logged action for every request (n × A). Output, for one
metric (a mean of one value per request):

- **IPS** ``Σ wᵢ rᵢ / n`` with ``wᵢ = π(aᵢ|xᵢ) / μᵢ`` (μ: the logged propensity);
- **SNIPS** ``Σ wᵢ rᵢ / Σ wᵢ``;
- **DR** ``Σ ψᵢ / n``, ``ψᵢ = Σₐ π(a|xᵢ) q̂(xᵢ,a) + wᵢ (rᵢ − q̂(xᵢ,aᵢ))``, with the reward model q̂
  (per action and context cell, a mean shrunk toward the action's mean) cross-fitted: fitted
  on one half of the randomization units, applied to the other.

Each estimate is a ratio of per-unit sums, so its 95 % interval comes from the units
(requests of one unit are dependent: the same person, the same assignment): the delta
method over units, ``Var = U/(U−1) Σᵤ (Nᵤ − V Dᵤ)² / (Σᵤ Dᵤ)²``, then the normal quantile.

Also: the effective sample size ``(Σw)²/Σw²``, the mean weight (≈ 1 when the propensities
are right), and **support**: the share of the candidate's probability mass that falls on
(context cell, action) pairs the logs never tried or tried with a propensity below
``min_propensity`` — where every estimator is blind, and a warning says so.

Rows whose value is absent (an unlabelled request, for accuracy) are left out: the estimate
assumes labels are missing independently of the action given the context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from .model import Binning

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
ESTIMATORS = ("ips", "snips", "dr")
SUPPORT_WARN_SHARE = 0.01  # candidate mass on unsupported pairs above which results warn


@dataclass(frozen=True, eq=False)
class LoggedRequests:
    """One row per logged request (deduplicated, in the experiment, in its period)."""

    actions: tuple[str, ...]  # names of the logged actions (a fixed variant, or variant.arm)
    action: Ints  # index into ``actions``
    propensity: Floats  # P(this action | features) under the logging design, in (0, 1]
    unit: Ints  # randomization unit code (0..U-1)
    features: Mapping[str, Any]  # feature → array (prompt_tokens, max_tokens, attr.<name>)
    values: Mapping[str, Floats]  # source → per-request value (NaN: absent)
    policy_version: Sequence[str] | None = None
    strategies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # action → its strategy, where known
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.action.size)


def unit_ratio(num_u: Floats, den_u: Floats, alpha: float) -> dict[str, Any]:
    den = float(den_u.sum())
    if den <= 0 or num_u.size == 0:
        return {"estimate": None, "ci": [None, None], "se": None}
    v = float(num_u.sum()) / den
    u = num_u.size
    if u < 2:
        return {"estimate": v, "ci": [None, None], "se": None}
    resid = num_u - v * den_u
    se = math.sqrt(u / (u - 1) * float(np.dot(resid, resid))) / den
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return {"estimate": v, "ci": [v - z * se, v + z * se], "se": se}


def _per_unit(unit: Ints, x: Floats, n_units: int) -> Floats:
    return np.asarray(np.bincount(unit, weights=x, minlength=n_units), dtype=float)


def reward_model(action: Ints, cell: Ints, reward: Floats, n_actions: int, n_cells: int,
                 prior: float = 10.0) -> Floats:
    """q̂ as an actions × cells table: the cell's mean reward of each action, shrunk toward the
    action's mean (and an action never seen toward the overall mean)."""
    overall = float(reward.mean()) if reward.size else 0.0
    q = np.empty((n_actions, n_cells))
    for a in range(n_actions):
        rows = action == a
        m = np.bincount(cell[rows], minlength=n_cells)
        s = np.bincount(cell[rows], weights=reward[rows], minlength=n_cells)
        base = float(reward[rows].mean()) if rows.any() else overall
        q[a] = (s + prior * base) / (m + prior)
    return q


def estimate(
    logs: LoggedRequests,
    target: Floats,
    source: str,
    *,
    binning: Binning | None = None,
    alpha: float = 0.05,
    min_propensity: float = 1e-3,
    folds: int = 2,
    logging_probs: Floats | None = None,
) -> dict[str, Any]:
    """IPS, SNIPS and DR estimates of the candidate whose probabilities are ``target``
    (n × A, over ``logs.actions``) on the per-request ``source`` value.

    ``binning``: the contexts of the reward model and of the support check (default: one
    cell). ``logging_probs``: the full n × A logging probabilities where known, for an exact
    support check (otherwise support is what the logs show per cell)."""
    n_all = logs.n
    a_count = len(logs.actions)
    target = np.asarray(target, dtype=float)
    if target.shape != (n_all, a_count):
        raise ValueError(f"target has shape {target.shape}; expected ({n_all}, {a_count})")
    r_all = np.asarray(logs.values.get(source, np.full(n_all, np.nan)), dtype=float)
    keep = np.isfinite(r_all) & (logs.propensity > 0)
    idx = np.flatnonzero(keep)
    action, mu, r, pi = logs.action[idx], logs.propensity[idx], r_all[idx], target[idx]
    units, unit = np.unique(logs.unit[idx], return_inverse=True)
    unit = unit.reshape(-1).astype(np.int64)
    n_units = units.size
    n = idx.size
    cells_all = binning.cells(logs.features, n_all) if binning is not None else np.zeros(n_all, dtype=np.int64)
    n_cells = binning.n_cells if binning is not None else 1
    cell = cells_all[idx]

    w = pi[np.arange(n), action] / mu if n else np.zeros(0)
    ones = np.ones(n)
    out: dict[str, Any] = {"source": source, "n": int(n), "units": int(n_units), "rows_without_value": int(n_all - n)}
    out["ips"] = unit_ratio(_per_unit(unit, w * r, n_units), _per_unit(unit, ones, n_units), alpha)
    out["snips"] = unit_ratio(_per_unit(unit, w * r, n_units), _per_unit(unit, w, n_units), alpha)

    # DR, cross-fitted over units: fold = unit code mod folds (codes are the sorted unit ids,
    # so every reader of the same logs makes the same folds)
    psi = np.zeros(n)
    fold = unit % folds if n_units >= folds else np.zeros(n, dtype=np.int64)
    for f in range(folds):
        test = fold == f
        train = ~test if (~test).any() else test
        q = reward_model(action[train], cell[train], r[train], a_count, n_cells)
        qx = q[:, cell[test]].T  # rows × actions
        psi[test] = (pi[test] * qx).sum(axis=1) + w[test] * (r[test] - qx[np.arange(int(test.sum())), action[test]])
    out["dr"] = unit_ratio(_per_unit(unit, psi, n_units), _per_unit(unit, ones, n_units), alpha)

    sw, sw2 = float(w.sum()), float(np.dot(w, w))
    out["ess"] = sw * sw / sw2 if sw2 > 0 else 0.0
    out["mean_weight"] = sw / n if n else None
    out["support"] = support(logs, target, cells_all, n_cells, binning, min_propensity, logging_probs)
    return out


def support(logs: LoggedRequests, target: Floats, cells: Ints, n_cells: int, binning: Binning | None,
            min_propensity: float, logging_probs: Floats | None) -> dict[str, Any]:
    """The candidate's probability mass on (cell, action) pairs without support, over all
    logged requests, and the worst pairs."""
    a_count = len(logs.actions)
    if logging_probs is not None:
        blind = np.asarray(logging_probs, dtype=float) < min_propensity
        mass_rows = (target * blind).sum(axis=1)
        per_pair = np.zeros((n_cells, a_count))
        np.add.at(per_pair, cells, target * blind)
    else:
        flat = cells * a_count + logs.action
        tried = np.bincount(flat, minlength=n_cells * a_count).reshape(n_cells, a_count)
        lowest = np.full(n_cells * a_count, np.inf)
        np.minimum.at(lowest, flat, logs.propensity)
        lowest = lowest.reshape(n_cells, a_count)
        blind_pair = (tried == 0) | (lowest < min_propensity)
        mass_rows = (target * blind_pair[cells]).sum(axis=1)
        per_pair = np.zeros((n_cells, a_count))
        np.add.at(per_pair, cells, target * blind_pair[cells])
    share = float(mass_rows.mean()) if mass_rows.size else 0.0
    worst = np.argsort(-per_pair, axis=None)[:5]
    pairs = []
    for flat_i in worst:
        c, a = divmod(int(flat_i), a_count)
        if per_pair[c, a] <= 0:
            break
        pairs.append({"context": binning.describe(c) if binning is not None else {}, "arm": logs.actions[a],
                      "candidate_share": float(per_pair[c, a]) / max(logs.n, 1)})
    warning = None
    if share > SUPPORT_WARN_SHARE:
        warning = (f"{share:.1%} of the candidate's choices fall on arms the logs never tried (or tried with "
                   f"propensity < {min_propensity:g}) in those contexts; no estimator sees them, so the estimates "
                   "are unreliable there")
    return {"unsupported_share": share, "warning": warning, "pairs": pairs}


def logged_means(logs: LoggedRequests, source: str, alpha: float = 0.05) -> list[dict[str, Any]]:
    """Each logged action's own mean of ``source`` (the on-policy measurement beside the
    estimates), with its interval over units."""
    r_all = np.asarray(logs.values.get(source, np.full(logs.n, np.nan)), dtype=float)
    out = []
    for a, name in enumerate(logs.actions):
        rows = (logs.action == a) & np.isfinite(r_all)
        units, unit = np.unique(logs.unit[rows], return_inverse=True)
        unit = unit.reshape(-1).astype(np.int64)
        res = unit_ratio(_per_unit(unit, r_all[rows], units.size), _per_unit(unit, np.ones(int(rows.sum())), units.size), alpha)
        out.append({"arm": name, "n": int(rows.sum()), "units": int(units.size), **res})
    return out
