"""One scenario for the analysis-window tests (issue 33 item 5), offline and in the store: an
hour of a 50/50 experiment with a clear winner, then a ship, then winner-only traffic."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ablab.platform.stats.result_models import Results
from ablab.platform.stats.spec import ExperimentSpec, Shipped, parse_spec, with_ship
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events

START = pd.Timestamp("2026-12-01T00:00:00Z")
SHIP_AT = START + pd.Timedelta(hours=1, minutes=5)
PAIR = {"control": VariantEffect(weight=0.5), "int8": VariantEffect(weight=0.5, latency=0.8)}
WINNER = {"int8": VariantEffect(weight=1.0, latency=0.8)}


def comparison_events() -> pd.DataFrame:
    """An hour of a 50/50 experiment with a clear winner (int8 20 % faster)."""
    ev = synthetic_events(variants=PAIR, n_requests=4_000, n_units=400, seed=4, start=START.isoformat(), duration_s=3600)
    ev["ts"] = ev["ts"].dt.floor("ms")
    return ev


def after_ship_events() -> pd.DataFrame:
    """After the ship: every unit (the same ones, and their exposures) on int8, new requests."""
    ev = synthetic_events(variants=WINNER, n_requests=3_000, n_units=400, seed=9,
                          start=(SHIP_AT + pd.Timedelta(seconds=1)).isoformat(), duration_s=1800)
    ev["ts"] = ev["ts"].dt.floor("ms")
    ev["trace_id"] = ev["trace_id"].astype(str) + "-shipped"
    return ev


def spec_of(**analysis: object) -> ExperimentSpec:
    return parse_spec(spec_dict(PAIR, start=START.isoformat(), metrics={"primary": ["e2e_ms"]},
                                **({"analysis": analysis} if analysis else {})))


def shipped_spec() -> ExperimentSpec:
    return with_ship(spec_of(), Shipped("int8", SHIP_AT.isoformat(), 2), {"control": 1.0, "int8": 1.0})


def numbers(result: Results) -> dict[str, Any]:
    """What a reader compares: every row's estimates and tests, the split check, the decisions."""
    doc = result.model_dump(mode="json")
    return {k: doc[k] for k in ("srm", "metrics", "guardrails", "decisions", "coverage")}
