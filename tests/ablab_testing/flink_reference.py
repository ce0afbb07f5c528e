"""An offline computation of what the Flink job must produce, for tests and benchmarks.

Pure functions over plain event dicts (the JSON the producers send), written
independently of the SQL: the window rows (counts, sums, sums of squares, percentiles by
linear interpolation as Flink's PERCENTILE), the RUM and the labels attributed to each
request's window by trace_id (as the store does), and which events *may* be late under the watermark
rule. Also a canned-stream generator with duplicates, bounded disorder, RUM, late events
and minutes-late feedback, whose metric values are dyadic rationals so that sums are
exact in floating point whatever order they are added in.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from ablab.platform.events import derive_event_id
from ablab.streaming.kafka.topics import RAW_PARTITIONS

WINDOW_MS = 10_000
SUM_FIELDS = {  # window column prefix → the event field it sums (ablab.platform.fields.window_column)
    "e2e_ms": "e2e_ms",
    "ttft_ms": "ttft_ms",
    "cost_usd": "cost_usd",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
}


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def window_start_ms(ts_ms: int) -> int:
    return ts_ms // WINDOW_MS * WINDOW_MS


def window_time_ms(ts_ms: int) -> int:
    return window_start_ms(ts_ms) + WINDOW_MS - 1


def identity(event: dict[str, Any]) -> str:
    """The job's identity of an inference event: its event_id, or (a producer that sent
    none) the one ``ablab.platform.events.derive_event_id`` gives, as 30_transform.sql computes it."""
    return event.get("event_id") or derive_event_id(event)


def dedup(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """First arrival of each identity, in arrival order (each with its ``event_id`` set)."""
    seen: set[str] = set()
    out = []
    for event in events:
        key = identity(event)
        if key not in seen:
            seen.add(key)
            out.append(event if event.get("event_id") else {**event, "event_id": key})
    return out


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` (murmur2, as the Java client)."""
    from kafka.partitioner.default import murmur2

    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def late_ids(arrivals: Iterable[dict[str, Any]], *, out_of_orderness_ms: int, partitions: int) -> set[str]:
    """event_ids the job classes as late: the first arrival of each event_id (later copies
    are dropped before the rule) whose ts is at or behind (largest ts read before it, or
    itself, from the same partition) minus the bound. ``arrivals`` in production order,
    keyed by trace_id as the producers do, which is each partition's read order. Each ts
    counts towards the maximum at most as its record's ``received_at`` (the Kafka record
    timestamp, when present), as the job counts it.

    The job also classes as late an event at or behind the current watermark; with
    partitions that never go idle (``idle_timeout_s = 0``) that adds nothing, since the
    watermark never passes a partition's own largest ts minus the bound."""
    late: set[str] = set()
    max_ts: dict[int, int] = {}
    for event in dedup(arrivals):
        partition = kafka_partition(event.get("trace_id") or event["event_id"], partitions)
        ts = parse_ms(event["ts"])
        counted = min(ts, parse_ms(event["received_at"])) if event.get("received_at") else ts
        max_ts[partition] = max(max_ts.get(partition, counted), counted)
        if ts <= max_ts[partition] - out_of_orderness_ms:
            late.add(event["event_id"])
    return late


def boundary_values() -> list[tuple[str, float | int]]:
    """(field, value) at and just past every physical bound of the fields the job screens
    (``ablab.platform.fields``): each bound exactly, the next double beyond it, -0.0 and the
    smallest subnormal beside a bound of 0, the largest finite double. The edge, the loader
    and the job must all keep or all refuse each one (issue 37)."""
    from ablab.platform.fields import FIELDS

    cases: list[tuple[str, float | int]] = []
    for f in FIELDS.values():
        if not f.flink:
            continue
        if f.type == "int":
            cases += [(f.name, int(f.lo)), (f.name, int(f.hi)), (f.name, int(f.lo) - 1), (f.name, int(f.hi) + 1)]
            continue
        cases += [(f.name, f.lo), (f.name, f.hi), (f.name, math.nextafter(f.hi, math.inf)),
                  (f.name, math.nextafter(f.lo, -math.inf)), (f.name, 5e-324), (f.name, 1.7976931348623157e308)]
        if f.lo == 0:
            cases.append((f.name, -0.0))
    return cases


