"""A policy variant through the real gateway (uvicorn, the SDK's assignment, the outbox) in
front of the scripted backend (issue #33): each request draws an arm, the arm's strategy
reaches the backend, and its events carry ``arm``, ``propensity``, ``policy_version`` and the
features the decision saw, from which the propensity is recomputed exactly."""

from __future__ import annotations

import dataclasses
import json

import httpx

from ablab.platform.events import validate_event
from ablab.platform.policy.evaluate import Decider, recompute_propensity
from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import fit_after_exploring, router_policy
from ablab.platform.policy.spec import parse_policy
from ablab_testing.gateway_harness import gateway_for

RULE = {"kind": "rule", "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help."}},
        "rules": [{"when": {"attr.plan": {"in": ["pro"]}, "max_tokens": {"le": 100}}, "arm": "terse"}],
        "default": "helpful", "explore": 0.2}
BODY = {"model": "m", "messages": [{"role": "user", "content": "say something useful please"}], "max_tokens": 50}


def _events(gw, trace: str) -> dict[str, dict]:
    return {e["type"]: e for e in gw.events() if e["trace_id"] == trace}


def test_each_request_draws_an_arm_whose_strategy_reaches_the_backend(backend, tmp_path) -> None:
    variants = {"router": {"policy": RULE}, "plain": {"params": {"temperature": 0.2}}}
    policy = parse_policy(RULE)
    seen_arms = set()
    with gateway_for(backend.url, tmp_path, variants) as gw, httpx.Client(base_url=gw.url, timeout=30) as client:
        for i in range(40):
            plan = "pro" if i % 2 else "free"
            r = client.post("/v1/chat/completions", json=BODY,
                            headers={"X-Ablab-Unit": f"u{i}", "X-Ablab-Attr-Plan": plan})
            assert r.status_code == 200, r.text
            trace = r.headers["x-ablab-trace-id"]
            events = _events(gw, trace)
            if events["exposure"]["variant"] != "router":
                assert "arm" not in events["exposure"] and "arm" not in events["inference"]
                continue
            sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == trace)
            exposure, inference = events["exposure"], events["inference"]
            router_unit = f"u{i}"
            arm = inference["arm"]
            seen_arms.add(arm)
            assert sent["messages"][0] == {"role": "system", "content": policy.arms[arm]["system_prompt"]}
            assert exposure["arm"] == arm and exposure["propensity"] == inference["propensity"]
            assert inference["policy_version"] == exposure["policy_version"] == f"rule:{policy.content_hash}"
            assert inference["dims"]["plan"] == plan and inference["measures"]["max_tokens"] == 50
            validate_event(exposure), validate_event(inference)  # the outbox's own check passed too
            # the must-show: the logged propensity, recomputed from the logged features alone
            features = {"attr.plan": inference["dims"]["plan"], "max_tokens": inference["measures"]["max_tokens"]}
            assert recompute_propensity(policy, None, features, arm) == inference["propensity"]
            # and the same trace id with the same features draws the same arm
            again = Decider(policy, None, salt="exp:router").decide(features, trace)
            assert (again.arm, again.propensity) == (arm, inference["propensity"])
            expected = 0.8 if arm == ("terse" if plan == "pro" else "helpful") else 0.2
            assert inference["propensity"] == expected
        # a streamed request draws and logs the same way
        r = client.post("/v1/chat/completions", json={**BODY, "stream": True},
                        headers={"X-Ablab-Unit": router_unit, "X-Ablab-Attr-Plan": "pro"})
        assert r.status_code == 200 and "data: [DONE]" in r.text
        trace = r.headers["x-ablab-trace-id"]
        ev = _events(gw, trace)["inference"]
        sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == trace)
        assert ev["variant"] == "router" and _events(gw, trace)["exposure"]["arm"] == ev["arm"]
        assert sent["messages"][0]["content"] == policy.arms[ev["arm"]]["system_prompt"]
        assert ev["propensity"] == recompute_propensity(policy, None, {"attr.plan": "pro", "max_tokens": 50}, ev["arm"])
    assert seen_arms == {"terse", "helpful"}


def test_a_router_explores_uniformly_until_its_model_arrives_with_the_config(backend, tmp_path) -> None:
    router = router_policy()
    model = fit_after_exploring(router)
    body = {**BODY, "messages": [{"role": "user", "content": "word " * 300}]}
    with gateway_for(backend.url, tmp_path, {"router": {"policy": router.model_dump(mode="json")}}) as gw, \
            httpx.Client(base_url=gw.url, timeout=30) as client:
        r = client.post("/v1/chat/completions", json=body, headers={"X-Ablab-Unit": "u1", "X-Ablab-Attr-Plan": "pro"})
        ev = _events(gw, r.headers["x-ablab-trace-id"])["inference"]
        assert ev["policy_version"] == f"uniform:{router.content_hash}"
        assert ev["propensity"] == 1 / len(router.arms)
        # a config refresh with the model: a new revision, decisions by the model
        sdk = gw.state().sdk
        sdk.config = dataclasses.replace(sdk.config, revision="2",
                                         policy_models={("exp", "router"): json.loads(model.to_json())})
        r = client.post("/v1/chat/completions", json=body, headers={"X-Ablab-Unit": "u1", "X-Ablab-Attr-Plan": "pro"})
        trace = r.headers["x-ablab-trace-id"]
        ev = _events(gw, trace)["inference"]
        sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == trace)
    assert ev["policy_version"] == model.version
    assert sent["messages"][0]["content"] == router.arms[ev["arm"]]["system_prompt"]
    features = {"prompt_tokens": ev["measures"]["policy_prompt_tokens"], "attr.plan": ev["dims"]["plan"]}
    assert features["prompt_tokens"] > 250  # the gateway's estimate before the call
    loaded = PolicyModel.from_json(model.to_json())
    assert recompute_propensity(router, loaded, features, ev["arm"]) == ev["propensity"]
    assert ev["propensity"] in (router.explore, 1 - router.explore * (len(router.arms) - 1))


def test_a_broken_model_keeps_the_previous_one_and_is_counted_on_metrics(backend, tmp_path) -> None:
    router = router_policy()
    model = fit_after_exploring(router)
    body = {**BODY, "messages": [{"role": "user", "content": "word " * 300}]}
    headers = {"X-Ablab-Unit": "u1", "X-Ablab-Attr-Plan": "pro"}
    with gateway_for(backend.url, tmp_path, {"router": {"policy": router.model_dump(mode="json")}}) as gw, \
            httpx.Client(base_url=gw.url, timeout=30) as client:
        sdk = gw.state().sdk
        sdk.config = dataclasses.replace(sdk.config, revision="2",
                                         policy_models={("exp", "router"): json.loads(model.to_json())})
        client.post("/v1/chat/completions", json=body, headers=headers)
        assert 'ablab_gateway_policy_load_failures_total{reason="model"} 0.0' in client.get("/metrics").text
        # the next config publishes a model this gateway cannot read: the request is still
        # decided, by the model it had, and the failure is on /metrics
        sdk.config = dataclasses.replace(sdk.config, revision="3",
                                         policy_models={("exp", "router"): {"version": "broken", "cells": "?"}})
        r = client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        ev = _events(gw, r.headers["x-ablab-trace-id"])["inference"]
        metrics = client.get("/metrics").text
    assert ev["policy_version"] == model.version
    assert 'ablab_gateway_policy_load_failures_total{reason="model"} 1.0' in metrics
    assert 'ablab_gateway_policy_load_failures_total{reason="policy"} 0.0' in metrics
