"""Statistical and structural properties of assignment (hypothesis + chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from ablab.platform.assignment import (
    AssignmentConfig,
    ExperimentSpec,
    HoldoutSpec,
    LayerSpec,
    VariantSpec,
    assign,
    assign_batch,
)
from ablab.platform.assignment.engine import assign_indices

UNITS = [f"u{i}" for i in range(100_000)]


def experiment(key: str = "exp", weights: tuple[float, ...] = (1, 1), **kw) -> ExperimentSpec:
    variants = tuple(VariantSpec(f"v{i}", w, {"i": i}) for i, w in enumerate(weights))
    return ExperimentSpec(key=key, salt=kw.pop("salt", key), variants=variants, control="v0", **kw)


@pytest.mark.parametrize("weights", [(0.3, 0.7), (0.2, 0.3, 0.5), (0.1, 0.15, 0.2, 0.25, 0.3)])
def test_split_matches_weights_chi_square(weights: tuple[float, ...]) -> None:
    config = AssignmentConfig(experiments=(experiment(weights=weights),))
    index = assign_indices(config, UNITS)["exp"]
    counts = np.bincount(index, minlength=len(weights))
    expected = np.array(weights) / sum(weights) * len(UNITS)
    assert chisquare(counts, expected).pvalue > 0.001


def test_buckets_uniform_chi_square() -> None:
    from ablab.platform.assignment.hashing import bucket_batch

    buckets = bucket_batch("salt", UNITS, 10_000)
    counts = np.bincount(buckets // 100, minlength=100)  # 100 bins of 100 buckets
    assert chisquare(counts).pvalue > 0.001


def test_ramping_traffic_never_moves_assigned_units() -> None:
    seen: dict[str, str] = {}
    for traffic in (0.1, 0.5, 1.0):
        config = AssignmentConfig(experiments=(experiment(weights=(1, 2, 1), traffic=traffic),))
        index = assign_indices(config, UNITS)["exp"]
        current = {u: f"v{i}" for u, i in zip(UNITS, index.tolist()) if i >= 0}
        assert abs(len(current) / len(UNITS) - traffic) < 0.01
        for unit, variant in seen.items():
            assert current[unit] == variant
        seen = current
    assert len(seen) == len(UNITS)


def test_new_phase_reshuffles_on_purpose() -> None:
    a = assign_indices(AssignmentConfig(experiments=(experiment(phase=1),)), UNITS[:5000])["exp"]
    b = assign_indices(AssignmentConfig(experiments=(experiment(phase=2),)), UNITS[:5000])["exp"]
    assert 0.4 < np.mean(a != b) < 0.6  # independent hash: about half move


def test_no_unit_in_two_experiments_of_one_layer() -> None:
    layer = LayerSpec("search", "layer:search")
    exps = (
        experiment("a", layer="search", layer_range=(0, 3000)),
        experiment("b", layer="search", layer_range=(3000, 7000)),
        experiment("c", layer="search", layer_range=(7000, 10_000)),
    )
    config = AssignmentConfig(experiments=exps, layers={"search": layer})
    index = assign_indices(config, UNITS)
    membership = np.stack([index[k] >= 0 for k in "abc"])
    assert membership.sum(axis=0).max() == 1
    assert membership.sum(axis=0).min() == 1  # ranges cover the layer, so every unit is in one
    shares = membership.mean(axis=1)
    assert np.allclose(shares, [0.3, 0.4, 0.3], atol=0.01)


def test_holdout_units_get_no_treatment() -> None:
    config = AssignmentConfig(
        experiments=(experiment("a", holdout="global"), experiment("b", holdout="global")),
        holdouts={"global": HoldoutSpec("global", "holdout:global", 0.1)},
    )
    from ablab.platform.assignment.hashing import bucket_batch

    held = bucket_batch("holdout:global", UNITS, 10_000) < 1000
    index = assign_indices(config, UNITS)
    for key in "ab":
        assert (index[key][held] == -1).all()
        assert (index[key][~held] >= 0).all()
    assert abs(held.mean() - 0.1) < 0.01


@settings(max_examples=60, deadline=None)
@given(
    units=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40, unique=True),
    traffic=st.floats(0, 1),
    weights=st.lists(st.floats(0.01, 10), min_size=2, max_size=5),
    country=st.sampled_from(["de", "fr", "us"]),
)
def test_batch_equals_scalar(units: list[str], traffic: float, weights: list[float], country: str) -> None:
    from ablab.platform.assignment.targeting import Condition, Op

    exps = (
        experiment("plain", weights=tuple(weights), traffic=traffic),
        experiment("targeted", targeting=(Condition("country", Op.in_, ["de", "fr"]),)),
        experiment("forced", forced={units[0]: "v1"}, traffic=0.0),
    )
    config = AssignmentConfig(experiments=exps)
    attrs = [{"country": country} for _ in units]
    batch = assign_batch(config, units, attrs)
    scalar = [assign(config, u, a) for u, a in zip(units, attrs)]
    assert batch == scalar
    assert scalar[0][-1].variant == "v1" and scalar[0][-1].forced


def test_unit_type_picks_the_matching_id_attribute() -> None:
    config = AssignmentConfig(experiments=(experiment("s", unit="session", weights=(1, 1)),))
    by_session = {assign(config, f"user-{i}", {"session_id": "sess-1"})[0].variant for i in range(50)}
    assert len(by_session) == 1  # same session, any user: same variant


def test_statuses_gate_assignment() -> None:
    for status, expected in (("draft", 0), ("paused", 0), ("stopped", 0), ("running", 1)):
        config = AssignmentConfig(experiments=(experiment(status=status),))
        assert len(assign(config, "someone")) == expected


def test_paused_variant_units_are_excluded_not_moved() -> None:
    base = experiment(weights=(1, 1))
    paused = ExperimentSpec(
        key="exp", salt="exp", control="v0", variants=(base.variants[0], VariantSpec("v1", 1, {}, paused=True))
    )
    before = assign_indices(AssignmentConfig(experiments=(base,)), UNITS[:5000])["exp"]
    after = assign_indices(AssignmentConfig(experiments=(paused,)), UNITS[:5000])["exp"]
    assert (after[before == 0] == 0).all()
    assert (after[before == 1] == -1).all()


def test_invalid_specs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="control"):
        ExperimentSpec(key="x", salt="x", variants=(VariantSpec("a", 1),), control="b")
    with pytest.raises(ValueError, match="unknown layer"):
        AssignmentConfig(experiments=(experiment(layer="nope", layer_range=(0, 10)),))
    with pytest.raises(ValueError, match="bucket_space"):
        AssignmentConfig(bucket_space=100)