def coherent(event: dict[str, Any], name: str, value: float | int) -> dict[str, Any]:
    """``event`` with ``name`` set to ``value`` and the other latencies chosen so that only
    ``value`` can make it invalid (TTFT <= e2e)."""
    return {**event, "ttft_ms": 0.0 if name == "e2e_ms" else 100.0, "e2e_ms": 1e6 if name == "ttft_ms" else 110.0,
            "tpot_ms": 5.0, name: value}


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 95, 99], method="linear")
    return float(p50), float(p95), float(p99)


def inference_windows(inference: Iterable[dict[str, Any]], *, late_ids: set[str]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(experiment, variant, window_start_ms) → the window row the job must emit."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in dedup(inference):
        if event["event_id"] in late_ids:
            continue
        groups[(event["experiment"], event["variant"], window_start_ms(parse_ms(event["ts"])))].append(event)
    rows = {}
    for key, events in groups.items():
        row: dict[str, Any] = {"n": len(events), "errors": sum(1 for e in events if e.get("error") is not None)}
        for name, source in SUM_FIELDS.items():
            row[f"{name}_sum"] = float(sum(e[source] for e in events))
            row[f"{name}_sumsq"] = float(sum(e[source] * e[source] for e in events))
        tpot = [e["tpot_ms"] for e in events if e.get("tpot_ms") is not None]
        row["tpot_ms_n"] = len(tpot)
        row["tpot_ms_sum"] = float(sum(tpot))
        row["tpot_ms_sumsq"] = float(sum(v * v for v in tpot))
        row["e2e_ms_p50"], row["e2e_ms_p95"], row["e2e_ms_p99"] = _percentiles([e["e2e_ms"] for e in events])
        row["ttft_ms_p50"], row["ttft_ms_p95"], row["ttft_ms_p99"] = _percentiles([e["ttft_ms"] for e in events])
        rows[key] = row
    return rows


def rum_windows(rum: Iterable[dict[str, Any]], inference: Iterable[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """RUM per (experiment, variant, window of the original request), as the store attributes
    it by trace_id: every RUM event (first copy of each event_id) of a request, however late."""
    by_trace = {e["trace_id"]: e for e in dedup(inference)}
    groups: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for event in dedup(rum):
        request = by_trace.get(event["trace_id"])
        if request is not None:
            groups[(request["experiment"], request["variant"], window_start_ms(parse_ms(request["ts"])))].append(
                event["e2e_ms"])
    return {key: {"n": len(values), "e2e_ms_sum": float(sum(values)), "e2e_ms_sumsq": float(sum(v * v for v in values)),
                  "e2e_ms_p95": _percentiles(values)[1]}
            for key, values in groups.items()}


def label_windows(feedback: Iterable[dict[str, Any]], inference: Iterable[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, int]]:
    """Labels per (experiment, variant, window of the original request); latest label wins."""
    latest: dict[str, dict[str, Any]] = {}
    for event in dedup(feedback):
        if event.get("correct") is None:
            continue
        current = latest.get(event["trace_id"])
        if current is None or parse_ms(event["ts"]) >= parse_ms(current["ts"]):
            latest[event["trace_id"]] = event
    rows: dict[tuple[str, str, int], dict[str, int]] = defaultdict(lambda: {"labeled": 0, "correct": 0})
    for request in dedup(inference):
        label = latest.get(request["trace_id"])
        if label is None:
            continue
        row = rows[(request["experiment"], request["variant"], window_start_ms(parse_ms(request["ts"])))]
        row["labeled"] += 1
        row["correct"] += int(label["correct"])
    return dict(rows)


# --- canned stream --------------------------------------------------------------------


@dataclass
class CannedStream:
    """Events per topic kind, each list in the order it must be produced."""

    inference: list[dict[str, Any]] = field(default_factory=list)
    rum: list[dict[str, Any]] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)


def inference_event(*, rng: random.Random, ts: datetime, experiment: str, variant: str, slow: float = 1.0) -> dict[str, Any]:
    output_tokens = rng.randint(1, 64)
    ttft = rng.randint(20, 400) / 4 * slow
    e2e = ttft + rng.randint(0, 4000) / 4 * slow
    event = {
        "v": 1, "type": "inference", "event_id": uuid.uuid4().hex, "ts": iso(ts), "trace_id": uuid.uuid4().hex,
        "experiment": experiment, "variant": variant, "unit_id": f"u{rng.randint(0, 40)}",
        "ttft_ms": ttft, "e2e_ms": e2e,
        "tpot_ms": (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else None,
        "prompt_tokens": rng.randint(10, 2000), "output_tokens": output_tokens,
        "device_s": rng.randint(1, 1000) / 1024, "cost_usd": rng.randint(1, 4096) / 1048576,
        "price_version": "p1", "error": "timeout" if rng.random() < 0.03 else None, "strategy": f"s-{variant}",
    }
    if event["tpot_ms"] is not None:
        # keep tpot dyadic too (exact sums): quantize to 1/64 ms
        event["tpot_ms"] = round(event["tpot_ms"] * 64) / 64
    return event


def canned_stream(
    *, start: datetime, windows: int, per_window: int, experiment: str, variants: tuple[str, ...] = ("control", "treatment"),
    seed: int = 7, jitter_ms: int = 1500, duplicate_rate: float = 0.05, rum_rate: float = 0.5,
    label_rate: float = 0.4,
) -> CannedStream:
    """``windows`` windows of on-time traffic with bounded disorder (``jitter_ms`` below the
    job's out-of-orderness) and duplicates, its RUM, and minutes-late feedback."""
    rng = random.Random(seed)
    stream = CannedStream()
    base = start.replace(microsecond=0)
    planned: list[tuple[float, dict[str, Any]]] = []
    for w in range(windows):
        for _ in range(per_window):
            offset_ms = w * WINDOW_MS + rng.randint(0, WINDOW_MS - 1)
            variant = rng.choice(variants)
            event = inference_event(rng=rng, ts=base + timedelta(milliseconds=offset_ms), experiment=experiment,
                                    variant=variant, slow=1.25 if variant == variants[-1] else 1.0)
            planned.append((offset_ms + rng.uniform(0, jitter_ms), event))  # arrival order: bounded disorder
    planned.sort(key=lambda item: item[0])
    for _, event in planned:
        stream.inference.append(event)
        if rng.random() < duplicate_rate:
            stream.inference.append(dict(event))  # a producer retry: same event_id
        ts_ms = parse_ms(event["ts"])
        if rng.random() < rum_rate:
            rum_ts = datetime.fromtimestamp((ts_ms + int(event["e2e_ms"]) + rng.randint(5, 200)) / 1000, UTC)
            stream.rum.append({"v": 1, "type": "rum", "event_id": uuid.uuid4().hex, "ts": iso(rum_ts),
                               "trace_id": event["trace_id"], "e2e_ms": event["e2e_ms"] + rng.randint(4, 400) / 4})
        if rng.random() < label_rate:
            label_ts = datetime.fromtimestamp((ts_ms + rng.randint(120_000, 300_000)) / 1000, UTC)
            stream.feedback.append({"v": 1, "type": "feedback", "event_id": uuid.uuid4().hex, "ts": iso(label_ts),
                                    "trace_id": event["trace_id"], "correct": rng.randint(0, 1), "source": "human"})
    return stream


def late_inference(*, start: datetime, count: int, experiment: str, variants: tuple[str, ...], seed: int = 11) -> list[dict[str, Any]]:
    """Inference events with timestamps in the first two windows after ``start``."""
    rng = random.Random(seed)
    base = start.replace(microsecond=0)
    return [
        inference_event(rng=rng, ts=base + timedelta(milliseconds=(i % 2) * WINDOW_MS + rng.randint(0, WINDOW_MS - 1)),
                        experiment=experiment, variant=variants[i % len(variants)])
        for i in range(count)
    ]


def closing_events(*, at: datetime, experiment: str, count: int = 12,
                   partitions: int = RAW_PARTITIONS) -> list[dict[str, Any]]:
    """Inference events far ahead in time, so that every partition's watermark passes the
    canned windows. Event ``i`` carries a trace id that the producers' key partitioner sends
    to partition ``i % partitions``: with ``count >= partitions`` every partition gets one.
    (Random trace ids would miss one of 3 partitions in about 2 % of runs at 12 events, and
    that partition's watermark would hold the last window open for good.)"""
    rng = random.Random(99)
    events = []
    for i in range(count):
        event = inference_event(rng=rng, ts=at, experiment=experiment, variant="control")
        event["trace_id"] = trace_id_on(i % partitions, partitions, rng=rng)
        events.append(event)
    return events


def trace_id_on(partition: int, partitions: int, *, rng: random.Random) -> str:
    """A trace id that the producers' key partitioner sends to ``partition`` of ``partitions``."""
    while True:
        trace = uuid.UUID(int=rng.getrandbits(128)).hex
        if kafka_partition(trace, partitions) == partition:
            return trace


# --- a replayed stream (issue 19): disorder, anonymous duplicates, late RUM and labels ----


@dataclass(frozen=True)
class Delivery:
    """One event as sent: ``at_s`` seconds after the replay starts."""

    at_s: float
    event: dict[str, Any]


def replay_stream(
    *, start_s: float, seconds: float = 60.0, rate: float = 25.0, experiment: str, variants: tuple[str, ...] = ("a", "b"),
    units: int = 80, seed: int = 19, disorder_s: float = 3.0, straggler_rate: float = 0.03,
    duplicate_rate: float = 0.05, rum_rate: float = 0.5, late_rum_rate: float = 0.1, label_rate: float = 0.4,
) -> list[Delivery]:
    """A deterministic stream like a live one, in send order. Event times start at ``start_s``
    (epoch seconds) and each inference event is sent up to ``disorder_s`` after its event
    time (a few, ``straggler_rate``, 10-20 s after: later than any watermark bound, so the
    job calls them late); inference events carry no ``event_id`` and ``duplicate_rate`` of
    them are delivered a second time (a client retrying); RUM follows its request by seconds
    (some by minutes, in event time), labels by one to two minutes. Whatever is ahead of
    the clock when the inference traffic ends is sent then (``at_s = seconds + 1``)."""
    rng = random.Random(seed)
    deliveries: list[Delivery] = []
    end = seconds + 1.0
    count = int(seconds * rate)
    offsets = sorted(rng.uniform(0, seconds) for _ in range(count))
    for i, offset in enumerate(offsets):
        unit = rng.randrange(units)
        e2e = round(rng.lognormvariate(math.log(180.0), 0.35) * (1.15 if unit % len(variants) else 1.0), 3)
        ttft = round(e2e * rng.uniform(0.15, 0.35), 3)
        event = {
            "v": 1, "type": "inference", "ts": _iso_s(start_s + offset), "trace_id": f"replay-{seed}-{i:06d}",
            "experiment": experiment, "variant": variants[unit % len(variants)], "unit_id": f"user-{unit:04d}",
            "ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": round((e2e - ttft) / 31, 4), "prompt_tokens": rng.randrange(20, 400),
            "output_tokens": 32, "device_s": round(e2e / 1000, 6), "cost_usd": round(e2e * 2e-6, 9),
            "price_version": "2026-01", "strategy": "replay",
        }
        delay = rng.uniform(10, 20) if rng.random() < straggler_rate else rng.uniform(0, disorder_s)
        deliveries.append(Delivery(offset + delay, event))
        if rng.random() < duplicate_rate:
            deliveries.append(Delivery(offset + delay + rng.uniform(0.5, 4.0), dict(event)))
        if rng.random() < rum_rate:
            minutes = rng.random() < late_rum_rate
            rum_at = offset + e2e / 1000 + (rng.uniform(60, 100) if minutes else rng.uniform(0.05, 0.5))
            rum = {"v": 1, "type": "rum", "event_id": f"rum-{seed}-{i:06d}", "ts": _iso_s(start_s + rum_at),
                   "trace_id": event["trace_id"], "e2e_ms": round(e2e + rng.uniform(5, 60), 3)}
            deliveries.append(Delivery(end if minutes else rum_at + rng.uniform(1, 6), rum))
        if rng.random() < label_rate:
            label = {"v": 1, "type": "feedback", "event_id": f"label-{seed}-{i:06d}",
                     "ts": _iso_s(start_s + offset + rng.uniform(60, 110)), "trace_id": event["trace_id"],
                     "correct": int(rng.random() < (0.7 if unit % len(variants) else 0.6)), "source": "human"}
            deliveries.append(Delivery(end, label))
    deliveries.sort(key=lambda d: d.at_s)
    return deliveries


def _iso_s(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def replay_windows(events: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """Offline per (variant, window start ms) over unique trace_ids: request count and sums of
    e2e, ttft and cost; RUM count and e2e sum (every RUM event of the request, once per
    event_id); labels (the latest per trace) and correct ones. What /timeseries must show."""
    requests: dict[str, dict[str, Any]] = {}
    rum: dict[str, dict[str, Any]] = {}
    labels: dict[str, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "inference":
            requests.setdefault(event["trace_id"], event)
        elif event["type"] == "rum":
            rum.setdefault(event["event_id"], event)
        elif event["type"] == "feedback":
            current = labels.get(event["trace_id"])
            if current is None or parse_ms(event["ts"]) >= parse_ms(current["ts"]):
                labels[event["trace_id"]] = event
    out: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for request in requests.values():
        row = out[(request["variant"], window_start_ms(parse_ms(request["ts"])))]
        row["n"] += 1
        row["e2e_ms_sum"] += request["e2e_ms"]
        row["ttft_ms_sum"] += request["ttft_ms"]
        row["cost_usd_sum"] += request["cost_usd"]
    for event in rum.values():
        request = requests.get(event["trace_id"])
        if request is not None:
            row = out[(request["variant"], window_start_ms(parse_ms(request["ts"])))]
            row["rum_n"] += 1
            row["rum_sum"] += event["e2e_ms"]
    for trace, label in labels.items():
        request = requests.get(trace)
        if request is not None:
            row = out[(request["variant"], window_start_ms(parse_ms(request["ts"])))]
            row["labeled"] += 1
            row["correct"] += label["correct"]
    return {key: dict(value) for key, value in out.items()}


def assert_window_row(actual: dict[str, Any], expected: dict[str, Any], key: Any) -> None:
    """A stored window row equals the computed one: counts and sums exactly (the canned
    values are dyadic, so any order of addition is exact), percentiles to rounding."""
    for name, value in expected.items():
        if name.endswith(("_p50", "_p95", "_p99")):
            assert math.isclose(actual[name], value, rel_tol=1e-12, abs_tol=1e-9), (key, name, actual[name], value)
        else:
            assert actual[name] == value, (key, name, actual[name], value)


def assert_window_rows(actual: dict[Any, dict[str, Any]], expected: dict[Any, dict[str, Any]]) -> None:
    """The same windows, each row equal (:func:`assert_window_row`)."""
    assert set(actual) == set(expected), (sorted(set(actual) ^ set(expected))[:10])
    for key, row in expected.items():
        assert_window_row(actual[key], row, key)
