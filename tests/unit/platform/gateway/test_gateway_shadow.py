"""Shadows through a real gateway (uvicorn) in front of real scripted backends: the fraction's
choice, the cap (a full cap drops, never queues), the timeout, failure isolation (a shadow
that hangs, errors or cannot connect never touches the primary), the events (``shadow`` on the
primary's, ``shadow_of`` on the shadow's own) and the Prometheus counters."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.events import InferenceEvent, Rejection, validate_event
from ablab.platform.gateway.app import create_app
from ablab.platform.gateway.scripted import WORDS, ScriptedBackend
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.gateway.shadow import Cap, ShadowSpec, chosen
from ablab.platform.sdk import AblabClient
from ablab_testing.gateway_harness import Gateway, free_port, serve

MSGS = [{"role": "user", "content": "hello"}]
ANSWER = "".join(WORDS[i % len(WORDS)] for i in range(9))


def shadow(strategy: dict[str, Any], *, fraction: float = 1.0, cap: int = 8, timeout_s: float = 5.0) -> dict[str, Any]:
    return {"strategy": strategy, "fraction": fraction, "max_concurrency": cap, "timeout_s": timeout_s}


@contextmanager
def shadowed_gateway(backend_url: str, tmp: Path, exp_shadow: dict[str, Any] | None, *,
                     variant_shadows: dict[str, dict[str, Any]] | None = None, launch: str = "after",
                     extra: dict[str, Backend] | None = None, max_inflight: int = 64) -> Iterator[Gateway]:
    backends = {"scripted": Backend("scripted", backend_url, timeout_s=5.0), **(extra or {})}
    settings = GatewaySettings(backends=backends, default_backend="scripted", outbox_dir=tmp / "outbox",
                               shadow_launch=launch, shadow_max_inflight=max_inflight)
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    vs = variant_shadows or {}
    spec = ExperimentSpec(key="exp", salt="exp-salt", control="a", shadow=exp_shadow,
                          variants=(VariantSpec("a", 1.0, {}, shadow=vs.get("a")),
                                    VariantSpec("b", 1.0, {"params": {"temperature": 0.2}}, shadow=vs.get("b"))))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    sdk._ready.set()
    app = create_app(settings, sdk=sdk, ship=False)
    with serve(app) as url:
        yield Gateway(url, tmp / "outbox", app)


def chat(gw: Gateway, unit: str, *, stream: bool = False, model: str = "ok") -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", json={"model": model, "messages": MSGS, "stream": stream},
                      headers={"X-Ablab-Unit": unit}, timeout=10)


def inference(gw: Gateway) -> tuple[dict[str, dict], dict[str, dict]]:
    """(primaries by trace id, shadows by primary trace id); every event valid."""
    primaries, shadows = {}, {}
    for e in gw.events():
        assert not isinstance(validate_event(e), Rejection), (e, validate_event(e))
        if e["type"] != "inference":
            continue
        if e.get("shadow_of"):
            shadows[e["shadow_of"]] = e
        else:
            primaries[e["trace_id"]] = e
    return primaries, shadows


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def metric(gw: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0 if want else float("nan")


@pytest.fixture(scope="module")
def backend() -> Iterator[ScriptedBackend]:
    with ScriptedBackend(tokens=9) as b:
        yield b


# --- the choice ---------------------------------------------------------------------------


def test_the_choice_is_deterministic_per_trace_and_matches_the_fraction() -> None:
    traces = [f"{i:032x}" for i in range(20_000)]
    share = sum(chosen(t, "exp", 0.1) for t in traces) / len(traces)
    assert abs(share - 0.1) < 0.01  # binomial sd 0.002
    assert [chosen(t, "exp", 0.1) for t in traces[:500]] == [chosen(t, "exp", 0.1) for t in traces[:500]]
    assert not any(chosen(t, "exp", 0.0) for t in traces[:1000]) and all(chosen(t, "exp", 1.0) for t in traces[:1000])
    # nested: a larger fraction shadows every trace a smaller one does (ramping up adds, never swaps)
    assert all(chosen(t, "exp", 0.3) for t in traces if chosen(t, "exp", 0.1))
    # each experiment draws its own sample
    both = sum(chosen(t, "exp", 0.5) and chosen(t, "other", 0.5) for t in traces) / len(traces)
    assert abs(both - 0.25) < 0.02


def test_the_cap_is_taken_without_waiting() -> None:
    cap = Cap(2)
    assert cap.try_acquire() and cap.try_acquire() and not cap.try_acquire()
    cap.release()
    assert cap.try_acquire() and cap.inflight == 2
    assert ShadowSpec.parse({"strategy": {}, "fraction": 2}) is None  # malformed config: no shadow, logged


def test_the_fraction_decides_which_primaries_get_a_shadow(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "reasoning"}, fraction=0.5)) as gw:
        traces = [chat(gw, f"u{i}").headers["x-ablab-trace-id"] for i in range(40)]
        expected = {t for t in traces if chosen(t, "exp", 0.5)}
        assert 5 < len(expected) < 35
        wait_for(lambda: len(inference(gw)[1]) == len(expected))
        primaries, shadows = inference(gw)
        assert {t for t, e in primaries.items() if e.get("shadow") == "sent"} == expected == set(shadows)
        assert all("shadow" not in e for t, e in primaries.items() if t not in expected)  # not chosen: absent
        for primary_trace, s in shadows.items():
            p = primaries[primary_trace]
            assert s["trace_id"] != primary_trace and s["error"] is None
            assert (s["experiment"], s["variant"], s["unit_id"]) == (p["experiment"], p["variant"], p["unit_id"])
            assert s["strategy"] != p["strategy"] and s["output_tokens"] == 9
        # no exposure for a shadow: no unit saw it
        assert {e["trace_id"] for e in gw.events() if e["type"] == "exposure"} == set(traces)
        assert metric(gw, "ablab_gateway_shadows_total", experiment="exp", result="sent") == len(expected)
        assert metric(gw, "ablab_gateway_shadows_total", experiment="exp", result="ok") == len(expected)
        # the callers' request counters and histograms count only the primaries
        assert metric(gw, "ablab_gateway_requests_total", outcome="ok") == 40


# --- isolation ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_failing_shadow_never_touches_the_primary(backend: ScriptedBackend, tmp_path: Path, stream: bool) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    extra = {"dead": Backend("dead", dead, timeout_s=5.0)}
    variant_shadows = {"a": shadow({"model": "http500"}), "b": shadow({"backend": "dead"})}
    with shadowed_gateway(backend.url, tmp_path, None, variant_shadows=variant_shadows, extra=extra) as gw:
        for i in range(8):
            r = chat(gw, f"u{i}", stream=stream)
            assert r.status_code == 200
            if stream:
                text = "".join(line for line in r.text.split("\n") if line.startswith("data: {"))
                assert '"content":"Hello"' in text and "error" not in text
            else:
                assert r.json()["choices"][0]["message"]["content"] == ANSWER
        wait_for(lambda: len(inference(gw)[1]) == 8)
        primaries, shadows = inference(gw)
        assert all(p["error"] is None and p["shadow"] == "sent" for p in primaries.values())
        reasons = {primaries[t]["variant"]: s["error"] for t, s in shadows.items()}
        assert reasons == {"a": "backend_http_500", "b": "backend_unreachable"}
        assert metric(gw, "ablab_gateway_shadows_total", experiment="exp", result="failed") == 8
        assert metric(gw, "ablab_gateway_shadow_failures_total", experiment="exp", reason="backend_http_500") >= 1
        assert metric(gw, "ablab_gateway_shadow_failures_total", experiment="exp", reason="backend_unreachable") >= 1


def test_a_full_cap_drops_never_queues_and_a_hung_shadow_times_out(backend: ScriptedBackend, tmp_path: Path) -> None:
    # The shadows hang until their 5 s timeout. Had a primary waited for its shadow, the
    # slots would be free again by the third request (sent, not dropped) and none in flight.
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "hang"}, cap=2, timeout_s=5.0)) as gw:
        responses = [chat(gw, f"u{i}") for i in range(6)]
        assert all(r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER for r in responses)
        primaries, _ = inference(gw)
        by_trace = [primaries[r.headers["x-ablab-trace-id"]]["shadow"] for r in responses]
        assert by_trace == ["sent", "sent", "dropped", "dropped", "dropped", "dropped"]
        assert metric(gw, "ablab_gateway_shadows_total", experiment="exp", result="dropped") == 4
        assert metric(gw, "ablab_gateway_shadow_inflight", experiment="exp") == 2
        wait_for(lambda: len(inference(gw)[1]) == 2, timeout=30)
        _, shadows = inference(gw)
        for s in shadows.values():
            assert s["error"] == "shadow_timeout" and s["e2e_ms"] >= 4950 and s["output_tokens"] == 0
        assert metric(gw, "ablab_gateway_shadow_failures_total", experiment="exp", reason="shadow_timeout") == 2
        # the slots came back: the next chosen request is sent again
        wait_for(lambda: metric(gw, "ablab_gateway_shadow_inflight", experiment="exp") == 0)
        r = chat(gw, "u-next")
        assert inference(gw)[0][r.headers["x-ablab-trace-id"]]["shadow"] == "sent"


def test_the_process_wide_cap_drops_too(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "hang"}, cap=8, timeout_s=1.0), max_inflight=1) as gw:
        traces = [chat(gw, f"u{i}").headers["x-ablab-trace-id"] for i in range(3)]
        assert [inference(gw)[0][t]["shadow"] for t in traces] == ["sent", "dropped", "dropped"]


@pytest.mark.parametrize("launch", ["after", "beside"])
def test_a_streamed_shadow_is_metered_and_its_answer_kept_not_returned(backend: ScriptedBackend, tmp_path: Path,
                                                                       launch: str) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "sleep-20", "system_prompt": "Be brief."}),
                          launch=launch) as gw:
        r = chat(gw, "u1", stream=True)
        assert r.status_code == 200 and '"model":"ok"' in r.text and "sleep-20" not in r.text  # the primary's answer
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        s = inference(gw)[1][trace]
        # 9 chunks, each 20 ms after the last: TTFT ≈ 20 ms, e2e ≈ 180 ms, tokens from the usage chunk
        assert 15 <= s["ttft_ms"] < s["e2e_ms"] and s["e2e_ms"] >= 160 and s["output_tokens"] == 9
        assert s["measures"]["tokens_estimated"] == 0 and s["measures"]["itl_ms_mean"] >= 15
        runner = gw.state().shadows
        assert runner.last_answers[s["trace_id"]] == ANSWER  # kept for graders
        headers, body = next((h, b) for h, b in reversed(backend.requests) if h.get("x-request-id") == s["trace_id"])
        assert headers["x-ablab-shadow-of"] == trace and body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert body["messages"][1:] == MSGS and body["stream"] is True
        # its own pool: none of the primaries' clients
        primary_clients = {id(c) for pool in gw.state().clients.values() for c in pool.clients}
        assert not primary_clients & {id(c) for c in runner._clients.values()}


def test_answers_are_bounded(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({})) as gw:
        runner = gw.state().shadows
        runner.answer_limit = 7
        r = chat(gw, "u1", stream=True)
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        assert runner.last_answers[inference(gw)[1][trace]["trace_id"]] == ANSWER[:7]
    # an SSE event that never ends is cut at the body limit (1 MiB); the primary is served as ever
    with shadowed_gateway(backend.url, tmp_path / "flood", shadow({"model": "flood"})) as gw:
        r = chat(gw, "u2", stream=True)
        assert r.status_code == 200 and '"content":"Hello"' in r.text
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        assert inference(gw)[1][trace]["error"] == "shadow_response_too_large"
        gw.state().shadows.body_limit = 64  # a whole body longer than this: the same
        r = chat(gw, "u3", model="ok")
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        assert inference(gw)[1][trace]["error"] == "shadow_response_too_large"


def test_a_shadow_strategy_the_gateway_cannot_serve_is_a_failed_shadow(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"backend": "nowhere"})) as gw:
        r = chat(gw, "u1")
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        assert inference(gw)[1][trace]["error"] == "strategy_unsupported"


def test_stopping_the_gateway_records_the_shadows_in_flight(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "hang"}, timeout_s=60)) as gw:
        r = chat(gw, "u1")
        wait_for(lambda: metric(gw, "ablab_gateway_shadow_inflight", experiment="exp") == 1)
    _, shadows = inference(gw)
    assert shadows[r.headers["x-ablab-trace-id"]]["error"] == "shadow_cancelled"


def test_shadow_events_validate_against_the_schema(backend: ScriptedBackend, tmp_path: Path) -> None:
    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "ok"})) as gw:
        chat(gw, "u1")
        wait_for(lambda: len(inference(gw)[1]) == 1)
        for e in gw.events():
            if e["type"] == "inference":
                assert isinstance(validate_event(e), InferenceEvent), validate_event(e)
        assert gw.state().outbox.refused == 0


def test_a_rewrite_hook_serves_shadows_within_their_budget(backend: ScriptedBackend, tmp_path: Path) -> None:
    """The gateway's whole rewrite (its prompt strategies, which may ask the backend) can serve
    shadows too: it gets the shadow's own trace id, and its time counts in the shadow's timeout."""
    import asyncio

    with shadowed_gateway(backend.url, tmp_path, shadow({"model": "ok"}, timeout_s=0.5)) as gw:
        calls = []

        async def rewrite(body, strategy, *, chat, backend, trace_id):
            calls.append((trace_id, backend.name, dict(strategy)))
            if body.get("user") == "slow":
                await asyncio.sleep(2)
            return {**body, "model": "reasoning"}

        gw.state().shadows.rewrite = rewrite
        r = chat(gw, "u1")
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        s = inference(gw)[1][trace]
        assert s["error"] is None and calls == [(s["trace_id"], "scripted", {"model": "ok"})]
        assert next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == s["trace_id"])["model"] == "reasoning"
        r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS, "user": "slow"}, timeout=10)
        trace = r.headers["x-ablab-trace-id"]
        wait_for(lambda: trace in inference(gw)[1])
        s = inference(gw)[1][trace]
        assert s["error"] == "shadow_timeout" and 450 <= s["e2e_ms"] < 1500


def test_a_shadows_prompt_strategies_are_applied_and_noted_in_its_event(backend: ScriptedBackend, tmp_path: Path) -> None:
    """The gateway rewrites a shadow's request with its whole rewrite, as a variant's: here
    ``dialogue_state`` (slots instead of the history); its notes land in the shadow's event."""
    convo = [{"role": "user", "content": "Hi, my name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
             {"role": "user", "content": "What is my name?"}]
    strategy = {"dialogue_state": {"slots": {"name": r"(?i)my name is (\w+)"}}}
    with shadowed_gateway(backend.url, tmp_path, shadow(strategy)) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": convo},
                       headers={"X-Ablab-Unit": "u1"}, timeout=10)
        assert r.status_code == 200
        trace = r.headers["x-ablab-trace-id"]
        primary = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == trace)
        assert primary["messages"] == convo  # the variant's own request: untouched
        wait_for(lambda: trace in inference(gw)[1])
        s = inference(gw)[1][trace]
        sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == s["trace_id"])
        assert sent["messages"][-1] == convo[-1] and len(sent["messages"]) == 2 and "name: Ada" in sent["messages"][0]["content"]
        assert s["error"] is None and s["measures"]["ds_turns_in"] == 3 and s["measures"]["ds_turns_out"] == 1
