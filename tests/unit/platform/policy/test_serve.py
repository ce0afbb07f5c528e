"""The per-request helper the gateway and the SDK share: deciders cached per variant and
rebuilt only when the policy or the model changes; a model that fails to load keeps the
previous decider (counted); features read from the request; the choice and features put on
the variant's own events only."""

from __future__ import annotations

import json

from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.serve import PROMPT_MEASURE, PolicyServer, features_of
from ablab.platform.policy.simulate import fit_after_exploring, router_policy

ROUTER = router_policy()
POLICY = ROUTER.model_dump(mode="json")
MODEL = json.loads(fit_after_exploring(ROUTER).to_json())


def test_deciders_are_cached_and_a_bad_model_keeps_the_previous_one() -> None:
    server = PolicyServer()
    first = server.entry("e", "v", POLICY)
    assert first is not None and first.decider.uniform
    assert server.entry("e", "v", POLICY) is first  # the same objects: no rebuild
    with_model = server.entry("e", "v", POLICY, MODEL)
    assert with_model is not None and with_model.decider.version == MODEL["version"]
    broken = {**MODEL, "version": "0" * 16}  # content and version disagree
    kept = server.entry("e", "v", POLICY, broken)
    assert kept is not None and kept.decider.version == MODEL["version"] and server.failures == {"model": 1}
    # a fresh variant whose first model is broken explores uniformly
    fresh = server.entry("e", "w", POLICY, broken)
    assert fresh is not None and fresh.decider.uniform and server.failures == {"model": 2}
    assert server.entry("e", "x", {"kind": "slo_router"}) is None and server.failures["policy"] == 1


def test_a_refreshed_configs_copy_of_the_policy_keeps_the_previous_model_when_the_new_one_is_broken() -> None:
    server = PolicyServer()
    assert server.entry("e", "v", POLICY, MODEL) is not None
    copy = json.loads(json.dumps(POLICY))  # a config refresh hands equal policies as new objects
    kept = server.entry("e", "v", copy, {**MODEL, "version": "0" * 16})
    assert kept is not None and kept.decider.version == MODEL["version"] and server.failures == {"model": 1}
    assert server.entry("e", "v", copy, kept.model_src) is kept  # cached under the new objects
    other = server.entry("e", "v", {**copy, "explore": 0.1}, {**MODEL, "version": "0" * 16})
    assert other is not None and other.decider.uniform  # another policy: the old model is not its own
    assert other.policy.explore == 0.1 and server.failures == {"model": 2}


def test_a_decision_is_deterministic_and_annotates_only_its_variant() -> None:
    server = PolicyServer()
    counted = []

    def count() -> int:
        counted.append(1)
        return 900

    served = server.decide("e", "v", POLICY, draw_key="t1", model=MODEL, prompt_tokens=count, attributes={"plan": "pro"})
    assert served is not None and counted == [1]
    again = Decider(ROUTER, fit_after_exploring(ROUTER), salt="e:v").decide({"prompt_tokens": 900, "attr.plan": "pro"}, "t1")
    assert served.decision == again
    ev = {"type": "inference", "experiment": "e", "variant": "v", "measures": {"x": 1.0}}
    other = {"type": "inference", "experiment": "e", "variant": "control"}
    exposure = {"type": "exposure", "experiment": "e", "variant": "v"}
    for event in (ev, other, exposure):
        served.annotate(event)
    assert ev["arm"] == again.arm and ev["propensity"] == again.propensity and ev["policy_version"] == again.model_version
    assert ev["measures"] == {"x": 1.0, PROMPT_MEASURE: 900} and ev["dims"] == {"plan": "pro"}
    assert "arm" not in other and exposure["arm"] == again.arm and "measures" not in exposure


def test_features_of_reads_only_what_the_policy_needs() -> None:
    def boom() -> int:
        raise AssertionError("prompt tokens counted although no feature reads them")

    assert features_of(("max_tokens", "attr.plan"), prompt_tokens=boom, max_tokens=64, attributes={"plan": "pro"}) == \
        {"max_tokens": 64, "attr.plan": "pro"}
    assert features_of(("max_tokens", "attr.plan"), prompt_tokens=boom, max_tokens="64", attributes={"plan": ""}) == \
        {"max_tokens": None, "attr.plan": None}
