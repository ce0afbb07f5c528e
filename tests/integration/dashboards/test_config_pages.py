"""AppTest against a real API server: login, list, create, edit (If-Match), lifecycle, audit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
APP = str(Path(__file__).resolve().parents[3] / "dashboards" / "app.py")


def _key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _body(key: str) -> dict:
    return {"key": key, "name": f"Experiment {key}", "owner": "qa", "unit": "user", "traffic": 0.5, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"precision": "int8"}}]}


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_login_with_a_token_finds_its_scope(dashboard_api):
    from streamlit.testing.v1 import AppTest

    seeded_api = dashboard_api
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert at.title[0].value == "ablab"
    assert not [w for w in at.text_input if w.key == "login_url"]  # the API is the configured one, not typed
    at.text_input(key="login_token").input("not-a-real-token")
    at.button(key="login_submit").click().run()
    assert "Sign-in failed" in _texts(at.error)
    assert "token" not in at.session_state
    at.text_input(key="login_token").input(seeded_api.tokens["sdk"])
    at.button(key="login_submit").click().run()
    assert "SDK token" in _texts(at.error)
    at.text_input(key="login_token").input(seeded_api.tokens["viewer"])
    at.button(key="login_submit").click().run()
    assert at.session_state["scope"] == "viewer"
    assert at.session_state["api_url"] == seeded_api.base_url
    assert at.title[0].value == "Experiments"


def test_list_filters_search_and_empty_state(seeded_api, open_app):
    at = open_app("experiments")
    frame = at.dataframe[0].value
    assert "factorial" in set(frame["Key"])
    row = frame[frame["Key"] == "factorial"].iloc[0]
    assert row["Status"] == "🟢 running" and row["Owner"] == "ml-platform" and row["Traffic"] == "100%"
    assert row["Started"] != "—"
    at.selectbox(key="list_status").select("draft").run()
    assert "factorial" not in set(at.dataframe[0].value["Key"]) if at.dataframe else True
    at.selectbox(key="list_status").select("any")
    at.text_input(key="list_q").input("no-such-experiment-anywhere").run()
    assert not at.dataframe
    assert "No experiment matches" in _texts(at.info)


def test_viewer_sees_no_edit_buttons(open_app):
    at = open_app("experiments", scope="viewer")
    labels = {b.label for b in at.button}
    assert "➕ New experiment" not in labels and "New experiment" not in labels
    at = open_app("edit", scope="viewer", exp="factorial")
    labels = {b.label for b in at.button}
    assert not labels & {"Save changes", "▶️ Start", "▶️ Resume", "⏸️ Pause", "⏹️ Stop", "📈 Ramp"}
    assert "Read-only" in _texts(at.info)
    at = open_app("new", scope="viewer")
    assert "read-only" in _texts(at.warning)
    assert not [b for b in at.button if b.label == "Create experiment"]


def test_create_through_the_form_with_field_errors(seeded_api, open_app):
    key = _key("form")
    at = open_app("new")
    at.text_input(key="new_key").input("Not A Key")
    at.text_input(key="new_name").input("Compression on half the traffic")
    at.button(key="new_submit").click().run()
    assert at.session_state["new_errors"].get("key")
    assert "pattern" in _texts(at.error)  # shown under the key field
    with seeded_api.client("admin") as api:
        assert api.get("/v1/experiments", params={"q": "Not A Key"}).json()["total"] == 0

    at.text_input(key="new_key").input(key)
    at.slider(key="new_traffic").set_value(40)
    at.text_input(key="new_v1_key").input("compressed")
    at.slider(key="new_v0_weight").set_value(30)
    at.selectbox(key="new_v1_compression.method").select("entropy")
    at.number_input(key="new_v1_kv_shards").set_value(4)
    at.number_input(key="new_ng").set_value(1).run()
    at.selectbox(key="new_g0_metric").select("ttft_ms_p95")
    at.number_input(key="new_g0_max").set_value(800.0)
    at.number_input(key="new_slo_ttft_ms").set_value(500.0)
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    assert at.query_params["page"] == ["edit"] or at.query_params["page"] == "edit"

    with seeded_api.client("admin") as api:
        exp = api.get(f"/v1/experiments/{key}").json()
    assert exp["status"] == "draft" and exp["traffic"] == pytest.approx(0.4)
    weights = {v["key"]: v["weight"] for v in exp["variants"]}
    assert weights == {"control": 30.0, "compressed": 70.0}  # the last variant took the rest: 100 % in all
    compressed = next(v for v in exp["variants"] if v["key"] == "compressed")
    assert compressed["strategy"]["compression"]["method"] == "entropy" and compressed["strategy"]["kv_shards"] == 4
    assert exp["guardrails"][0]["metric"] == "ttft_ms_p95" and exp["guardrails"][0]["max"] == 800
    assert exp["metrics"]["slos"] == {"ttft_ms": 500.0}


def test_weight_sliders_never_exceed_100(open_app):
    at = open_app("new")
    at.number_input(key="new_nvar").set_value(3).run()
    at.slider(key="new_v0_weight").set_value(90).run()
    second = at.slider(key="new_v1_weight")
    assert second.max == 9  # leaves 1 % for the third
    at.slider(key="new_v1_weight").set_value(9).run()
    assert any("1%" in str(m.value) for m in at.metric)


def test_edit_refuses_a_stale_version(seeded_api, open_app):
    key = _key("stale")
    with seeded_api.client("admin") as api:
        api.post("/v1/experiments", json=_body(key)).raise_for_status()
    at = open_app("edit", exp=key)
    version = at.session_state[f"loaded_{key}"]["version"]
    at.text_input(key=f"edit_{key}_{version}_name").input("My rename").run()
    with seeded_api.client("editor") as other:  # someone else saves first
        current = other.get(f"/v1/experiments/{key}")
        other.patch(f"/v1/experiments/{key}", json={"name": "Their rename"},
                    headers={"If-Match": current.headers["ETag"]}).raise_for_status()
    at.button(key="edit_save").click().run()
    assert "Someone else changed this experiment" in _texts(at.error)
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["name"] == "Their rename"
    at.button(key="edit_reload").click().run()
    version = at.session_state[f"loaded_{key}"]["version"]
    at.text_input(key=f"edit_{key}_{version}_name").input("Agreed name").run()
    at.button(key="edit_save").click().run()
    assert "Saved." in _texts(at.success)
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["name"] == "Agreed name"


def test_lifecycle_needs_confirmation_and_audit_shows_it(seeded_api, open_app):
    key = _key("life")
    with seeded_api.client("admin") as api:
        api.post("/v1/experiments", json=_body(key)).raise_for_status()
    at = open_app("edit", exp=key)
    at.button(key="lc_start").click().run()
    assert "Start" in _texts(at.warning)
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["status"] == "draft"  # nothing until confirmed
    at.button(key="lc_confirm").click().run()
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["status"] == "running"
    at.button(key="lc_ramp").click().run()
    at.slider(key="ramp_to").set_value(80).run()
    at.button(key="lc_confirm").click().run()
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["traffic"] == pytest.approx(0.8)
    at.button(key="lc_pause").click().run()
    at.button(key="lc_cancel").click().run()
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").json()["status"] == "running"  # cancelled
    audit = at.dataframe[-1].value
    assert {"create", "start"} <= set(audit["What"])
