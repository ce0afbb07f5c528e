"""AppTest against a real API server: the editor's custom metrics and segments are sent with
the experiment and refused with the API's own message, under the field at fault."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


def test_a_bad_segment_is_refused_under_its_field_and_nothing_is_created(seeded_api, open_app):
    key = f"seg-{uuid.uuid4().hex[:6]}"
    at = open_app("new")
    assert not at.exception, at.exception
    assert at.text_input(key="new_segments").value == ""
    at.text_input(key="new_key").input(key)
    at.text_input(key="new_name").input("Segments by domain")
    at.text_input(key="new_segments").input("dims.domain, Not A Dimension!")
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    errors = at.session_state["new_errors"]
    assert any(k == "metrics.segments" or k.startswith("metrics.segments.") for k in errors), errors
    shown = " ".join(str(e.value) for e in at.error)
    assert "segments" in shown  # under the segments field, with its path
    with seeded_api.client("admin") as api:
        assert api.get(f"/v1/experiments/{key}").status_code == 404
