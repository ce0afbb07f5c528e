"""``serve.served_strategy``: the one merge of a drawn arm with a unit's other assignments,
used by the gateway's arm plans and ``POST /v1/assign``'s ``decision.strategy``."""

from __future__ import annotations

from ablab.platform.policy.serve import served_strategy


def test_the_arm_takes_the_policys_place_and_the_first_to_set_a_factor_decides_it() -> None:
    first = {"backend": "a", "params": {"temperature": 0.1}}
    policy = {"policy": {"kind": "fixed", "arm": "x"}}
    last = {"backend": "b", "system_prompt": "late", "template": "t"}
    arm = {"system_prompt": "arm", "params": {"temperature": 0.7}}
    assert served_strategy([first, policy, last], 1, arm) == {
        "backend": "a", "params": {"temperature": 0.1}, "system_prompt": "arm", "template": "t"}
    assert served_strategy([policy, first], 0, arm) == {"system_prompt": "arm", "params": {"temperature": 0.7}, "backend": "a"}
    # a second policy strategy lends nothing (its arms are not this request's)
    assert served_strategy([policy, {"policy": {"kind": "fixed"}}], 0, {}) == {}
