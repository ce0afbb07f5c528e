"""The per-request decision of a policy: features → (arm, propensity, version, probabilities).

Pure and fast: a :class:`Decider` is built once per (policy, model) and each decision is a
few comparisons and one hash (``benchmarks/bench_policy.py``). The draw is deterministic:
``u = murmur3("{salt}:{draw_key}") / 2**32`` picks the arm whose cumulative probability
(arms in name order) first exceeds ``u``, so the same request (``draw_key``: its trace id) with the same features
and model version gets the same arm, and the probability vector — hence the logged
propensity — is a function of (features, version) alone, recomputable from the logs.

Probabilities:

- ``slo_router`` with a model: ``explore`` on every arm plus the rest on the model's choice
  for the request's cell (:mod:`.model`); without a model: uniform (``uniform=True``, version
  ``uniform:<policy hash>``).
- ``rule``: the first rule whose conditions all hold picks its arm (else ``default``), with
  ``explore`` on every arm when set; version ``rule:<policy hash>``.
- ``fixed``: probability 1 on its arm.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mmh3
import numpy as np
import numpy.typing as npt

from .model import PolicyModel
from .spec import Condition, PolicyT, RulePolicy, SloRouter, is_numeric

Floats = npt.NDArray[np.float64]
_TWO32 = float(2**32)


@dataclass(frozen=True, slots=True)
class Decision:
    arm: str
    propensity: float
    model_version: str
    probabilities: tuple[float, ...]  # in the order of the policy's arms
    uniform: bool = False  # no model yet: every arm equally likely


def _vector(k: int, chosen: int, explore: float) -> tuple[float, ...]:
    """``explore`` on each arm, the rest on ``chosen``; sums to 1 exactly up to rounding of the last term."""
    rest = 1.0 - explore * (k - 1)
    return tuple(rest if i == chosen else explore for i in range(k))


def _cumulative(p: Sequence[float]) -> tuple[float, ...]:
    out, total = [], 0.0
    for x in p:
        total += x
        out.append(total)
    out[-1] = math.inf  # u < 1 always lands somewhere, whatever the rounding
    return tuple(out)


def draw(salt: str, key: str) -> float:
    """The request's uniform draw in [0, 1)."""
    return mmh3.hash(f"{salt}:{key}", 0, signed=False) / _TWO32


# --------------------------------------------------------------------------- rule conditions

Check = Callable[[Any], bool]
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
}


def _check(feature: str, cond: Condition) -> Check:
    """One condition as a predicate on the feature's value (absent: false)."""
    bounds = cond.model_dump(by_alias=True, exclude_none=True)
    if is_numeric(feature):
        tests: list[tuple[Callable[[float, float], bool], float]] = []
        sets: list[tuple[bool, frozenset[float]]] = []  # (must be in, the set)
        for op, v in bounds.items():
            if op in _COMPARE:
                tests.append((_COMPARE[op], float(v)))
            else:
                sets.append((op == "in", frozenset(float(i) for i in v)))

        def numeric(x: Any) -> bool:
            if x is None or isinstance(x, str):
                return False
            xf = float(x)
            return xf == xf and all(t(xf, v) for t, v in tests) and all((xf in s) == inside for inside, s in sets)
        return numeric
    allowed: frozenset[str] | None = None
    excluded: set[str] = set()
    for op, v in bounds.items():
        items = frozenset(str(i) for i in (v if isinstance(v, list) else [v]))
        if op in ("eq", "in"):
            allowed = items if allowed is None else allowed & items
        else:
            excluded |= items

    def text(x: Any) -> bool:
        if x is None or x == "" or x != x:
            return False
        s = str(x)
        return (allowed is None or s in allowed) and s not in excluded
    return text


def _mask(feature: str, cond: Condition, column: Any, n: int) -> npt.NDArray[np.bool_]:
    """The vectorized :func:`_check` over ``n`` requests."""
    if column is None:
        return np.zeros(n, dtype=bool)
    bounds = cond.model_dump(by_alias=True, exclude_none=True)
    if is_numeric(feature):
        x = np.asarray(column, dtype=float)
        ok: npt.NDArray[np.bool_] = ~np.isnan(x)
        for op, v in bounds.items():
            if op in _COMPARE:
                ok &= np.asarray(_COMPARE[op](x, float(v)), dtype=bool)  # type: ignore[arg-type]  # numpy broadcasts the operator
            else:
                inside = np.isin(x, [float(i) for i in v])
                ok &= inside if op == "in" else ~inside
        return ok
    check = _check(feature, cond)
    arr = np.asarray(column, dtype=object)
    uniq, inv = np.unique(np.array(["\x00" if (v is None or v != v) else str(v) for v in arr], dtype=object),
                          return_inverse=True)
    hits = np.array([check(None if u == "\x00" else u) for u in uniq], dtype=bool)
    return np.asarray(hits[inv.reshape(-1)], dtype=bool)


