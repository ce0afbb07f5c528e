"""Shadow requests over HTTP (issue 34): primaries and their shadows posted to ``/v1/events``,
labels posted to ``/v1/feedback`` by the shadows' own trace ids, through real Kafka and the
API's in-process loader into chDB: ``GET …/results`` carries the ``shadows`` rows, a graded
shadow shows as the shadow's accuracy, and the whole document equals ``ablab analyze`` on
the same events, shadows included.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab_testing import poll_results, start_api, stop_api
from ablab_testing.results import assert_same_results

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shadow_api(kafka_broker, tmp_path_factory):
    home = tmp_path_factory.mktemp("shadow-home")
    server = start_api(
        f"sqlite:///{home / 'ablab.db'}", home,
        extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_GUARDRAIL_INTERVAL_S": "0", "ABLAB_ANALYTICS": "true"},
    )
    yield server
    stop_api(server)


def _request(key: str, variant: str, unit: str, trace: str, e2e: float, ts: datetime, **extra) -> dict:
    return {"v": 1, "type": "inference", "ts": ts.isoformat(), "trace_id": trace, "experiment": key, "variant": variant,
            "unit_id": unit, "ttft_ms": e2e / 5, "e2e_ms": e2e, "tpot_ms": 4.0, "prompt_tokens": 30, "output_tokens": 12,
            "device_s": e2e / 1000, "cost_usd": 2e-5, "price_version": "2026-01", "strategy": "s", **extra}


def test_results_carry_graded_shadows_and_equal_analyze(shadow_api) -> None:
    key = f"shadow-{uuid.uuid4().hex[:6]}"
    with shadow_api.client("editor") as c:
        c.post("/v1/experiments", json={"key": key, "name": key, "traffic": 1, "control": "a",
                                        "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}).raise_for_status()
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
        exp = c.get(f"/v1/experiments/{key}").json()
    rng = np.random.default_rng(5)
    now = datetime.now(UTC)
    events, labels = [], []
    for i in range(240):
        variant = "ab"[i % 2]
        unit, trace, ts = f"u{i % 30}", f"{key}-p{i}", now + timedelta(milliseconds=i)
        e2e = float(rng.lognormal(5, 0.4))
        shadow = ("sent" if i % 8 else "dropped") if i % 2 else None  # b's requests are shadowed
        events.append(_request(key, variant, unit, trace, e2e, ts, **({"shadow": shadow} if shadow else {})))
        labels.append({"trace_id": trace, "correct": int(rng.random() < 0.5), "source": "judge"})
        if shadow == "sent":
            s_trace = f"{key}-s{i}"
            failed = i % 24 == 1
            events.append(_request(key, variant, unit, s_trace, e2e * float(rng.lognormal(0.3, 0.2)), ts,
                                   shadow_of=trace, **({"error": "upstream 503"} if failed else {})))
            labels.append({"trace_id": s_trace, "correct": int(rng.random() < 0.9), "source": "judge"})
    with shadow_api.client("sdk") as c:
        r = c.post("/v1/events", json={"events": events})
        assert r.status_code == 202 and r.json()["accepted"] == len(events), r.json().get("errors", [])[:3]
        assert c.post("/v1/feedback", json={"labels": labels}).json()["accepted"] == len(labels)

    n_shadows = sum(1 for e in events if e.get("shadow_of"))
    result = poll_results(shadow_api, key, timeout_s=120, interval_s=2.0, until=lambda doc: any(
        r["metric"] == "accuracy" and r["n_pairs"] == n_shadows for r in doc.get("shadows") or []))
    assert result.get("shadows"), f"no shadows in the results: {sorted(result)}"
    assert {r["variant"] for r in result["shadows"]} == {"b"}  # a's requests were never chosen
    accuracy = next(r for r in result["shadows"] if r["metric"] == "accuracy")
    by_trace = {lab["trace_id"]: lab["correct"] for lab in labels}
    shadows = [e for e in events if e.get("shadow_of")]
    assert accuracy["n_pairs"] == n_shadows
    assert accuracy["shadow_mean"] == pytest.approx(np.mean([by_trace[s["trace_id"]] for s in shadows]), rel=1e-12)
    assert accuracy["primary_mean"] == pytest.approx(np.mean([by_trace[s["shadow_of"]] for s in shadows]), rel=1e-12)
    primaries = [e for e in events if e["variant"] == "b" and not e.get("shadow_of")]
    assert accuracy["coverage"] == {
        "requests": len(primaries), "chosen": sum(1 for e in primaries if e.get("shadow")),
        "sent": sum(1 for e in primaries if e.get("shadow") == "sent"),
        "dropped": sum(1 for e in primaries if e.get("shadow") == "dropped"),
        "shadowed": n_shadows, "failed": sum(1 for s in shadows if s.get("error")), "orphaned": 0,
    }
    e2e = next(r for r in result["shadows"] if r["metric"] == "e2e_ms")
    assert e2e["mean_diff"] > 0 and e2e["wilcoxon_p_value"] < 1e-3
    # the variants' own numbers count the primaries only
    assert {m["variant"]: m["n"] for m in result["metrics"] if m["metric"] == "e2e_ms"} == {"a": 120, "b": 120}

    # ablab analyze on the same events: the same document, shadows included
    frame = pd.DataFrame([*events, *({"v": 1, "type": "feedback", "ts": now.isoformat(), **lab} for lab in labels)])
    spec = parse_spec({"key": key, "control": "a", "unit": exp["unit"], "start": exp["started_at"],
                       "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]})
    offline, _ = analyze_events(frame, spec)
    offline = offline.model_dump(mode="json")
    assert_same_results(result, offline)
