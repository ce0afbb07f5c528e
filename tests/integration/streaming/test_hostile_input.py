"""issue 19, "Must show": hostile input through the live pipeline (real broker, the API with
its in-process loader and embedded ClickHouse, the Flink job in a mini-cluster).

Each poison case goes in between ordinary events, through the API and, for what the API can
refuse, also straight to Kafka (a producer that bypasses the edge). Afterwards every
ordinary event is in ``/results`` and in the 10 s windows, every poison record is refused
or dead-lettered and counted, the loader keeps committing, and the watermark keeps moving:
the ordinary events sent after a year-9999 timestamp are on time, also after the job was
restarted from a checkpoint taken after it.

issue 37, "Must show": the reconciliation (raw = Σ window n + late, and ``/results`` =
``ablab analyze``) over a stream that holds every boundary value, through the API and
straight to Kafka, and an event stamped by a clock running ahead within the allowed skew.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest
import yaml
from live_support import iso, ordinary

from ablab_testing import ABLAB, wait_for
from ablab_testing import flink_reference as ref
from ablab_testing.results import assert_same_results

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

EXPERIMENT = "hostile"


def _phase(tag: str, count: int, experiment: str = EXPERIMENT) -> list[dict]:
    """``count`` ordinary events stamped from now on, in time order (nothing late by
    construction, nothing before the experiment's start, from which results count)."""
    now = time.time()
    return [ordinary(experiment, "ab"[i % 2], f"{tag}-{uuid.uuid4().hex[:10]}", ts=iso(now + i * 0.001),
                     e2e=100.0 + (i % 13) * 7 + (25 if i % 2 else 0)) for i in range(count)]


def _deep(depth: int) -> bytes:
    return b'{"events": [' + b'{"a": ' * depth + b"1" + b"}" * depth + b"]}"


def test_poison_records_never_stop_the_pipeline(live_stack):
    stack = live_stack
    stack.create_experiment(EXPERIMENT)
    sent: list[dict] = []
    poison_traces: dict[str, str] = {}  # trace_id → case

    def send_ordinary(tag: str, count: int = 60) -> None:
        batch = _phase(tag, count)
        response = stack.post_events(batch)
        assert response.status_code == 202 and response.json()["accepted"] == count, response.text
        sent.extend(batch)

    def poison(case: str, **changes) -> dict:
        event = {**_phase(case, 1)[0], **changes}
        poison_traces[event["trace_id"]] = case
        return event

    send_ordinary("p1")
    # --- through the API -------------------------------------------------------------------------
    refused_at_edge = 0
    for case, changes in [("huge-latency", {"e2e_ms": 1.7e308}), ("year-9999", {"ts": "9999-12-31T00:00:00Z"}),
                          ("unknown-variant", {"variant": "zzz"})]:
        response = stack.post_events([poison(case, **changes)])
        assert response.status_code < 500, (case, response.text)
        refused_at_edge += response.json().get("rejected", 0) if response.status_code == 202 else 1
        send_ordinary(f"after-{case}", 20)
    deep = stack.post_events(_deep(1000))
    assert 400 <= deep.status_code < 500 and deep.headers["content-type"].startswith("application/problem+json"), deep.text
    garbage = stack.post_events(b"\xff\xfe\x00garbage{{")
    assert garbage.status_code == 400, garbage.text
    # --- straight to Kafka: the edge never sees these ------------------------------------------
    direct = [poison("direct-huge", e2e_ms=1.7e308), poison("direct-9999", ts="9999-12-31T00:00:00Z"),
              poison("direct-negative", ttft_ms=-5.0)]
    anonymous = {k: v for k, v in _phase("direct-anon", 1)[0].items()}  # no event_id, delivered twice
    stack.produce_direct([*direct, b"\x00\x01 not json at all", anonymous, anonymous])
    sent.append(anonymous)
    send_ordinary("p2")

    # The loader keeps going: everything ordinary is stored, its offsets committed to the end.
    wait_for(lambda: stack.results(EXPERIMENT).get("metrics") and sum(
        m["n"] for m in stack.results(EXPERIMENT)["metrics"] if m["metric"] == "e2e_ms") == len(sent),
        timeout_s=120, what="every ordinary event in /results", on_timeout=stack.diagnosis)
    # The Flink job rejected the direct year-9999 record (a rejected row, dead-lettered by the
    # loader from the windows topic) and a checkpoint completed after that; then the job
    # restarts from that checkpoint.
    wait_for(stack.checkpoints, timeout_s=240, what="the job's first checkpoint", on_timeout=stack.diagnosis)

    def job_rejected() -> bool:
        return any(letter["source"] == "loader:ablab.windows" and direct[1]["trace_id"] in letter["raw"]
                   for letter in stack.dead_letters())

    wait_for(job_rejected, timeout_s=120, what="the job's rejection of the year-9999 record", on_timeout=stack.diagnosis)
    checkpoint = stack.checkpoints()
    wait_for(lambda: stack.checkpoints() > checkpoint, timeout_s=60, what="a checkpoint after the poison")
    stack.restart_flink()
    send_ordinary("p3")
    stack.close_windows(after=time.time())

    # Every ordinary event is in the windows, on time: the watermark was never moved to 9999
    # (after which every later event on that partition would be late), not even after the restore.
    def windows_complete() -> dict | None:
        series = stack.timeseries(EXPERIMENT)["series"]
        points = [p for s in series for p in s["points"]]
        return series if sum(p["n"] for p in points) == len(sent) else None

    series = wait_for(windows_complete, timeout_s=180, what="every ordinary event in the 10 s windows",
                        on_timeout=stack.diagnosis)
    assert sum(p["late"] for s in series for p in s["points"]) == 0
    by_variant = {s["variant"]: sum(p["n"] for p in s["points"]) for s in series}
    assert by_variant == {v: sum(1 for e in sent if e["variant"] == v) for v in "ab"}
    e2e_sum = sum(p["n"] * p["value"] for s in series for p in s["points"])
    assert e2e_sum == pytest.approx(sum(e["e2e_ms"] for e in sent), rel=1e-9)

    results = stack.results(EXPERIMENT)
    assert {m["variant"] for m in results["metrics"]} == {"a", "b"}  # "zzz" never became a variant
    assert {m["variant"]: m["n"] for m in results["metrics"] if m["metric"] == "e2e_ms"} == by_variant

    # Every poison record is refused or dead-lettered, with its reason, and counted.
    letters = stack.dead_letters()
    lettered = {trace for trace in poison_traces for letter in letters if trace in letter.get("raw", "")}
    assert lettered == set(poison_traces), {poison_traces[t] for t in set(poison_traces) - lettered}
    assert any(letter["source"].startswith("loader:ablab.windows") and "9999" in letter["raw"] for letter in letters)
    assert any("not json" in letter["raw"] for letter in letters)  # the direct garbage bytes
    metrics = stack.metrics()
    assert metrics.get("ablab_loader_dead_lettered_records_total{field=e2e_ms}", 0) >= 1
    assert metrics.get("ablab_loader_dead_lettered_records_total{field=ts}", 0) >= 2
    assert metrics.get("ablab_loader_dead_lettered_records_total{field=$}", 0) >= 1
    assert metrics.get("ablab_loader_failing") == 0.0 and metrics.get("ablab_loader_failures_total") == 0.0
    assert metrics["ablab_loader_last_success_timestamp_seconds"] > time.time() - 60
    wait_for(lambda: sum(v for k, v in stack.metrics().items() if k.startswith("ablab_loader_consumer_lag")) == 0,
               timeout_s=30, what="the loader's lag back to 0")
    ready = stack.client("viewer").get("/readyz")
    assert ready.status_code == 200, ready.text
    assert set(json.loads(ready.text)["checks"]) >= {"loader", "emitter", "stream_job", "clickhouse"}


AHEAD_S = 40.0
"""How far ahead of the clock one producer stamps an event: inside the edge's 300 s, and far
beyond the job's 5 s out-of-orderness bound."""


def test_boundary_values_and_a_clock_running_ahead_reconcile(live_stack, tmp_path):
    stack = live_stack
    key = "boundary"
    experiment = stack.create_experiment(key)
    from ablab.platform.events import Rejection, validate_event

    sent: list[dict] = []  # everything offered, through the API or straight to Kafka
    kept: list[dict] = []  # what the edge's validation (which the loader shares) keeps

    def offer(events: list[dict], *, direct: bool = False) -> None:
        verdicts = [validate_event(json.dumps(e)) for e in events]
        good = [e for e, v in zip(events, verdicts) if not isinstance(v, Rejection)]
        if direct:
            stack.produce_direct(events)
        else:
            response = stack.post_events(events)
            assert response.status_code == 202, response.text
            assert (response.json()["accepted"], response.json()["rejected"]) == (len(good), len(events) - len(good))
        sent.extend(events)
        kept.extend(good)

    offer(_phase("before", 30, key))
    offer([ordinary(key, "a", f"ahead-{uuid.uuid4().hex[:8]}", ts=iso(time.time() + AHEAD_S))])
    now = iso(time.time())
    for route in ("edge", "direct"):
        offer([ref.coherent(ordinary(key, "ab"[i % 2], f"{route}-bound-{i}-{uuid.uuid4().hex[:6]}", ts=now), name, value)
               for i, (name, value) in enumerate(ref.boundary_values())], direct=route == "direct")
    assert any(e["e2e_ms"] == 0 and str(e["e2e_ms"]) == "-0.0" for e in kept)  # -0.0 is in range
    assert len(kept) < len(sent)  # some boundary values are out of it
    offer(_phase("after", 30, key))

    # The ahead event's window closes only once real time has reached it: keep moving every
    # partition's event time with the clock until every kept event is in a window.
    def windows_complete() -> list | None:
        stack.close_windows(after=time.time() - 15)
        series = stack.timeseries(key)["series"]
        return series if sum(p["n"] for s in series for p in s["points"]) == len(kept) else None

    series = wait_for(windows_complete, timeout_s=AHEAD_S + 150, what="every kept event in the 10 s windows",
                      on_timeout=stack.diagnosis)
    # The clock running ahead made no on-time event late (it flagged ~30 % of a window before).
    assert sum(p["late"] for s in series for p in s["points"]) == 0
    windowed = {s["variant"]: sum(p["n"] for p in s["points"]) for s in series}
    assert windowed == {v: sum(1 for e in kept if e["variant"] == v) for v in "ab"}
    e2e_sum = sum(p["n"] * p["value"] for s in series for p in s["points"])
    assert e2e_sum == pytest.approx(sum(e["e2e_ms"] for e in kept), rel=1e-9)

    # raw = windows: /results counts what the windows count (n 7 against 6 before, for -0.0).
    def results_complete() -> dict | None:
        results = stack.results(key)
        counted = {m["variant"]: m["n"] for m in results["metrics"] if m["metric"] == "e2e_ms"}
        return results if counted == windowed else None

    live = wait_for(results_complete, timeout_s=60, what="/results to count every kept event")
    # Every refused boundary value was refused or dead-lettered by each component, with its field.
    refused_direct = [e for e in sent if e["trace_id"].startswith("direct-") and e not in kept]
    letters = stack.dead_letters()
    for source in ("loader:ablab.inference", "loader:ablab.windows"):
        lettered = {e["trace_id"] for e in refused_direct for letter in letters
                    if letter["source"] == source and e["trace_id"] in letter["raw"]}
        assert lettered == {e["trace_id"] for e in refused_direct}, source

    # /results equals `ablab analyze` over the same file, refused events and all.
    events_file = tmp_path / "boundary.jsonl"
    events_file.write_text("".join(json.dumps(e) + "\n" for e in sent))
    config = tmp_path / "boundary.yaml"
    config.write_text(yaml.safe_dump({
        "key": key, "control": experiment["control"], "unit": experiment["unit"],
        "variants": [{"key": v["key"], "weight": v["weight"], "strategy": v["strategy"]} for v in experiment["variants"]],
        "start": experiment["started_at"],
    }))
    analyzed = subprocess.run([ABLAB, "analyze", str(events_file), "--config", str(config), "--json"],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    offline = json.loads(analyzed[analyzed.index("{"):])
    assert {m["variant"]: m["n"] for m in offline["metrics"] if m["metric"] == "e2e_ms"} == windowed
    assert_same_results(live, offline)
