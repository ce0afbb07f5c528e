"""Support for the live-pipeline tests (the ``live_stack`` fixture in conftest.py): a handle
on the running stack and ordinary events. Tests wait on observable state through it
(counters in /metrics, committed offsets, checkpoint ids), never on time alone."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ablab_testing import ApiServer


@dataclass
class LiveStack:
    bootstrap: str
    api: ApiServer
    flink: Any
    checkpoint_dir: Path
    log_dir: Path
    job: Any
    _clients: dict[str, httpx.Client] = field(default_factory=dict)

    def client(self, scope: str = "sdk") -> httpx.Client:
        if scope not in self._clients:
            self._clients[scope] = self.api.client(scope)
        return self._clients[scope]

    def create_experiment(self, key: str, variants: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
        editor = self.client("editor")
        editor.post("/v1/experiments", json={
            "key": key, "name": key, "traffic": 1, "control": variants[0], "unit": "user",
            "variants": [{"key": v, "weight": 1, **({"strategy": {"sparse_ffn_k": 16 + i}} if i else {})}
                         for i, v in enumerate(variants)],
        }).raise_for_status()
        editor.post(f"/v1/experiments/{key}/start").raise_for_status()
        return editor.get(f"/v1/experiments/{key}").json()

    def post_events(self, events: list[dict[str, Any]] | bytes) -> httpx.Response:
        if isinstance(events, bytes):
            return self.client().post("/v1/events", content=events, headers={"content-type": "application/json"})
        return self.client().post("/v1/events", json={"events": events})

    def metrics(self) -> dict[str, float]:
        """Pipeline samples as ``name{label=value,...}`` → value (parsed by prometheus_client)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.api.base_url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
        return out

    def loaded_raw(self) -> float:
        return self.metrics().get("ablab_loader_loaded_rows_total{table=raw_events}", 0.0)

    def timeseries(self, experiment: str, metric: str = "e2e_ms") -> dict[str, Any]:
        response = self.client("viewer").get(f"/v1/experiments/{experiment}/timeseries", params={"metric": metric})
        response.raise_for_status()
        return response.json()

    def results(self, experiment: str) -> dict[str, Any]:
        response = self.client("viewer").get(f"/v1/experiments/{experiment}/results")
        response.raise_for_status()
        return response.json()

    def checkpoints(self) -> int:
        """The newest completed checkpoint id (0 before the first)."""
        ids = [int(meta.parent.name.split("-")[1]) for meta in self.checkpoint_dir.glob("*/chk-*/_metadata")]
        return max(ids, default=0)

    def dead_letters(self) -> list[dict[str, Any]]:
        from ablab.streaming.kafka.consumer import read_topics
        from ablab.streaming.kafka.topics import DEADLETTER_TOPIC

        return [json.loads(r.value) for r in read_topics(bootstrap=self.bootstrap, topics=[DEADLETTER_TOPIC], idle_s=2.0)]

    def produce_direct(self, values: list[dict[str, Any] | bytes], *, topic: str = "ablab.inference") -> None:
        """A producer that bypasses the API (writes to Kafka itself)."""
        from ablab_testing.pipeline import RawProducer

        producer = RawProducer(self.bootstrap)
        try:
            producer.send(topic, values, key=b"direct")
        finally:
            producer.close()

    def close_windows(self, *, after: float, partitions: int = 3) -> None:
        """Events of a second experiment at ``after`` + 15 s on every partition: the watermark
        passes every window before ``after`` (each partition must advance; none goes idle)."""
        from ablab_testing.flink_reference import trace_id_on

        ts = iso(after + 15)
        rng = random.Random()
        events = [ordinary("flush", "a", trace_id_on(p, partitions, rng=rng), ts=ts) for p in range(partitions)]
        response = self.post_events(events)
        assert response.status_code == 202 and response.json()["accepted"] == len(events), response.text

    def restart_flink(self) -> None:
        """Stop the job and start it again from its newest checkpoint."""
        from ablab.streaming.flink.local import FlinkProcess

        self.flink.stop()
        self.flink = FlinkProcess(self.job, log_path=self.log_dir / "flink-restarted.log").start()

    def diagnosis(self) -> str:
        tail = (self.api.home / "api.log").read_text(errors="replace").splitlines()[-30:]
        return "\n".join(["API log:", *tail, self.flink.log_tail(20)])


def iso(epoch_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ordinary(experiment: str, variant: str, trace: str, *, ts: str, e2e: float = 120.0, unit: str | None = None,
             event_id: str | None = None) -> dict[str, Any]:
    event = {
        "v": 1, "type": "inference", "ts": ts, "trace_id": trace, "experiment": experiment, "variant": variant,
        "unit_id": unit or f"u-{trace[-3:]}", "ttft_ms": round(e2e / 4, 3), "e2e_ms": e2e, "tpot_ms": 5.0,
        "prompt_tokens": 20, "output_tokens": 8, "device_s": e2e / 1000, "cost_usd": round(e2e * 1e-6, 9),
        "price_version": "2026-01", "strategy": "baseline",
    }
    if event_id is not None:
        event["event_id"] = event_id
    return event


