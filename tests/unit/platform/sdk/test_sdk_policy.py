"""A policy variant through the SDK (issue #33): ``AblabClient.decide`` draws the arm as the
gateway does; ``track`` and the openai wrapper serve the arm's strategy and log the choice and
features, from which the logged propensity is recomputed exactly."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.events import validate_event
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.policy.evaluate import Decider, recompute_propensity
from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import fit_after_exploring, router_policy
from ablab.platform.policy.spec import parse_policy
from ablab.platform.sdk import AblabClient, ListSink, instrument_openai, track

RULE = {"kind": "rule", "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help.", "params": {"temperature": 0.7}}},
        "rules": [{"when": {"max_tokens": {"le": 100}}, "arm": "terse"}], "default": "helpful", "explore": 0.25}
MSGS = [{"role": "user", "content": "hello there"}]


def sdk_with(policy: dict) -> AblabClient:
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False, sink=ListSink())
    spec = ExperimentSpec(key="exp", salt="s", control="router", variants=(VariantSpec("router", 1.0, {"policy": policy}),))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    return sdk


@pytest.fixture(scope="module")
def backend():
    with ScriptedBackend(tokens=5) as b:
        yield b


def test_decide_is_the_gateways_draw() -> None:
    sdk = sdk_with(RULE)
    (a,) = sdk.assign("u1", log_exposure=False)
    served = sdk.decide(a, "trace-1", max_tokens=50)
    expected = Decider(parse_policy(RULE), None, salt="exp:router").decide({"max_tokens": 50}, "trace-1")
    assert served is not None and served.decision == expected
    assert served.strategy == parse_policy(RULE).arms[expected.arm]
    assert served.choice_fields() == {"arm": expected.arm, "propensity": expected.propensity,
                                      "policy_version": f"rule:{parse_policy(RULE).content_hash}"}
    plain = sdk_with(RULE)
    plain.config = AssignmentConfig(experiments=(ExperimentSpec(key="exp", salt="s", control="a",
                                                                variants=(VariantSpec("a", 1.0, {}),)),), revision="1")
    assert plain.decide(plain.assign("u1", log_exposure=False)[0], "t") is None


def test_the_openai_wrapper_serves_the_arm_and_logs_the_choice(backend) -> None:
    sdk = sdk_with(RULE)
    client = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)
    policy = parse_policy(RULE)
    arms = set()
    for i in range(24):
        max_tokens = 50 if i % 2 else 500
        resp = client.chat.completions.create(model="ok", messages=MSGS, user=f"u{i}", max_tokens=max_tokens)
        sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == resp._ablab_trace_id)
        events = {e["type"]: e for e in sdk.sink.events if e["trace_id"] == resp._ablab_trace_id}
        ev = events["inference"]
        validate_event(ev), validate_event(events["exposure"])
        arms.add(ev["arm"])
        assert sent["messages"][0] == {"role": "system", "content": policy.arms[ev["arm"]]["system_prompt"]}
        assert sent.get("temperature") == policy.arms[ev["arm"]].get("params", {}).get("temperature")
        assert events["exposure"]["propensity"] == ev["propensity"] and ev["measures"]["max_tokens"] == max_tokens
        features = {"max_tokens": ev["measures"]["max_tokens"]}
        assert recompute_propensity(policy, None, features, ev["arm"]) == ev["propensity"]
    assert arms == {"terse", "helpful"}


def test_track_uses_the_configs_model() -> None:
    router = router_policy()
    model = fit_after_exploring(router)
    sdk = sdk_with(router.model_dump(mode="json"))
    sdk.config = dataclasses.replace(sdk.config, policy_models={("exp", "router"): json.loads(model.to_json())})
    with track(sdk, "u1", prompt="word " * 200, attributes={"plan": "pro"}) as call:
        call.token("x")
    assert call.strategy["system_prompt"] == router.arms[call.served[0].decision.arm]["system_prompt"]
    ev = next(e for e in sdk.sink.events if e["type"] == "inference")
    assert ev["policy_version"] == model.version and ev["dims"]["plan"] == "pro"
    features = {"prompt_tokens": ev["measures"]["policy_prompt_tokens"], "attr.plan": ev["dims"]["plan"]}
    assert recompute_propensity(router, PolicyModel.from_json(model.to_json()), features, ev["arm"]) == ev["propensity"]
