"""A simulated serving environment with known latency and accuracy per arm and context: the
ground truth the policy and off-policy tests (and ``benchmarks/bench_policy.py``) check against.

Contexts: each randomization unit has a plan (``attr.plan``: free or pro) and a small unit
effect on accuracy (±``unit_effect``, so requests of one unit are dependent); each request
draws ``prompt_tokens`` from a few levels. Per arm: TTFT = ``(base + per_token ×
prompt_tokens) × lognormal(0, sigma)`` and P(correct) a table over (plan, prompt level).
Expected values are exact (:meth:`Environment.value`), not simulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .evaluate import Decider
from .ope import LoggedRequests

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Environment:
    arms: tuple[str, ...] = ("fast", "helpful", "expert")
    levels: tuple[float, ...] = (100.0, 400.0, 1200.0, 3000.0)  # prompt_tokens
    level_p: tuple[float, ...] = (0.3, 0.3, 0.25, 0.15)
    plans: tuple[str, ...] = ("free", "pro")
    plan_p: tuple[float, ...] = (0.5, 0.5)
    base_ms: tuple[float, ...] = (40.0, 80.0, 120.0)
    per_token_ms: tuple[float, ...] = (0.05, 0.12, 0.25)
    sigma: float = 0.2
    # accuracy[arm][plan][level]
    accuracy: tuple[tuple[tuple[float, ...], ...], ...] = field(default_factory=lambda: (
        ((0.55, 0.55, 0.55, 0.55), (0.55, 0.55, 0.55, 0.55)),
        ((0.70, 0.70, 0.70, 0.70), (0.65, 0.65, 0.65, 0.65)),
        ((0.45, 0.45, 0.45, 0.45), (0.85, 0.85, 0.85, 0.85)),
    ))
    unit_effect: float = 0.1

    def contexts(self, rng: np.random.Generator, n: int, n_units: int) -> tuple[Ints, Ints, Ints, Floats]:
        """(unit, plan index, level index, unit effect) of ``n`` requests over ``n_units`` units."""
        unit_plan = rng.choice(len(self.plans), size=n_units, p=self.plan_p)
        unit_eff = rng.choice([-self.unit_effect, self.unit_effect], size=n_units)
        unit = rng.integers(0, n_units, size=n).astype(np.int64)
        level = rng.choice(len(self.levels), size=n, p=self.level_p).astype(np.int64)
        return unit, unit_plan[unit].astype(np.int64), level, unit_eff[unit]

    def features(self, plan: Ints, level: Ints) -> dict[str, Any]:
        return {"prompt_tokens": np.asarray(self.levels)[level], "attr.plan": np.asarray(self.plans, dtype=object)[plan]}

    def outcomes(self, rng: np.random.Generator, arm: Ints, plan: Ints, level: Ints, effect: Floats) -> tuple[Floats, Floats]:
        """(ttft_ms, correct) of each request served by ``arm``."""
        pt = np.asarray(self.levels)[level]
        ttft = (np.asarray(self.base_ms)[arm] + np.asarray(self.per_token_ms)[arm] * pt) * rng.lognormal(0, self.sigma, arm.size)
        p = np.asarray(self.accuracy)[arm, plan, level] + effect
        return ttft, (rng.random(arm.size) < p).astype(float)

    def context_grid(self) -> tuple[Ints, Ints, Floats]:
        """Every (plan, level) context and its probability."""
        plan, level = np.meshgrid(np.arange(len(self.plans)), np.arange(len(self.levels)), indexing="ij")
        prob = np.outer(self.plan_p, self.level_p)
        return plan.ravel().astype(np.int64), level.ravel().astype(np.int64), prob.ravel()

    def value(self, decider: Decider, arm_index: Mapping[str, int] | None = None) -> float:
        """The exact expected accuracy of a policy (unit effects average to zero)."""
        plan, level, prob = self.context_grid()
        pi = decider.probability_matrix(self.features(plan, level), plan.size)
        index = arm_index or {a: i for i, a in enumerate(self.arms)}
        acc = np.asarray(self.accuracy)
        per_ctx = sum(pi[:, j] * acc[index[a], plan, level] for j, a in enumerate(decider.arms))
        return float(np.dot(prob, per_ctx))

    def ttft_quantile(self, decider: Decider, q: float, rng: np.random.Generator, n: int = 200_000) -> float:
        """The policy's TTFT quantile, by simulation (a mixture has no closed form)."""
        unit, plan, level, eff = self.contexts(rng, n, 1000)
        arm = sample(rng, decider.probability_matrix(self.features(plan, level), n))
        index = np.array([self.arms.index(a) for a in decider.arms])
        ttft, _ = self.outcomes(rng, index[arm], plan, level, eff)
        return float(np.quantile(ttft, q))


