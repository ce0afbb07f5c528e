"""Seed an embedded ClickHouse store with realistic events, for dashboard tests and demos.

chDB lets one process own a data directory (and a process use one directory), so seeding
runs in its own process before the API that will own the store starts::

    python -m ablab_testing.dashboard_seed --home DIR --experiment KEY [--requests N]

Events come from :mod:`ablab.platform.stats.synthetic`, go through the one event schema
(``validate_event``) and the loader's row mapping (``raw_event_row``); the 10 s window rows
the Flink job would write are computed from the same inference events.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ablab.platform.stats.synthetic import VariantEffect, synthetic_events

# A 2×2 factorial (compression × precision): every combination is its own variant, so
# the attribution page has main effects, an interaction and a Shapley split to show.
FACTORIAL_VARIANTS: dict[str, VariantEffect] = {
    "control": VariantEffect(weight=0.25),
    "compressed": VariantEffect(weight=0.25, latency=0.88, accuracy=0.795, cost=0.85, strategy={"compression": {"method": "entropy"}}),
    "int8": VariantEffect(weight=0.25, latency=0.8, accuracy=0.785, cost=0.7, strategy={"precision": "int8"}),
    "compressed_int8": VariantEffect(weight=0.25, latency=0.74, accuracy=0.775, cost=0.6,
                                     strategy={"compression": {"method": "entropy"}, "precision": "int8"}),
}


# Two variants, as a person would set up through the form: the baseline and INT8.
PAIR_VARIANTS: dict[str, VariantEffect] = {
    "control": VariantEffect(weight=0.5),
    "int8": VariantEffect(weight=0.5, latency=0.8, accuracy=0.79, cost=0.7, strategy={"precision": "int8"}),
}
DESIGNS = {"factorial": FACTORIAL_VARIANTS, "pair": PAIR_VARIANTS}

# With ``segments``: every request carries a task domain (``dims.domain``, by unit) and a tool
# call count (``measures.tool_calls``), and INT8 is much faster on code than elsewhere, so the
# segments view has a heterogeneous effect to flag and the custom metrics view a measure to read.
DOMAINS = ("chat", "code", "math")
CODE_SPEEDUP = 0.7  # int8 arms' latency on code, on top of their overall effect
SEGMENTED_METRICS: dict[str, Any] = {
    "custom": [
        {"name": "tool_calls", "type": "mean", "column": "measures.tool_calls", "lower_is_better": False},
        {"name": "cost_per_1k_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
        {"name": "ttft_p90", "type": "quantile", "column": "ttft_ms", "quantile": 0.9},
    ],
    "segments": ["dims.domain"],
}


def experiment_body(key: str, variants: Mapping[str, VariantEffect] = FACTORIAL_VARIANTS, **extra: Any) -> dict[str, Any]:
    """The ``POST /v1/experiments`` body matching the seeded events."""
    return {
        "key": key,
        "name": extra.pop("name", "Prompt compression × INT8"),
        "owner": extra.pop("owner", "ml-platform"),
        "hypothesis": "Entropy pruning and INT8 each cut latency and cost; together they stay within the accuracy margin.",
        "unit": "user",
        "traffic": 1.0,
        "control": next(iter(variants)),
        "variants": [{"key": k, "weight": v.weight, "strategy": dict(v.strategy or {})} for k, v in variants.items()],
        "metrics": {"primary": ["e2e_ms"], "slos": {"ttft_ms": 400}},
        "guardrails": [{"metric": "ttft_ms_p95", "max": 800}, {"metric": "accuracy", "margin": 0.05}],
        **extra,
    }


def _iso(ts: pd.Timestamp) -> str:
    return ts.tz_convert("UTC").isoformat() if ts.tzinfo else ts.tz_localize("UTC").isoformat()


def _clean(value: Any) -> Any:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def add_segments(events: pd.DataFrame, *, seed: int = 7) -> pd.DataFrame:
    """``domain`` (by unit) and ``tool_calls`` on every inference row; int8 arms faster on code."""
    rng = np.random.default_rng(seed + 1)
    out = events.copy()
    units = sorted(out["unit_id"].dropna().unique())
    domain_of = dict(zip(units, rng.choice(DOMAINS, len(units), p=[0.5, 0.3, 0.2])))
    out["domain"] = out["unit_id"].map(domain_of)
    inference = out["type"] == "inference"
    out["tool_calls"] = np.where(inference, rng.poisson(np.where(out["domain"] == "code", 2.0, 0.5)), np.nan)
    faster = inference & (out["domain"] == "code") & out["variant"].fillna("").str.contains("int8")
    for column in ("ttft_ms", "e2e_ms", "tpot_ms"):
        out.loc[faster, column] = out.loc[faster, column] * CODE_SPEEDUP
    return out


def event_dicts(events: pd.DataFrame) -> list[dict[str, Any]]:
    """Synthetic rows → event objects in the CONTRACTS shape (one schema version ``v``)."""
    fields = {
        "inference": ("ttft_ms", "e2e_ms", "tpot_ms", "prompt_tokens", "output_tokens", "device_s", "cost_usd", "price_version", "error"),
        "feedback": ("correct", "source"),
        "exposure": (),
    }
    out = []
    for rec in events.to_dict("records"):
        kind = rec["type"]
        if kind not in fields or (kind == "inference" and rec.get("variant") is None):
            continue  # pre-period rows have no variant: not live traffic
        event = {"v": 1, "type": kind, "ts": _iso(pd.Timestamp(rec["ts"])), "trace_id": rec["trace_id"],
                 "experiment": rec["experiment"], "variant": rec["variant"], "unit_id": rec["unit_id"]}
        for name in fields[kind]:
            value = _clean(rec.get(name))
            if value is not None:
                event[name] = int(value) if name in ("prompt_tokens", "output_tokens", "correct") else value
        if kind == "inference":
            event["strategy"] = rec["variant"]
            if isinstance(rec.get("domain"), str):
                event["dims"] = {"domain": rec["domain"]}
            if _clean(rec.get("tool_calls")) is not None:
                event["measures"] = {"tool_calls": float(rec["tool_calls"])}
        out.append(event)
    return out


def window_rows(inference: pd.DataFrame, *, emitted_at: datetime) -> list[tuple[Any, ...]]:
    """The 10 s window rows (``window_stats`` columns) the stream job computes."""
    from ablab.streaming.loader.rows import WINDOW_COLUMNS

    df = inference.copy()
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df["window_start"] = df["ts"].dt.floor("10s")
    rows = []
    for (experiment, variant, start), g in df.groupby(["experiment", "variant", "window_start"], sort=True):
        e2e, ttft = g["e2e_ms"].to_numpy(float), g["ttft_ms"].to_numpy(float)
        tpot = g["tpot_ms"].dropna().to_numpy(float)
        cost = g["cost_usd"].to_numpy(float)
        pt, ot = g["prompt_tokens"].to_numpy(float), g["output_tokens"].to_numpy(float)
        q = lambda x, p: float(np.percentile(x, p)) if x.size else float("nan")
        values = {
            "experiment": experiment, "variant": variant, "window_start": start.to_pydatetime(),
            "window_end": (start + pd.Timedelta(seconds=10)).to_pydatetime(), "n": len(g),
            "errors": int(g["error"].notna().sum()),
            "e2e_ms_sum": e2e.sum(), "e2e_ms_sumsq": (e2e**2).sum(), "ttft_ms_sum": ttft.sum(), "ttft_ms_sumsq": (ttft**2).sum(),
            "tpot_ms_n": tpot.size, "tpot_ms_sum": tpot.sum(), "tpot_ms_sumsq": (tpot**2).sum(),
            "cost_usd_sum": cost.sum(), "cost_usd_sumsq": (cost**2).sum(), "prompt_tokens_sum": pt.sum(), "prompt_tokens_sumsq": (pt**2).sum(),
            "output_tokens_sum": ot.sum(), "output_tokens_sumsq": (ot**2).sum(),
            "e2e_ms_p50": q(e2e, 50), "e2e_ms_p95": q(e2e, 95), "e2e_ms_p99": q(e2e, 99),
            "ttft_ms_p50": q(ttft, 50), "ttft_ms_p95": q(ttft, 95), "ttft_ms_p99": q(ttft, 99), "emitted_at": emitted_at,
        }
        rows.append(tuple(values[c] for c in WINDOW_COLUMNS))
    return rows


def seed_store(*, home: Path, experiment: str, n_requests: int = 20_000, n_units: int = 2_000, seed: int = 7,
               duration_s: float = 600.0, variants: Mapping[str, VariantEffect] = FACTORIAL_VARIANTS,
               begin_in_s: float = 0.0, segments: bool = False) -> dict[str, int]:
    """Write raw events and window rows for ``experiment`` into the chDB store under ``home``.

    Events span ``duration_s`` ending now, or, with ``begin_in_s`` > 0, starting that many
    seconds from now: results count only events after the experiment's start, so an
    experiment started after seeding needs its traffic ahead of it."""
    from ablab.streaming.store import apply_ddl, make_client

    now = datetime.now(UTC).replace(microsecond=0)
    start = now + timedelta(seconds=begin_in_s) if begin_in_s > 0 else now - timedelta(seconds=duration_s)
    client = make_client(f"chdb:///{(home / 'chdb').resolve()}")
    apply_ddl(client)
    try:
        return write_events(client, experiment=experiment, n_requests=n_requests, n_units=n_units, seed=seed,
                            start=start, duration_s=duration_s, variants=variants, segments=segments)
    finally:
        client.close()


def write_events(client: Any, *, experiment: str, n_requests: int, n_units: int, start: datetime, duration_s: float,
                 seed: int = 7, variants: Mapping[str, VariantEffect] = FACTORIAL_VARIANTS, segments: bool = False,
                 trace_suffix: str = "", feed_rollup: bool = False) -> dict[str, int]:
    """Synthetic events from ``start`` over ``duration_s`` into a store client: raw events,
    and the 10 s window rows the stream job would write for them. ``trace_suffix`` keeps a
    later batch's requests apart from an earlier one's (same units, new trace ids);
    ``feed_rollup`` updates the per-unit rollup as the loader does after its raw insert (for a
    store whose experiments exist already: seeding before they do leaves it to their sync)."""
    from ablab.platform.events import Rejection, validate_event
    from ablab.streaming.loader.rows import RAW_COLUMNS, WINDOW_COLUMNS, raw_event_row

    events = synthetic_events(n_requests=n_requests, n_units=n_units, variants=variants, experiment=experiment,
                              seed=seed, start=start.isoformat(), duration_s=duration_s)
    if segments:
        events = add_segments(events, seed=seed)
    if trace_suffix:
        events["trace_id"] = events["trace_id"].astype(str) + trace_suffix
    rows = []
    for offset, event in enumerate(event_dicts(events)):
        payload = json.dumps(event).encode()
        parsed = validate_event(payload)
        if isinstance(parsed, Rejection):
            raise ValueError(f"seeded event refused: {parsed}")
        rows.append(raw_event_row(parsed, payload=payload, partition=0, offset=offset))
    client.insert("raw_events", rows, column_names=list(RAW_COLUMNS))
    if feed_rollup:
        from ablab.streaming.store import rollup

        rollup.feed(client, rows)
    inference = events[(events["type"] == "inference") & events["variant"].notna()]
    windows = window_rows(inference, emitted_at=datetime.now(UTC).replace(microsecond=0))
    client.insert("window_stats", windows, column_names=list(WINDOW_COLUMNS))
    return {"raw_events": len(rows), "window_rows": len(windows)}


def seed_in_child(*, home: Path, experiment: str, design: str = "factorial", requests: int = 20_000,
                  units: int = 2_000, begin_in_s: float = 0.0, segments: bool = False) -> dict[str, int]:
    """:func:`seed_store` in a child process (chDB lets one process own one store, and the
    API that will own this one runs in another); returns its counts."""
    import subprocess
    import sys

    from ablab_testing import support_env

    done = subprocess.run(
        [sys.executable, "-m", "ablab_testing.dashboard_seed", "--home", str(home), "--experiment", experiment,
         "--design", design, "--requests", str(requests), "--units", str(units), "--begin-in-s", str(begin_in_s),
         *(["--segments"] if segments else [])],
        capture_output=True, text=True, timeout=300, env=support_env())
    if done.returncode != 0:
        raise RuntimeError(f"seeding {experiment} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="ABLAB_HOME of the API that will own the store")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--units", type=int, default=2_000)
    parser.add_argument("--design", choices=sorted(DESIGNS), default="factorial", help="which variants the events come from")
    parser.add_argument("--begin-in-s", type=float, default=0.0, help="events start this far ahead (default: end now)")
    parser.add_argument("--segments", action="store_true", help="add dims.domain and measures.tool_calls (see SEGMENTED_METRICS)")
    args = parser.parse_args(argv)
    print(json.dumps(seed_store(home=args.home, experiment=args.experiment, n_requests=args.requests, n_units=args.units,
                                variants=DESIGNS[args.design], begin_in_s=args.begin_in_s,
                                segments=args.segments)))


if __name__ == "__main__":
    main()
