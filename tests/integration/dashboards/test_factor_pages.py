"""AppTest against a real API: declare a factor in the UI, pick it in a variant, see it validated."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_declare_a_factor_then_pick_it_in_a_variant(seeded_api, open_app):
    name = f"engine_{uuid.uuid4().hex[:6]}"
    at = open_app("new")
    at.text_input(key="factor_name").input(name)
    at.selectbox(key="factor_type").select("enum").run()
    at.text_input(key="factor_values").input("vllm, sglang")
    at.text_input(key="factor_default").input("vllm")
    at.text_input(key="factor_description").input("Serving engine")
    at.button(key="factor_submit").click().run()
    assert not at.exception, at.exception
    assert f"Declared factor `{name}`" in _texts(at.success)
    with seeded_api.client("viewer") as api:
        assert api.get(f"/v1/factors/{name}").json()["values"] == ["vllm", "sglang"]
    listed = at.dataframe[0].value
    assert name in set(listed["Factor"]) and "compression.tau" in set(listed["Factor"])

    # the new factor is offered in every variant's strategy, with its levels
    picker = at.selectbox(key=f"new_v1_{name}")
    assert list(picker.options) == ["vllm", "sglang"] and picker.value == "vllm"
    key = f"open-{uuid.uuid4().hex[:6]}"
    at.text_input(key="new_key").input(key)
    at.text_input(key="new_name").input("Engines and sampling")
    picker.select("sglang")
    at.text_input(key="new_v1_backend").input("smollm")
    at.text_area(key="new_v1_params").input('{"temperature": 0.2, "max_tokens": 64}')
    at.text_area(key="new_v1_system_prompt").input("Answer in one word.")
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    with seeded_api.client("viewer") as api:
        exp = api.get(f"/v1/experiments/{key}").json()
    strategy = exp["variants"][1]["strategy"]
    assert strategy[name] == "sglang" and strategy["backend"] == "smollm"
    assert strategy["params"] == {"temperature": 0.2, "max_tokens": 64} and strategy["system_prompt"] == "Answer in one word."
    assert "backend" not in exp["variants"][0]["strategy"]  # nothing set, nothing stored


def test_bad_params_and_incoherent_declarations_are_shown_at_the_field(open_app):
    at = open_app("new")
    at.text_input(key="factor_name").input("beam")
    at.selectbox(key="factor_type").select("integer").run()
    at.text_input(key="factor_min").input("5")
    at.text_input(key="factor_max").input("1")
    at.button(key="factor_submit").click().run()
    assert r"is above \`max\`" in _texts(at.error)  # API text is escaped, shown literally
    at.text_area(key="new_v1_params").input("{not json").run()
    assert "params:" in _texts(at.error)
    at.text_input(key="new_key").input(f"bad-{uuid.uuid4().hex[:6]}")
    at.text_input(key="new_name").input("Bad params")
    at.button(key="new_submit").click().run()
    assert at.session_state["new_errors"].get("variants.1.strategy.params")
