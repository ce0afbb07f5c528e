"""The assignment engine: (config, unit, attributes) → the variants that unit sees.

Each decision uses its own independent hash of the unit id, so changing one knob never
moves units decided by another:

- holdout: ``bucket(holdout.salt)`` below the holdout's share → no treatment anywhere
  the holdout applies;
- layer: ``bucket(layer.salt)`` inside the experiment's range of the layer → the
  layer's experiments see disjoint units;
- traffic: ``bucket("{salt}:traffic")`` below ``traffic`` → the unit is in the
  experiment. Ramping only lowers or raises this threshold, so a unit that was in stays
  in, with the same variant, because:
- variant: ``bucket("{salt}:{phase}")`` against cumulative weights. Weights can only
  change together with ``phase`` (the registry enforces it), which reshuffles on purpose.

The unit id an experiment hashes is ``attributes["{unit}_id"]`` when the caller gives it
(e.g. ``session_id`` for a session-randomized experiment), else the ``unit_id`` passed.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ablab.platform.assignment.hashing import bucket, bucket_batch
from ablab.platform.assignment.targeting import Rule, matches_all

DEFAULT_BUCKET_SPACE = 10_000


@dataclass(frozen=True, slots=True)
class Assignment:
    experiment: str
    variant: str
    strategy: Mapping[str, Any]
    forced: bool = False
    # The shadow the variant's requests get ({strategy, fraction, max_concurrency,
    # timeout_s}: the variant's own, else the experiment's), or None. Not part of equality:
    # it does not change which variant a unit sees.
    shadow: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class VariantSpec:
    key: str
    weight: float
    strategy: Mapping[str, Any] = field(default_factory=dict)
    paused: bool = False
    shadow: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LayerSpec:
    key: str
    salt: str


@dataclass(frozen=True)
class HoldoutSpec:
    key: str
    salt: str
    fraction: float


@dataclass(frozen=True)
class ExperimentSpec:
    key: str
    salt: str
    variants: tuple[VariantSpec, ...]
    control: str
    traffic: float = 1.0
    phase: int = 1
    unit: str = "user"
    status: str = "running"
    layer: str | None = None
    layer_range: tuple[int, int] | None = None
    holdout: str | None = None
    targeting: tuple[Rule, ...] = ()
    forced: Mapping[str, str] = field(default_factory=dict)
    shadow: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        keys = [v.key for v in self.variants]
        if not keys:
            raise ValueError(f"experiment {self.key!r}: needs at least one variant")
        if len(set(keys)) != len(keys):
            raise ValueError(f"experiment {self.key!r}: variant keys must be unique")
        if self.control not in keys:
            raise ValueError(f"experiment {self.key!r}: control {self.control!r} is not a variant")
        if any(v.weight < 0 for v in self.variants) or sum(v.weight for v in self.variants) <= 0:
            raise ValueError(f"experiment {self.key!r}: weights must be non-negative with a positive sum")
        if not 0.0 <= self.traffic <= 1.0:
            raise ValueError(f"experiment {self.key!r}: traffic must be within [0, 1]")
        if self.layer is not None and self.layer_range is None:
            raise ValueError(f"experiment {self.key!r}: an experiment in a layer needs a layer_range")
        for unit, variant in self.forced.items():
            if variant not in keys:
                raise ValueError(f"experiment {self.key!r}: forced unit {unit!r} names unknown variant {variant!r}")

    def boundaries(self, space: int) -> list[int]:
        """Upper bucket bound of each variant; the last equals ``space``."""
        total = sum(v.weight for v in self.variants)
        running, bounds = 0.0, []
        for variant in self.variants:
            running += variant.weight
            bounds.append(round(running / total * space))
        bounds[-1] = space
        return bounds


@dataclass(frozen=True)
class AssignmentConfig:
    experiments: tuple[ExperimentSpec, ...] = ()
    layers: Mapping[str, LayerSpec] = field(default_factory=dict)
    holdouts: Mapping[str, HoldoutSpec] = field(default_factory=dict)
    bucket_space: int = DEFAULT_BUCKET_SPACE
    revision: str = ""
    # (experiment, variant) → the current model JSON of a policy variant (docs/policies.md);
    # absent: none fitted yet, the policy explores uniformly. Not used by assignment itself.
    policy_models: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bucket_space < DEFAULT_BUCKET_SPACE:
            raise ValueError(f"bucket_space must be at least {DEFAULT_BUCKET_SPACE}")
        for exp in self.experiments:
            if exp.layer is not None and exp.layer not in self.layers:
                raise ValueError(f"experiment {exp.key!r} names unknown layer {exp.layer!r}")
            if exp.holdout is not None and exp.holdout not in self.holdouts:
                raise ValueError(f"experiment {exp.key!r} names unknown holdout {exp.holdout!r}")
        # Precomputed once per config, so the hot path is hashes and comparisons only.
        object.__setattr__(self, "_compiled", tuple(_compile(exp, self) for exp in self.experiments))


@dataclass(frozen=True, slots=True)
class _Compiled:
    spec: ExperimentSpec
    traffic_salt: str
    variant_salt: str
    traffic_threshold: int
    bounds: list[int]
    assignments: tuple[Assignment, ...]
    forced: dict[str, Assignment]
    layer_salt: str | None
    layer_lo: int
    layer_hi: int
    holdout_salt: str | None
    holdout_threshold: int
    unit_attribute: str


def _compile(exp: ExperimentSpec, config: AssignmentConfig) -> _Compiled:
    space = config.bucket_space
    assignments = tuple(Assignment(exp.key, v.key, v.strategy, shadow=v.shadow or exp.shadow) for v in exp.variants)
    by_key = {v.key: v for v in exp.variants}
    layer = config.layers[exp.layer] if exp.layer else None
    holdout = config.holdouts[exp.holdout] if exp.holdout else None
    lo, hi = exp.layer_range or (0, space)
    return _Compiled(
        spec=exp,
        traffic_salt=f"{exp.salt}:traffic",
        variant_salt=f"{exp.salt}:{exp.phase}",
        traffic_threshold=round(exp.traffic * space),
        bounds=exp.boundaries(space),
        assignments=assignments,
        forced={u: Assignment(exp.key, k, by_key[k].strategy, forced=True, shadow=by_key[k].shadow or exp.shadow)
                for u, k in exp.forced.items()},
        layer_salt=layer.salt if layer else None,
        layer_lo=lo,
        layer_hi=hi,
        holdout_salt=holdout.salt if holdout else None,
        holdout_threshold=round(holdout.fraction * space) if holdout else 0,
        unit_attribute=f"{exp.unit}_id",
    )


def _selected(config: AssignmentConfig, experiments: Iterable[str] | None) -> tuple[_Compiled, ...]:
    compiled: tuple[_Compiled, ...] = config._compiled  # type: ignore[attr-defined]
    if experiments is None:
        return compiled
    wanted = set(experiments)
    return tuple(c for c in compiled if c.spec.key in wanted)


def assign(
    config: AssignmentConfig,
    unit_id: str,
    attributes: Mapping[str, Any] | None = None,
    experiments: Iterable[str] | None = None,
) -> list[Assignment]:
    """Variants ``unit_id`` sees in each experiment it is eligible for."""
    space = config.bucket_space
    out: list[Assignment] = []
    for c in _selected(config, experiments):
        spec = c.spec
        uid = str(attributes.get(c.unit_attribute, unit_id)) if attributes else unit_id
        forced = c.forced.get(uid)
        if forced is not None and spec.status != "stopped":
            out.append(forced)
            continue
        if spec.status != "running":
            continue
        if c.holdout_salt is not None and bucket(c.holdout_salt, uid, space) < c.holdout_threshold:
            continue
        if c.layer_salt is not None and not c.layer_lo <= bucket(c.layer_salt, uid, space) < c.layer_hi:
            continue
        if spec.targeting and not matches_all(spec.targeting, attributes):
            continue
        if c.traffic_threshold < space and bucket(c.traffic_salt, uid, space) >= c.traffic_threshold:
            continue
        index = bisect_right(c.bounds, bucket(c.variant_salt, uid, space))
        if spec.variants[index].paused:
            continue
        out.append(c.assignments[index])
    return out


def assign_indices(
    config: AssignmentConfig,
    unit_ids: Sequence[str],
    attributes: Sequence[Mapping[str, Any] | None] | None = None,
    experiments: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """Vectorized :func:`assign`: per experiment, each unit's variant index or -1.

    Hashes for one salt are computed once per batch and shared by every experiment
    that uses it (a layer's or holdout's salt).
    """
    n = len(unit_ids)
    space = config.bucket_space
    if attributes is not None and len(attributes) != n:
        raise ValueError("attributes must have one entry per unit")
    cache: dict[tuple[str, str], np.ndarray] = {}

    def ids_for(c: _Compiled) -> Sequence[str]:
        if attributes is None:
            return unit_ids
        key = c.unit_attribute
        return [str(a[key]) if a and key in a else u for u, a in zip(unit_ids, attributes)]

    def hashed(salt: str, unit_attribute: str, ids: Sequence[str]) -> np.ndarray:
        key = (salt, unit_attribute)
        if key not in cache:
            cache[key] = bucket_batch(salt, ids, space)
        return cache[key]

    result: dict[str, np.ndarray] = {}
    for c in _selected(config, experiments):
        spec = c.spec
        ids = ids_for(c)
        index = np.full(n, -1, dtype=np.int64)
        if spec.status == "running" and n:
            if c.traffic_threshold >= space:  # full traffic: the traffic hash cannot exclude anyone
                mask = np.ones(n, dtype=bool)
            else:
                mask = hashed(c.traffic_salt, c.unit_attribute, ids) < c.traffic_threshold
            if c.holdout_salt is not None:
                mask &= hashed(c.holdout_salt, c.unit_attribute, ids) >= c.holdout_threshold
            if c.layer_salt is not None:
                b = hashed(c.layer_salt, c.unit_attribute, ids)
                mask &= (b >= c.layer_lo) & (b < c.layer_hi)
            if spec.targeting:
                attrs = attributes if attributes is not None else [None] * n
                mask &= np.fromiter((matches_all(spec.targeting, a) for a in attrs), dtype=bool, count=n)
            chosen = np.searchsorted(c.bounds, bucket_batch(c.variant_salt, ids, space), side="right")
            paused = np.array([v.paused for v in spec.variants])
            mask &= ~paused[chosen]
            index = np.where(mask, chosen, -1)
        if c.forced and spec.status != "stopped":
            positions = {v.key: i for i, v in enumerate(spec.variants)}
            for i, uid in enumerate(ids):
                forced = c.forced.get(uid)
                if forced is not None:
                    index[i] = positions[forced.variant]
        result[spec.key] = index
    return result


def assign_batch(
    config: AssignmentConfig,
    unit_ids: Sequence[str],
    attributes: Sequence[Mapping[str, Any] | None] | None = None,
    experiments: Iterable[str] | None = None,
) -> list[list[Assignment]]:
    """Vectorized :func:`assign` for a whole batch; same answers, one list per unit."""
    out: list[list[Assignment]] = [[] for _ in unit_ids]
    by_key = {c.spec.key: c for c in _selected(config, experiments)}
    for key, index in assign_indices(config, unit_ids, attributes, experiments).items():
        c = by_key[key]
        for i in np.flatnonzero(index >= 0):
            variant = int(index[i])
            uid = out[i]
            forced = c.forced.get(unit_ids[i] if attributes is None else _uid(c, unit_ids[i], attributes[i]))
            uid.append(forced if forced is not None and c.spec.status != "stopped" else c.assignments[variant])
    return out


def _uid(c: _Compiled, unit_id: str, attrs: Mapping[str, Any] | None) -> str:
    return str(attrs[c.unit_attribute]) if attrs and c.unit_attribute in attrs else unit_id
