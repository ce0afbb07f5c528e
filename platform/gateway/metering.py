"""Measurements → the ``inference`` event (docs/architecture.md's metric definitions), and its cost.

Cost, in order: the backend's per-token ``price`` setting; the versioned per-model token
price table (``assets/token_prices.json``); for a backend priced by ``device`` (self-hosted),
price per device-hour × device-seconds, where a request is attributed its wall time divided
by the backend's mean concurrency over the request (a shared device's time split among the
requests it served at once); else 0 with ``price_version = "unpriced"``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ablab.platform.gateway.prompting.rates import take_notes
from ablab.platform.gateway.settings import Backend

TOKEN_PRICES_FILE = Path(__file__).with_name("assets") / "token_prices.json"
UNPRICED = "unpriced"
MAX_EVENT_MEASURES = 32  # the event schema's caps (platform/events.py MAX_MEASURES, MAX_DIMS)
MAX_EVENT_DIMS = 16


@dataclass(slots=True)
class Measurement:
    """One request as the gateway saw it (times in seconds from ``time.perf_counter``)."""

    start: float
    end: float
    first_token: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    est_prompt_tokens: int
    est_output_tokens: int
    generated_chunks: int = 0
    itl_sum_s: float = 0.0
    itl_max_s: float = 0.0
    concurrency: float = 1.0
    error: str | None = None
    server_metrics: dict[str, float] | None = None


@lru_cache(maxsize=2)
def _token_table(path: Path = TOKEN_PRICES_FILE) -> list[tuple[datetime, str, dict[str, dict[str, float]]]]:
    data = json.loads(path.read_text())
    rows = [(datetime.fromisoformat(v["effective_from"]), v["version"], v["models"]) for v in data["versions"]]
    return sorted(rows, key=lambda r: r[0])


def token_price(model: str | None, when: datetime) -> tuple[float, float, str] | None:
    current = None
    for effective, version, models in _token_table():
        if effective <= when:
            current = (version, models)
    if current is None or not model or model not in current[1]:
        return None
    p = current[1][model]
    return p["input_per_mtok"], p["output_per_mtok"], current[0]


def cost(*, backend: Backend, model: str | None, prompt_tokens: int, output_tokens: int, device_s: float, when: datetime) -> tuple[float, str]:
    price = backend.price
    if price is not None and (price.input_per_mtok is not None or price.output_per_mtok is not None):
        usd = (prompt_tokens * (price.input_per_mtok or 0.0) + output_tokens * (price.output_per_mtok or 0.0)) / 1e6
        return usd, price.version or f"backend-{backend.name}"
    if (found := token_price(model, when)) is not None:
        pin, pout, version = found
        return (prompt_tokens * pin + output_tokens * pout) / 1e6, version
    if price is not None and price.device:
        from ablab.platform.pricing import load_price_table  # plain JSON; no torch

        return load_price_table().cost(device_s=device_s, device=price.device, when=when)
    return 0.0, UNPRICED


def strategy_id(strategy: dict[str, Any] | Any) -> str:
    """The registry's content hash (``strategy_hash``) where the open strategy model accepts
    it, else a hash of the canonical JSON (what the worker and the gateway both report as
    ``strategy``). The open model fills built-in defaults in before hashing, so one strategy
    has one id whether its defaults are spelled out (a fixed variant as the registry stores
    it) or left out (a policy arm, a shadow, an SDK caller's mapping)."""
    try:
        from ablab.platform.strategy import open_strategy

        return open_strategy(dict(strategy)).content_hash
    except Exception:
        canonical = json.dumps(strategy, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def inference_event(
    m: Measurement,
    *,
    ts: datetime,
    trace_id: str,
    experiment: str,
    variant: str,
    unit_id: str,
    strategy: str,
    backend: Backend,
    model: str | None,
    with_measures: bool,
) -> dict[str, Any]:
    e2e_ms = max(0.0, (m.end - m.start) * 1000.0)
    ttft_ms = e2e_ms if m.first_token is None else min(e2e_ms, max(0.0, (m.first_token - m.start) * 1000.0))
    estimated = m.prompt_tokens is None or m.output_tokens is None
    prompt = m.prompt_tokens if m.prompt_tokens is not None else m.est_prompt_tokens
    out = m.output_tokens if m.output_tokens is not None else m.est_output_tokens
    tpot = (e2e_ms - ttft_ms) / (out - 1) if out > 1 and m.first_token is not None else None
    device_s = (m.end - m.start) / max(1.0, m.concurrency) if backend.price and backend.price.device else 0.0
    usd, version = cost(backend=backend, model=model, prompt_tokens=prompt, output_tokens=out, device_s=device_s, when=ts)
    event: dict[str, Any] = {
        "v": 1,
        "type": "inference",
        "ts": ts.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "trace_id": trace_id,
        "experiment": experiment,
        "variant": variant,
        "unit_id": unit_id,
        "ttft_ms": round(ttft_ms, 3),
        "e2e_ms": round(e2e_ms, 3),
        "tpot_ms": None if tpot is None else round(tpot, 3),
        "prompt_tokens": prompt,
        "output_tokens": out,
        "device_s": round(device_s, 6),
        "cost_usd": usd,
        "price_version": version,
        "error": m.error,
        "strategy": strategy,
    }
    # what the request's prompt strategies did (gateway.prompting); taking them also feeds the
    # backend's measured prefill rate
    notes = take_notes(trace_id, m)
    if with_measures:
        measures: dict[str, float] = {"tokens_estimated": 1.0 if estimated else 0.0}
        if m.generated_chunks > 1:
            measures["itl_ms_mean"] = round(m.itl_sum_s * 1000.0 / (m.generated_chunks - 1), 3)
            measures["itl_ms_max"] = round(m.itl_max_s * 1000.0, 3)
        if m.server_metrics:
            measures.update(m.server_metrics)
        dims = {"backend": backend.name, **({"model": model[:128]} if model else {})}
        if notes is not None:  # within the event schema's caps (32 measures, 16 dims), the gateway's own first
            for k, v in notes.measures.items():
                if len(measures) < MAX_EVENT_MEASURES:
                    measures.setdefault(k, float(v))
            for k, d in notes.dims.items():  # a name of its own: `v` above is a float
                if len(dims) < MAX_EVENT_DIMS:
                    dims.setdefault(k, d)
        event["measures"] = measures
        event["dims"] = dims
    return event


def exposure_event(*, ts: datetime, trace_id: str, experiment: str, variant: str, unit_id: str) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "exposure",
        "ts": ts.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "trace_id": trace_id,
        "experiment": experiment,
        "variant": variant,
        "unit_id": unit_id,
    }
