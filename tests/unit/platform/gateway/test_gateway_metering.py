"""Measurements → the inference event: TPOT, estimated tokens, cost sources, and the outbox."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.platform.events import InferenceEvent, validate_event
from ablab.platform.gateway.emit import Outbox, event_unit_id
from ablab.platform.gateway.metering import UNPRICED, Measurement, inference_event
from ablab.platform.gateway.settings import Backend, Price

TS = datetime(2026, 12, 1, tzinfo=UTC)


def event(m: Measurement, backend: Backend, model: str | None = "m", measures: bool = True) -> dict:
    return inference_event(m, ts=TS, trace_id="t1", experiment="e", variant="a", unit_id="u", strategy="s",
                           backend=backend, model=model, with_measures=measures)


def test_latencies_and_tpot() -> None:
    m = Measurement(start=10.0, end=10.5, first_token=10.1, prompt_tokens=20, output_tokens=5, est_prompt_tokens=0,
                    est_output_tokens=0, generated_chunks=5, itl_sum_s=0.4, itl_max_s=0.2)
    ev = event(m, Backend("b", "http://x"))
    assert ev["ttft_ms"] == pytest.approx(100.0) and ev["e2e_ms"] == pytest.approx(500.0)
    assert ev["tpot_ms"] == pytest.approx(100.0)  # (500 - 100) / (5 - 1)
    assert ev["measures"]["tokens_estimated"] == 0.0 and ev["measures"]["itl_ms_mean"] == pytest.approx(100.0)
    assert ev["cost_usd"] == 0.0 and ev["price_version"] == UNPRICED


def test_estimated_tokens_are_marked_and_single_token_has_no_tpot() -> None:
    m = Measurement(start=0.0, end=0.2, first_token=0.1, prompt_tokens=None, output_tokens=None, est_prompt_tokens=7,
                    est_output_tokens=1)
    ev = event(m, Backend("b", "http://x"))
    assert (ev["prompt_tokens"], ev["output_tokens"], ev["tpot_ms"]) == (7, 1, None)
    assert ev["measures"]["tokens_estimated"] == 1.0


def test_cost_from_backend_price_then_model_table_then_device() -> None:
    m = Measurement(start=0.0, end=2.0, first_token=0.5, prompt_tokens=1_000_000, output_tokens=2_000_000,
                    est_prompt_tokens=0, est_output_tokens=0, concurrency=2.0)
    priced = Backend("h", "http://x", price=Price(input_per_mtok=1.0, output_per_mtok=2.0, version="v9"))
    assert (event(m, priced)["cost_usd"], event(m, priced)["price_version"]) == (5.0, "v9")
    ev = event(m, Backend("o", "http://x"), model="gpt-4o-mini")
    assert ev["cost_usd"] == pytest.approx(0.15 + 2 * 0.60) and ev["price_version"] == "tok-2026-01"
    ev = event(m, Backend("s", "http://x", price=Price(device="cpu")))
    assert ev["device_s"] == pytest.approx(1.0)  # 2 s of wall time shared by 2 requests
    assert ev["price_version"] == "2026-07" and ev["cost_usd"] == pytest.approx(0.090 / 3600)


def test_events_validate_and_the_outbox_writes_lines(tmp_path) -> None:
    m = Measurement(start=0.0, end=0.3, first_token=0.1, prompt_tokens=3, output_tokens=4, est_prompt_tokens=0, est_output_tokens=0)
    ev = event(m, Backend("b", "http://x"), measures=False)
    assert isinstance(validate_event(ev), InferenceEvent)
    box = Outbox(tmp_path)
    bad = {**ev, "ttft_ms": -1.0}
    box.write([dict(ev), bad])
    lines = [json.loads(x) for p in tmp_path.glob("*.jsonl") for x in p.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["event_id"] and box.written == 1 and box.refused == 1
    with pytest.raises(RuntimeError, match="another running gateway"):
        Outbox(tmp_path)
    box.close()


def test_unit_ids_that_are_not_identifiers_are_hashed_stably() -> None:
    assert event_unit_id("user-1") == "user-1"
    hashed = event_unit_id("ann@example.com")
    assert hashed.startswith("h:") and hashed == event_unit_id("ann@example.com") and "@" not in hashed
