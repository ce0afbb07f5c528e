"""HttpEventSink: ids fixed at emit time, so a re-posted batch is recognisably the same."""

from __future__ import annotations

import httpx

from ablab.platform.sdk.sinks import HttpEventSink


def test_a_batch_retried_after_a_lost_response_keeps_its_event_ids():
    posted: list[list[dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(httpx.Response(200, content=request.content).json()["events"])
        if len(posted) == 1:  # the API stored the batch but the answer never arrived
            return httpx.Response(503)
        return httpx.Response(202, json={"accepted": len(posted[-1]), "rejected": 0})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    sink = HttpEventSink("http://api.invalid", "token", client=client, flush_interval_s=60)
    caller_event = {"v": 1, "type": "rum", "ts": "2026-12-03T00:00:00+00:00", "trace_id": "t1", "e2e_ms": 5.0}
    sink.emit(caller_event)
    sink.emit({**caller_event, "trace_id": "t2", "event_id": "given-id"})
    sink.close()

    assert len(posted) == 2
    first, retry = ([e["event_id"] for e in batch] for batch in posted)
    assert first == retry
    assert first[1] == "given-id" and first[0] != first[1]
    assert "event_id" not in caller_event  # the caller's dict is not mutated