def sample(rng: np.random.Generator, probs: Floats) -> Ints:
    """One arm per row of an n × K probability matrix (vectorized draws, for simulation)."""
    u = rng.random(probs.shape[0])
    return np.asarray((u[:, None] >= np.cumsum(probs, axis=1)[:, :-1]).sum(axis=1), dtype=np.int64)


def simulate_logs(env: Environment, logging: Decider, rng: np.random.Generator, n: int, n_units: int) -> LoggedRequests:
    """Requests served by ``logging`` (its arms are the environment's), logged with their propensities."""
    unit, plan, level, eff = env.contexts(rng, n, n_units)
    features = env.features(plan, level)
    probs = logging.probability_matrix(features, n)
    arm = sample(rng, probs)
    index = np.array([env.arms.index(a) for a in logging.arms])
    ttft, correct = env.outcomes(rng, index[arm], plan, level, eff)
    return LoggedRequests(actions=logging.arms, action=arm, propensity=probs[np.arange(n), arm], unit=unit,
                          features=features, values={"correct": correct, "ttft_ms": ttft})


def experiment_events(env: Environment, router: Decider, rng: np.random.Generator, *, key: str, n: int,
                      n_units: int, control_arm: str = "helpful", start: str = "2026-01-01T00:00:00") -> tuple[
                          list[dict[str, Any]], dict[str, Any]]:
    """(events, experiment definition) of a two-variant experiment in the CONTRACTS shape:
    units split evenly between ``control`` (always ``control_arm``) and ``router`` (the
    ``router`` decider's policy, which logs ``arm``, ``propensity`` and ``policy_version``),
    with one feedback label per request."""
    from datetime import datetime, timedelta

    policy = router.policy
    arms = getattr(policy, "arms", {})
    spec = {"key": key, "control": "control", "unit": "user",
            "variants": [{"key": "control", "weight": 1, "strategy": arms.get(control_arm, {})},
                         {"key": "router", "weight": 1, "strategy": {"policy": policy.model_dump(mode="json")}}]}
    unit, plan, level, eff = env.contexts(rng, n, n_units)
    in_router = (unit % 2).astype(bool)
    features = env.features(plan, level)
    probs = router.probability_matrix(features, n)
    arm = sample(rng, probs)
    names = np.where(in_router, np.array([env.arms.index(router.arms[a]) for a in arm]), env.arms.index(control_arm))
    ttft, correct = env.outcomes(rng, names.astype(np.int64), plan, level, eff)
    t0 = datetime.fromisoformat(start)
    events: list[dict[str, Any]] = []
    for i in range(n):
        ts = (t0 + timedelta(seconds=i)).isoformat() + "Z"
        trace = f"{key}-{i}"
        e: dict[str, Any] = {
            "v": 1, "type": "inference", "ts": ts, "trace_id": trace, "experiment": key,
            "variant": "router" if in_router[i] else "control", "unit_id": f"u{unit[i]}",
            "ttft_ms": round(float(ttft[i]), 3), "e2e_ms": round(float(ttft[i]) * 3, 3), "tpot_ms": 5.0,
            "prompt_tokens": int(features["prompt_tokens"][i]), "output_tokens": 40, "device_s": 0.1,
            "cost_usd": 1e-5, "price_version": "sim", "strategy": "sim",
            "dims": {"plan": str(features["attr.plan"][i])},
        }
        if in_router[i]:
            e.update(arm=router.arms[arm[i]], propensity=float(probs[i, arm[i]]), policy_version=router.version)
        events.append(e)
        events.append({"v": 1, "type": "feedback", "ts": ts, "trace_id": trace, "correct": int(correct[i]),
                       "source": "judge"})
    return events, spec


def router_policy(env: Environment | None = None, *, explore: float = 0.05, slo_ms: float = 400.0) -> Any:
    """The environment's SLO router: its arms, prompt_tokens and attr.plan, TTFT p95 ≤ ``slo_ms``, accuracy."""
    from .spec import parse_policy

    env = env or Environment()
    return parse_policy({"kind": "slo_router", "arms": {a: {"system_prompt": f"You are {a}."} for a in env.arms},
                         "features": ["prompt_tokens", "attr.plan"], "slo": {"ttft_ms_p95": slo_ms},
                         "objective": "accuracy", "explore": explore})


def fit_after_exploring(policy: Any, env: Environment | None = None, *, seed: int = 1, n: int = 6000) -> Any:
    """The router's model after a uniform exploration phase of ``n`` requests (its start without a model)."""
    from .model import fit_model

    env = env or Environment()
    logs = simulate_logs(env, Decider(policy), np.random.default_rng(seed), n, n // 10)
    return fit_model(policy, logs.action, logs.features, {"ttft_ms": logs.values["ttft_ms"]}, logs.values["correct"],
                     lower_is_better=False)
