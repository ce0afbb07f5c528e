"""Assigners: ``assign(unit_id, attributes) -> [objects with .experiment, .variant, .strategy]``.

The worker takes any of them. :class:`SdkAssigner` wraps the SDK's local evaluation;
:class:`StaticAssigner` splits units deterministically over a fixed strategy map (tests,
benchmarks, offline demos).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StaticAssignment:
    experiment: str
    variant: str
    strategy: Mapping[str, Any]


class Assigner(Protocol):
    def assign(self, unit_id: str, attributes: Mapping[str, Any] | None = None) -> list[Any]: ...


class StaticAssigner:
    """One experiment; a unit lands in a variant by hash of (experiment, unit) — sticky."""

    def __init__(self, experiment: str, variants: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float] | None = None):
        if not variants:
            raise ValueError("variants: at least one variant is required")
        self.experiment = experiment
        self.variants = dict(variants)
        w = weights or {k: 1.0 for k in variants}
        total = sum(w.values())
        self._cum: list[tuple[float, str]] = []
        acc = 0.0
        for key in self.variants:
            acc += w[key] / total
            self._cum.append((acc, key))

    def assign(self, unit_id: str, attributes: Mapping[str, Any] | None = None) -> list[StaticAssignment]:
        h = int.from_bytes(hashlib.sha256(f"{self.experiment}:{unit_id}".encode()).digest()[:8], "big") / 2**64
        for edge, key in self._cum:
            if h < edge:
                return [StaticAssignment(self.experiment, key, self.variants[key])]
        key = self._cum[-1][1]
        return [StaticAssignment(self.experiment, key, self.variants[key])]


class SdkAssigner:
    """Local evaluation through ``ablab.platform.sdk.AblabClient``; the worker logs exposure itself."""

    def __init__(self, client: Any, experiments: tuple[str, ...] | None = None):
        self.client = client
        self.experiments = experiments  # only these (a worker serves its runtime's experiments; None: all)

    def assign(self, unit_id: str, attributes: Mapping[str, Any] | None = None) -> list[Any]:
        return self.client.assign(unit_id, attributes, experiments=self.experiments, log_exposure=False)
