from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from ablab.platform.stats.allocator import ArmState, arms_from_stats, thompson_weights
from ablab.platform.stats.offline import aggregate_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events
from ablab.platform.stats.timeseries import timeseries


def _window_rows():
    rng = np.random.default_rng(0)
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    rows, raw = [], {"a": [], "b": []}
    for w in range(6):
        for variant, mu in (("a", 100.0), ("b", 90.0)):
            x = rng.normal(mu, 10, 50)
            raw[variant].append(x)
            rows.append({"variant": variant, "window_start": t0 + timedelta(seconds=10 * w), "n": 50, "errors": w % 2,
                         "e2e_ms_sum": x.sum(), "e2e_ms_sumsq": (x**2).sum(), "e2e_ms_p95": float(np.quantile(x, 0.95)),
                         "labeled": 10, "correct": 8})
    return rows[::-1], raw  # unordered input


def test_timeseries_points_and_cumulative_agree_with_raw_data():
    rows, raw = _window_rows()
    out = timeseries(rows, experiment="e", metric="e2e_ms")
    assert out["window_s"] == 10 and [s["variant"] for s in out["series"]] == ["a", "b"]
    a = out["series"][0]["points"]
    assert a[0]["ts"] < a[1]["ts"]
    assert a[0]["value"] == pytest.approx(raw["a"][0].mean())
    assert a[-1]["cumulative"]["value"] == pytest.approx(np.concatenate(raw["a"]).mean())
    assert a[-1]["cumulative"]["n"] == 300
    err = timeseries(rows, experiment="e", metric="error_rate")["series"][0]["points"]
    assert err[1]["value"] == pytest.approx(1 / 50) and err[-1]["cumulative"]["value"] == pytest.approx(3 / 300)
    p95 = timeseries(rows, experiment="e", metric="e2e_ms_p95")["series"][1]["points"]
    assert p95[0]["value"] == pytest.approx(np.quantile(raw["b"][0], 0.95)) and p95[0]["cumulative"] is None
    with pytest.raises(ValueError, match="metric"):
        timeseries(rows, experiment="e", metric="speed")


def test_thompson_prefers_the_best_arm_that_meets_the_sla():
    arms = {
        "control": ArmState(800, 1000, 300, 5),
        "better": ArmState(850, 1000, 310, 5),
        "best_but_slow": ArmState(900, 1000, 450, 5),  # violates the 400 ms SLA
    }
    w = thompson_weights(arms, sla=400, seed=1)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["better"] > 0.9 and w["best_but_slow"] == pytest.approx(0.02)
    assert thompson_weights(arms, sla=400, seed=1) == w  # deterministic given the seed
    relaxed = thompson_weights(arms, sla=600, seed=1)
    assert relaxed["best_but_slow"] > 0.9


def test_thompson_from_engine_stats():
    variants = {"control": VariantEffect(weight=0.5), "fast": VariantEffect(weight=0.5, latency=0.7, accuracy=0.8)}
    ev = synthetic_events(n_requests=10_000, n_units=1_000, variants=variants, seed=3)
    spec = parse_spec(spec_dict(variants))
    arms = arms_from_stats(spec, aggregate_events(ev, spec).stats, reward="accuracy", constraint="ttft_ms_p95")
    assert arms["fast"].constraint_mean < arms["control"].constraint_mean
    w = thompson_weights(arms, sla=0.5 * (arms["fast"].constraint_mean + arms["control"].constraint_mean))
    assert w["fast"] > 0.9
