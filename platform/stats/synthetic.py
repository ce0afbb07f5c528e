"""Seeded synthetic event streams in the CONTRACTS shape, for tests and benchmarks.

Users differ in speed (a per-user latency multiplier) and activity (gamma-distributed
request rates), so request-level metrics are genuinely clustered by user and the
delta method matters. Labels arrive for a random share of requests, minutes late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from ablab.platform.fields import SLA_METRIC

PRICE_PER_DEVICE_HOUR = 2.5


@dataclass(frozen=True, slots=True)
class VariantEffect:
    weight: float = 1.0
    latency: float = 1.0  # multiplier on TTFT and TPOT
    accuracy: float = 0.80
    cost: float = 1.0  # multiplier on device-seconds
    error_rate: float = 0.01
    strategy: Mapping[str, Any] | None = None


DEFAULT_VARIANTS: dict[str, VariantEffect] = {
    "control": VariantEffect(weight=0.5),
    "compressed": VariantEffect(weight=0.5, latency=0.9, accuracy=0.79, cost=0.85,
                                strategy={"compression": {"method": "entropy"}}),
}


def synthetic_events(
    *,
    n_requests: int = 100_000,
    n_units: int = 10_000,
    variants: Mapping[str, VariantEffect] | None = None,
    unit: str = "user",
    label_rate: float = 0.2,
    seed: int = 0,
    experiment: str = "exp",
    start: str = "2026-12-01T00:00:00Z",
    duration_s: float = 3600.0,
    pre_period_requests: int = 0,
    user_sd: float = 0.3,
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    variants = dict(variants or DEFAULT_VARIANTS)
    names = list(variants)
    weights = np.array([variants[v].weight for v in names], dtype=float)
    weights /= weights.sum()
    eff = {k: np.array([getattr(variants[v], k) for v in names]) for k in ("latency", "accuracy", "cost", "error_rate")}

    user_speed = rng.lognormal(0.0, user_sd, n_units)
    activity = rng.gamma(0.7, 1.0, n_units)
    unit_variant = rng.choice(len(names), n_units, p=weights)
    req_unit = rng.choice(n_units, n_requests, p=activity / activity.sum())
    req_variant = rng.choice(len(names), n_requests, p=weights) if unit == "request" else unit_variant[req_unit]
    t0 = pd.Timestamp(start)
    offsets = np.sort(rng.uniform(0, duration_s, n_requests))
    ts = t0 + pd.to_timedelta(offsets, unit="s")

    inference = _requests(rng, req_unit, user_speed, eff, req_variant, n_requests)
    # trace ids are an inference event's identity: unique per experiment, so two seeded
    # experiments in one store never collapse into each other
    trace = np.char.add(f"{experiment}-t", np.arange(n_requests).astype(str))
    units_str = np.char.add("u", np.arange(n_units).astype(str))
    inference.update(
        type="inference", trace_id=trace, experiment=experiment,
        variant=np.array(names)[req_variant], unit_id=units_str[req_unit], ts=ts,
    )
    frames = [pd.DataFrame(inference)]

    labeled = np.flatnonzero(rng.random(n_requests) < label_rate)
    p_correct = np.clip(eff["accuracy"][req_variant[labeled]], 0, 1)
    frames.append(pd.DataFrame({
        "type": "feedback", "trace_id": trace[labeled], "experiment": experiment,
        "variant": np.array(names)[req_variant[labeled]], "unit_id": units_str[req_unit[labeled]],
        "ts": ts[labeled] + pd.to_timedelta(rng.exponential(180, labeled.size), unit="s"),
        "correct": (rng.random(labeled.size) < p_correct).astype(np.int64), "source": "human",
    }))

    seen = np.unique(req_unit)
    if unit != "request":
        frames.append(pd.DataFrame({
            "type": "exposure", "trace_id": np.char.add("x", seen.astype(str)), "experiment": experiment,
            "variant": np.array(names)[unit_variant[seen]], "unit_id": units_str[seen], "ts": t0,
        }))
    if pre_period_requests and unit != "request":
        pre_unit = rng.choice(n_units, pre_period_requests, p=activity / activity.sum())
        ones = np.zeros(pre_period_requests, dtype=int)  # pre-period: everyone on the control path
        base = {k: np.ones(1) if k != "error_rate" else eff[k][:1] for k in eff}
        base["accuracy"] = eff["accuracy"][:1]
        pre = _requests(rng, pre_unit, user_speed, base, ones, pre_period_requests)
        pre.update(
            type="inference", trace_id=np.char.add(f"{experiment}-p", np.arange(pre_period_requests).astype(str)),
            experiment=experiment, variant=None, unit_id=units_str[pre_unit],
            ts=t0 - pd.to_timedelta(rng.uniform(1, 7 * 86400, pre_period_requests), unit="s"),
        )
        frames.append(pd.DataFrame(pre))
    out = pd.concat(frames, ignore_index=True)
    out.insert(0, "v", 1)
    return out


def _requests(
    rng: np.random.Generator, req_unit: NDArray[Any], user_speed: NDArray[Any], eff: Mapping[str, NDArray[Any]],
    req_variant: NDArray[Any], n: int,
) -> dict[str, Any]:
    speed = user_speed[req_unit] * eff["latency"][req_variant]
    output_tokens = 1 + rng.poisson(40, n)
    prompt_tokens = 64 + rng.poisson(200, n)
    ttft = rng.lognormal(np.log(120.0), 0.35, n) * speed
    tpot = rng.lognormal(np.log(18.0), 0.2, n) * speed
    e2e = ttft + tpot * (output_tokens - 1)
    device_s = e2e / 1000.0 * 0.25 * eff["cost"][req_variant]
    error = np.full(n, None, dtype=object)
    error[rng.random(n) < eff["error_rate"][req_variant]] = "timeout"
    return {
        "ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": np.where(output_tokens > 1, tpot, np.nan),
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "device_s": device_s,
        "cost_usd": device_s * PRICE_PER_DEVICE_HOUR / 3600.0, "price_version": "2026-12-01", "error": error,
    }


DEMO_SLOS: dict[str, float] = {"ttft_ms": 200, "tpot_ms": 25}
"""SLOs the synthetic latencies (TTFT ≈ 120 ms, TPOT ≈ 18 ms, times a user's speed) mostly meet."""
DEMO_GUARDRAILS: tuple[dict[str, Any], ...] = (
    {"metric": SLA_METRIC, "max": 400}, {"metric": "accuracy", "margin": 0.02},
)
"""Guardrails of the demo spec (``ablab synth --config-out``)."""


def spec_dict(
    variants: Mapping[str, VariantEffect] | None = None, *, key: str = "exp", unit: str = "user", **extra: Any
) -> dict[str, Any]:
    """An experiment definition matching :func:`synthetic_events`."""
    variants = dict(variants or DEFAULT_VARIANTS)
    names = list(variants)
    return {
        "key": key,
        "unit": unit,
        "control": names[0],
        "variants": [{"key": k, "weight": v.weight, "strategy": dict(v.strategy or {})} for k, v in variants.items()],
        **extra,
    }
