"""AppTest against a real API (issue 33 item 6): a policy variant made through the experiment
editor (a refusal shown under the field the API names, then saved as typed, then edited
without losing what was not touched), and the per-arm view of a seeded experiment whose
router variant logged ``arm``, ``propensity`` and ``policy_version`` per request."""

from __future__ import annotations

import uuid

import pytest

from ablab.dashboards.format import fmt_pct, fmt_value
from ablab_testing.policy_seed import EXPERIMENT as POLICY_SEEDED

pytestmark = pytest.mark.integration

POLICY = {"kind": "slo_router",
          "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help.", "precision": "int8"}},
          "features": ["prompt_tokens", "attr.plan"], "slo": {"ttft_ms_p95": 400.0}, "objective": "accuracy",
          "explore": 0.05}


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_a_policy_variant_is_made_in_the_editor_refused_at_its_field_then_saved(seeded_api, open_app):
    key = f"pol-{uuid.uuid4().hex[:6]}"
    at = open_app("new")
    at.text_input(key="new_key").input(key)
    at.text_input(key="new_name").input("Route by prompt length")
    at.text_input(key="new_v1_key").input("router")
    at.radio(key="new_v1_mode").set_value("policy").run()
    p = "new_v1_pol"
    at.text_input(key=f"{p}_arm0_name").input("terse")
    at.text_area(key=f"{p}_arm0_system_prompt").input("Be terse.")
    at.text_input(key=f"{p}_arm1_name").input("helpful")
    at.text_area(key=f"{p}_arm1_system_prompt").input("Help.")
    at.selectbox(key=f"{p}_arm1_precision").select("int8")
    at.text_input(key=f"{p}_attrs").input("plan")
    at.selectbox(key=f"{p}_slo0_latency").select("ttft_ms")
    at.selectbox(key=f"{p}_slo0_q").select("p95")
    at.number_input(key=f"{p}_slo0_max").set_value(400.0)
    at.selectbox(key=f"{p}_objective").select("accuracy")
    at.number_input(key=f"{p}_explore").set_value(0.6)  # 0.6 × 2 arms: more than all the probability there is
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    assert set(at.session_state["new_errors"]) == {"variants.1.strategy.policy.explore"}
    assert "exceeds 1" in _texts(at.error)
    with seeded_api.client("viewer") as api:
        assert api.get(f"/v1/experiments/{key}").status_code == 404  # refused: nothing written

    at.number_input(key=f"{p}_explore").set_value(0.05)
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    with seeded_api.client("viewer") as api:
        exp = api.get(f"/v1/experiments/{key}").json()
        # the arms' pickers include the factors other tests of this shared stack declared, each at its default
        declared = {f["name"]: f.get("default") for f in api.get("/v1/factors").json()["items"] if f.get("origin") == "declared"}
    router = next(v for v in exp["variants"] if v["key"] == "router")
    assert _without_defaults(router["strategy"]["policy"], declared) == POLICY

    # the edit page opens the policy in its widgets; changing one field keeps every other
    at = open_app("edit", exp=key)
    version = at.session_state[f"loaded_{key}"]["version"]
    e = f"edit_{key}_{version}"
    assert at.radio(key=f"{e}_v1_mode").value == "policy"
    assert at.text_input(key=f"{e}_v1_pol_arm1_name").value == "helpful"
    assert at.number_input(key=f"{e}_v1_pol_slo0_max").value == 400.0
    at.checkbox(key=f"{e}_newphase").check().run()
    at.number_input(key=f"{e}_v1_pol_explore").set_value(0.1)
    at.button(key="edit_save").click().run()
    assert not at.exception, at.exception
    assert "Saved." in _texts(at.success)
    with seeded_api.client("viewer") as api:
        exp = api.get(f"/v1/experiments/{key}").json()
    router = next(v for v in exp["variants"] if v["key"] == "router")
    assert _without_defaults(router["strategy"]["policy"], declared) == {**POLICY, "explore": 0.1}


def _without_defaults(policy: dict, declared: dict) -> dict:
    """The policy with the declared factors at their defaults taken out of its arms."""
    arms = {name: {k: v for k, v in arm.items() if not (k in declared and v == declared[k])}
            for name, arm in policy["arms"].items()}
    return {**policy, "arms": arms}


def test_the_policy_variant_reads_as_its_kind_and_arms(open_app):
    at = open_app("results", scope="viewer", exp=POLICY_SEEDED, run=False)
    at.query_params["view"] = "variants"
    at.run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    strategy = table[table["Variant"] == "router"].iloc[0]["Strategy"]
    assert strategy == "policy=slo_router over fast, helpful, expert"


def test_the_results_show_the_per_arm_view_of_the_policy_variant(seeded_api, open_app):
    with seeded_api.client("viewer") as api:
        result = api.get(f"/v1/experiments/{POLICY_SEEDED}/results").json()
    router = next(p for p in result["policies"] if p["variant"] == "router")
    at = open_app("results", scope="viewer", exp=POLICY_SEEDED)
    assert not at.exception, at.exception
    assert "Policy variants: per-arm view" in [h.value for h in at.subheader]
    arms = next(d.value for d in at.dataframe if "Mean propensity" in d.value.columns)
    assert set(arms["Arm"]) == {a["arm"] for a in router["arms"]} == {"fast", "helpful", "expert"}
    for a in router["arms"]:  # the API's numbers, as the page words them
        row = arms[arms["Arm"] == a["arm"]].iloc[0]
        assert row["Share"] == fmt_pct(a["share"]) and row["Mean propensity"] == f"{a['mean_propensity']:.3f}"
    slo = next(d.value for d in at.dataframe if "Within bound" in d.value.columns)
    assert list(slo["SLO"]) == ["ttft_ms_p95"] and slo["Status"].iloc[0] in ("🟢 met", "🔴 unmet")
    assert not router["exploring"] and "exploring uniformly" not in _texts(at.info)  # logged by a fitted model

    at = open_app("results", scope="viewer", exp=POLICY_SEEDED, run=False)  # the variant's own details
    at.query_params["view"] = "variants"
    at.query_params["variant"] = "router"
    at.run()
    assert not at.exception, at.exception
    assert any("Mean propensity" in d.value.columns for d in at.dataframe)


def test_the_results_credit_the_policy_gain_to_its_arms(seeded_api, open_app):
    with seeded_api.client("viewer") as api:
        answer = api.get(f"/v1/experiments/{POLICY_SEEDED}/attribution")
    assert answer.status_code == 200, answer.text[:200]
    credit = next(c for c in answer.json()["policies"] if c["variant"] == "router")
    at = open_app("results", scope="viewer", exp=POLICY_SEEDED)
    assert not at.exception, at.exception
    contributions = next(d.value for d in at.dataframe if "Contribution" in d.value.columns)
    assert list(contributions["Arm"]) == [a["arm"] for a in credit["arms"]]
    gain = fmt_value(credit["metric"], credit["gain"]["estimate"], signed=True)
    assert f"gain over control is {gain}" in _texts(at.markdown).replace("\\", "")