# --------------------------------------------------------------------------- the decider


class Decider:
    """Decisions of one policy under one model version (None: no model yet)."""

    def __init__(self, policy: PolicyT, model: PolicyModel | None = None, *, salt: str = "") -> None:
        self.policy = policy
        self.arms: tuple[str, ...] = policy.arm_names
        self.salt = salt
        self.uniform = False
        k = len(self.arms)
        self._rules: list[tuple[list[tuple[str, Check]], int]] = []
        if isinstance(policy, SloRouter):
            if model is not None:
                if model.policy_hash != policy.content_hash or sorted(model.arms) != sorted(self.arms):
                    raise ValueError(f"model {model.version} was fitted for policy {model.policy_hash}, "
                                     f"not {policy.content_hash}")
                self.version = model.version
                self._binning = model.binning
                # the model indexes arms in its own order; vectors are in the policy's
                self._table = [_vector(k, self.arms.index(model.arms[c]), policy.explore) for c in model.choice]
            else:
                self.version = f"uniform:{policy.content_hash}"
                self.uniform = True
                self._table = []
            self._uniform = tuple(1.0 / k for _ in range(k))
        elif isinstance(policy, RulePolicy):
            self.version = f"rule:{policy.content_hash}"
            index = {a: i for i, a in enumerate(self.arms)}
            self._rules = [([(f, _check(f, c)) for f, c in rule.when.items()], index[rule.arm]) for rule in policy.rules]
            self._default = index[policy.default]
            self._by_arm = [_vector(k, i, policy.explore) for i in range(k)]
        else:
            self.version = f"fixed:{policy.arm}"
            index = {a: i for i, a in enumerate(self.arms)}
            self._by_arm = [_vector(k, index[policy.arm], 0.0)]
        self.model = model
        # the draw walks the arms in name order, so the arm a request gets does not depend on
        # the order a mapping lists them in (the probabilities are in the policy's order)
        self._draw_order = sorted(range(k), key=lambda i: self.arms[i])
        self._cums: dict[tuple[float, ...], tuple[float, ...]] = {}

    def probabilities(self, features: Mapping[str, Any]) -> tuple[float, ...]:
        """The probability of every arm (the policy's order) for a request with ``features``."""
        policy = self.policy
        if isinstance(policy, SloRouter):
            if self.uniform:
                return self._uniform
            return self._table[self._binning.cell_of(features)]
        if isinstance(policy, RulePolicy):
            for checks, arm in self._rules:
                if all(check(features.get(f)) for f, check in checks):
                    return self._by_arm[arm]
            return self._by_arm[self._default]
        return self._by_arm[0]

    def decide(self, features: Mapping[str, Any], draw_key: str) -> Decision:
        p = self.probabilities(features)
        cum = self._cums.get(p)
        if cum is None:
            cum = self._cums.setdefault(p, _cumulative([p[i] for i in self._draw_order]))
        i = self._draw_order[bisect.bisect_right(cum, draw(self.salt, draw_key))]
        return Decision(self.arms[i], p[i], self.version, p, self.uniform)

    def probability_matrix(self, columns: Mapping[str, Any], n: int) -> Floats:
        """``n`` × arms probabilities for logged requests (``columns``: feature → array), the
        vectorized :meth:`probabilities`."""
        k = len(self.arms)
        policy = self.policy
        if isinstance(policy, SloRouter):
            if self.uniform:
                return np.full((n, k), 1.0 / k)
            table = np.asarray(self._table, dtype=float)
            return np.asarray(table[self._binning.cells(columns, n)], dtype=float)
        if isinstance(policy, RulePolicy):
            chosen = np.full(n, -1, dtype=np.int64)
            for rule, (_, arm) in zip(policy.rules, self._rules):
                hit = np.ones(n, dtype=bool)
                for f, cond in rule.when.items():
                    hit &= _mask(f, cond, columns.get(f), n)
                chosen[(chosen < 0) & hit] = arm
            chosen[chosen < 0] = self._default
            return np.asarray(np.asarray(self._by_arm, dtype=float)[chosen], dtype=float)
        return np.tile(np.asarray(self._by_arm[0], dtype=float), (n, 1))


def recompute_propensity(policy: PolicyT, model: PolicyModel | None, features: Mapping[str, Any], arm: str) -> float:
    """The probability the policy gave ``arm`` for a request with ``features`` under ``model``
    (the logged ``policy_version``'s model): what its event's ``propensity`` must equal."""
    decider = Decider(policy, model)
    return decider.probabilities(features)[decider.arms.index(arm)]
