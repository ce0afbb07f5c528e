"""The SDK config's ``policy_models`` (issue #33): read into ``AssignmentConfig.policy_models``
by (experiment, variant), and folded into the config's revision, so a refit model is a new
config for the gateway's plan caches even when the registry revision is the same."""

from __future__ import annotations

from typing import Any

from ablab.platform.assignment.payload import SdkConfig, config_from_payload

BASE: dict[str, Any] = {
    "revision": 7, "bucket_space": 10_000, "layers": [], "holdouts": [],
    "experiments": [{"key": "e", "salt": "s", "phase": 1, "unit": "user", "status": "running", "traffic": 1.0,
                     "control": "a", "variants": [{"key": "a", "weight": 1, "strategy": {}},
                                                  {"key": "r", "weight": 1, "strategy": {"policy": {"kind": "rule"}}}]}],
}


def _with(version: str) -> dict[str, Any]:
    return {**BASE, "policy_models": [{"experiment": "e", "variant": "r", "version": version, "model": {"v": version}}]}


def test_models_are_read_by_variant_and_move_the_revision() -> None:
    plain = config_from_payload(BASE)
    assert plain.revision == "7" and plain.policy_models == {}
    one, two = config_from_payload(_with("aaaa")), config_from_payload(_with("bbbb"))
    assert one.policy_models == {("e", "r"): {"v": "aaaa"}}
    assert one.revision.startswith("7+") and len({plain.revision, one.revision, two.revision}) == 3
    assert config_from_payload(_with("aaaa")).revision == one.revision  # the same models: the same revision
    assert SdkConfig.model_validate(_with("aaaa")).policy_models[0].version == "aaaa"  # the published shape
