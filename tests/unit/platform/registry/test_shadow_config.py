"""Shadows in the registry: an experiment's or a variant's ``shadow`` is stored, returned, audited
and published in the SDK config (the gateway and the SDK assign from it); bad input is a 422
naming the field, the shadow strategy checked by the same rules as a variant's."""

from __future__ import annotations

from typing import Any

import pytest

from ablab.platform.assignment import assign
from ablab.platform.assignment.payload import config_from_payload
from ablab.platform.strategy import content_hash

SHADOW = {"strategy": {"system_prompt": "Be terse.", "params": {"temperature": 0.0}}, "fraction": 0.25,
          "max_concurrency": 4, "timeout_s": 5}


def _body(**extra: Any) -> dict[str, Any]:
    variants = extra.pop("variants", [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"model": "m2"}}])
    return {"key": "shadowed", "name": "s", "traffic": 1, "control": "a", "variants": variants, **extra}


def test_shadows_are_stored_returned_and_published_to_the_sdk(api) -> None:
    client, auth = api
    variants = [{"key": "a", "weight": 1},
                {"key": "b", "weight": 1, "shadow": {"strategy": {"model": "candidate"}, "fraction": 1.0}}]
    r = client.post("/v1/experiments", json=_body(shadow=SHADOW, variants=variants), headers={"Authorization": auth["editor"]})
    assert r.status_code == 201, r.text
    exp = r.json()
    assert exp["shadow"]["fraction"] == 0.25 and exp["shadow"]["max_concurrency"] == 4 and exp["shadow"]["timeout_s"] == 5
    assert exp["shadow"]["strategy"]["system_prompt"] == "Be terse." and exp["shadow"]["strategy_hash"] == content_hash(SHADOW["strategy"])
    assert exp["variants"][0]["shadow"] is None
    assert exp["variants"][1]["shadow"] | {"strategy_hash": None} == {
        "strategy": exp["variants"][1]["shadow"]["strategy"], "strategy_hash": None, "fraction": 1.0,
        "max_concurrency": 8, "timeout_s": 30.0}  # the defaults
    client.post("/v1/experiments/shadowed/start", headers={"Authorization": auth["editor"]}).raise_for_status()

    payload = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]}).json()
    [published] = payload["experiments"]
    assert published["shadow"]["fraction"] == 0.25 and "shadow" not in published["variants"][0]
    config = config_from_payload(payload)
    seen = {}
    for i in range(200):
        [a] = assign(config, f"u{i}")
        seen[a.variant] = a.shadow
    # a variant's own shadow replaces the experiment's
    assert seen["a"]["strategy"]["system_prompt"] == "Be terse." and seen["a"]["fraction"] == 0.25
    assert seen["b"]["strategy"]["model"] == "candidate" and seen["b"]["fraction"] == 1.0


def test_a_shadow_changes_without_a_new_phase_and_null_removes_it(api) -> None:
    client, auth = api
    h = {"Authorization": auth["editor"]}
    exp = client.post("/v1/experiments", json=_body(), headers=h).json()
    assert exp["shadow"] is None
    r = client.patch("/v1/experiments/shadowed", json={"shadow": SHADOW}, headers={**h, "If-Match": f'"{exp["version"]}"'})
    assert r.status_code == 200, r.text
    exp = r.json()
    assert exp["shadow"]["fraction"] == 0.25 and exp["phase"] == 1
    variants = [{"key": "a", "weight": 1, "shadow": {"strategy": {}, "fraction": 0.5}},
                {"key": "b", "weight": 1, "strategy": {"model": "m2"}}]
    r = client.patch("/v1/experiments/shadowed", json={"variants": variants}, headers={**h, "If-Match": f'"{exp["version"]}"'})
    assert r.status_code == 200, r.text
    after = r.json()
    assert after["phase"] == 1 and after["version"] > exp["version"]  # no reshuffle; the version still moves
    assert after["variants"][0]["shadow"]["fraction"] == 0.5
    r = client.patch("/v1/experiments/shadowed", json={"shadow": None}, headers={**h, "If-Match": f'"{after["version"]}"'})
    assert r.status_code == 200 and r.json()["shadow"] is None and r.json()["variants"][0]["shadow"]["fraction"] == 0.5
    audit = client.get("/v1/experiments/shadowed/audit", headers=h).json()
    assert any(e["after"] and e["after"].get("shadow") for e in (audit if isinstance(audit, list) else audit["items"]))


@pytest.mark.parametrize(("shadow", "field"), [
    ({**SHADOW, "fraction": 1.5}, "shadow.fraction"),
    ({**SHADOW, "fraction": -0.1}, "shadow.fraction"),
    ({**SHADOW, "fraction": True}, "shadow.fraction"),
    ({k: v for k, v in SHADOW.items() if k != "fraction"}, "shadow.fraction"),
    ({**SHADOW, "max_concurrency": 0}, "shadow.max_concurrency"),
    ({**SHADOW, "max_concurrency": 2.5}, "shadow.max_concurrency"),
    ({**SHADOW, "timeout_s": 0}, "shadow.timeout_s"),
    ({**SHADOW, "timeout_s": -1}, "shadow.timeout_s"),
    ({**SHADOW, "queue": 3}, "shadow.queue"),
    ({**SHADOW, "strategy": {"params": {"stream": False}}}, "shadow.strategy.params"),
    ({**SHADOW, "strategy": {"engine": "fast"}}, "shadow.strategy.engine"),  # an undeclared factor
])
def test_bad_shadows_are_422_naming_the_field(api, shadow: dict, field: str) -> None:
    client, auth = api
    r = client.post("/v1/experiments", json=_body(shadow=shadow), headers={"Authorization": auth["editor"]})
    assert r.status_code == 422, r.text
    assert r.json()["field"].startswith(field), r.json()


def test_a_variants_shadow_strategy_is_checked_against_declared_factors(api) -> None:
    client, auth = api
    h = {"Authorization": auth["editor"]}
    variants = [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "shadow": {"strategy": {"engine": "fast"}, "fraction": 0.1}}]
    r = client.post("/v1/experiments", json=_body(variants=variants), headers=h)
    assert r.status_code == 422 and r.json()["field"] == "variants.1.shadow.strategy.engine", r.text
    assert client.post("/v1/factors", json={"name": "engine", "type": "enum", "values": ["fast", "slow"]},
                       headers=h).status_code == 201
    variants[1]["shadow"]["strategy"]["engine"] = "warp"
    r = client.post("/v1/experiments", json=_body(variants=variants), headers=h)
    assert r.status_code == 422 and r.json()["field"] == "variants.1.shadow.strategy.engine", r.text
    variants[1]["shadow"]["strategy"]["engine"] = "fast"
    assert client.post("/v1/experiments", json=_body(variants=variants), headers=h).status_code == 201
    # a factor a shadow sets is in use: it cannot be deleted
    r = client.delete("/v1/factors/engine", headers=h)
    assert r.status_code == 409 and "shadowed" in r.json()["detail"], r.text
