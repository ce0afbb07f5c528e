"""The gateway's fast event check says yes only where ``ablab.platform.events`` does, and the
outbox's verdict (fast check, else full validation) is exactly the models' on every input."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from ablab.platform.events import Rejection, validate_event
from ablab.platform.gateway.emit import Outbox
from ablab.platform.gateway.event_check import fast_accepts
from ablab.platform.gateway.metering import Measurement, exposure_event, inference_event
from ablab.platform.gateway.settings import Backend
from ablab_testing.flink_reference import boundary_values

TS = datetime(2026, 12, 6, 5, 46, 15, 187716, tzinfo=UTC)


def _built(error: str | None = None, chunks: int = 16, **extra: Any) -> list[dict[str, Any]]:
    m = Measurement(start=0.0, end=0.01, first_token=0.002 if error is None else None, prompt_tokens=None,
                    output_tokens=None, est_prompt_tokens=3, est_output_tokens=chunks, generated_chunks=chunks,
                    itl_sum_s=0.004, itl_max_s=0.001, concurrency=3.0, error=error, server_metrics={"queue_ms": 1.5})
    common: dict[str, Any] = {"ts": TS, "trace_id": "0f" * 16, "experiment": "bench", "variant": "a", "unit_id": "u-1"}
    events = [exposure_event(**common),
              inference_event(m, **common, strategy="abc123", backend=Backend("b", "http://x/v1", kind="openai"),
                              model="ok", with_measures=True)]
    for e in events:
        e["event_id"] = "e" + e["type"]
        e.update({k: v for k, v in extra.items() if k != "shadow" or e["type"] == "inference"})
    return events


def _accepted(event: Any) -> bool:
    return not isinstance(validate_event(event), Rejection)


def _variants() -> list[dict[str, Any]]:
    """The gateway's events, then each with one field moved to an edge or a wrong type."""
    base = _built() + _built(error="backend_timeout", chunks=0) + _built(shadow="sent") \
        + _built(arm="fast", propensity=0.25, policy_version="rule:abc")
    exposure, inference = base[0], base[1]
    out = list(base)
    for name, value in boundary_values():
        if name in inference:
            latencies = {"ttft_ms": 0.0 if name == "e2e_ms" else 100.0, "e2e_ms": 1e6 if name == "ttft_ms" else 110.0}
            out.append({**inference, **latencies, name: value})
    odd: list[Any] = [None, True, False, 0, 1, -1, 1.0, 0.5, -0.0, math.nan, math.inf, -math.inf, "", "x", "a b", "a" * 128,
                      "a" * 129, "Arm", "sent", "dropped", {}, [], {"a": 1.0}, 2**63, 1e300]
    for event in (exposure, inference):
        for name in [*event, "arm", "propensity", "policy_version", "shadow", "shadow_of", "output_text", "tpot_ms", "nope"]:
            for value in odd:
                out.append({**event, name: value})
            out.append({k: v for k, v in event.items() if k != name})
    for ts in ("2026-12-06T05:46:15Z", "2026-12-06T05:46:15.187Z", "2026-12-06T05:46:15.187716+00:00",
               "2026-12-06T05:46:15.187716+01:00", "2026-12-06T05:46:15.187716", "2026-02-31T00:00:00Z",
               "1999-12-31T23:59:59Z", "2000-01-01T00:00:00Z", "2199-12-31T23:59:59.999999Z", "2200-01-01T00:00:00Z",
               "2026-12-06 05:46:15Z", "2026-12-06T25:00:00Z", TS):
        out += [{**exposure, "ts": ts}, {**inference, "ts": ts}]
    measures = inference["measures"]
    for m in ({**measures, "Bad": 1.0}, {**measures, "ok": 1}, {**measures, "ok": True}, {**measures, "ok": math.nan},
              {**measures, "ok": 1e12}, {**measures, "ok": math.nextafter(1e12, math.inf)}, {**measures, "ok": -1e12},
              {f"m{i}": 1.0 for i in range(32)}, {f"m{i}": 1.0 for i in range(33)}, {"a" * 64: 1.0}, {"a" * 65: 1.0}, {1: 1.0}):
        out.append({**inference, "measures": m})
    for d in ({"backend": ""}, {"backend": "b" * 128}, {"backend": "b" * 129}, {"backend": 1}, {f"d{i}": "x" for i in range(16)},
              {f"d{i}": "x" for i in range(17)}, {"Bad": "x"}):
        out.append({**inference, "dims": d})
    for e2e, ttft in ((5.0, 5.0), (5.0, math.nextafter(5.0, math.inf)), (0.0, 0.0)):
        out.append({**inference, "e2e_ms": e2e, "ttft_ms": ttft})
    out += [{**inference, "shadow_of": "other", "output_text": "hi", "shadow": None},
            {**inference, "error": "x" * 256}, {**inference, "error": "x" * 257}, {**exposure, "type": "inference"},
            {**inference, "type": "exposure"}, {**exposure, "type": "rum"}, {**exposure, "type": 1}]
    return out


def test_the_gateways_own_events_take_the_fast_path() -> None:
    events = _built() + _built(error="backend_timeout", chunks=0) + _built(shadow="dropped") \
        + _built(arm="fast", propensity=1.0, policy_version="uniform:1a")
    assert all(fast_accepts(e) for e in events)
    assert all(_accepted(e) for e in events)


def test_the_fast_check_never_accepts_what_the_models_refuse() -> None:
    cases = _variants()
    fast = [e for e in cases if fast_accepts(e)]
    wrong = [e for e in fast if not _accepted(e)]
    assert wrong == []
    # it decides a real share of them (not a check that always defers), and defers on refused ones
    assert len(fast) > 100
    assert any(not _accepted(e) for e in cases) and len(cases) > 400


@pytest.mark.parametrize("batch", [0, 1])
def test_the_outbox_keeps_and_refuses_exactly_what_the_models_do(tmp_path: Any, batch: int) -> None:
    cases = _variants()
    cases = cases[batch::2]
    outbox = Outbox(tmp_path)
    try:
        for event in cases:
            before = outbox.refused
            expected = _accepted(dict(event))
            outbox.write([dict(event)])
            assert (outbox.refused == before) is expected, event
    finally:
        outbox.close()
