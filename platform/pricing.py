"""Versioned price table (``assets/prices.json``): price per device-hour by device kind,
each version with an effective date. Cost = price/3600 × attributed device-seconds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

PRICES_FILE = Path(__file__).with_name("assets") / "prices.json"


@dataclass(frozen=True)
class PriceVersion:
    version: str
    effective_from: datetime
    per_device_hour: dict[str, float]


@dataclass(frozen=True)
class PriceTable:
    versions: tuple[PriceVersion, ...]  # sorted by effective_from

    def at(self, when: datetime) -> PriceVersion:
        current = None
        for v in self.versions:
            if v.effective_from <= when:
                current = v
        if current is None:
            raise LookupError(f"no price version is effective at {when.isoformat()}")
        return current

    def cost(self, *, device_s: float, device: str, when: datetime) -> tuple[float, str]:
        v = self.at(when)
        if device not in v.per_device_hour:
            raise KeyError(f"device: {device!r} has no price in version {v.version} (known: {sorted(v.per_device_hour)})")
        return v.per_device_hour[device] / 3600.0 * device_s, v.version


def parse_price_table(data: dict) -> PriceTable:
    versions = []
    for i, raw in enumerate(data.get("versions", [])):
        for key in ("version", "effective_from", "per_device_hour"):
            if key not in raw:
                raise ValueError(f"prices.versions[{i}].{key}: missing")
        when = datetime.fromisoformat(raw["effective_from"])
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        prices = {k: float(v) for k, v in raw["per_device_hour"].items()}
        if any(p < 0 for p in prices.values()):
            raise ValueError(f"prices.versions[{i}].per_device_hour: prices must be >= 0")
        versions.append(PriceVersion(raw["version"], when, prices))
    if not versions:
        raise ValueError("prices.versions: at least one version is required")
    return PriceTable(tuple(sorted(versions, key=lambda v: v.effective_from)))


@lru_cache(maxsize=4)
def load_price_table(path: Path = PRICES_FILE) -> PriceTable:
    return parse_price_table(json.loads(path.read_text()))
