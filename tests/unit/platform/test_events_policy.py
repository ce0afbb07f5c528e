"""Exposure and inference events carry a policy's choice (issue #33): ``arm``, ``propensity`` in
(0, 1] and ``policy_version``, optional, each checked; the loader stores the event's JSON as
``payload``, where the store's OPE reading (``LOGGED_EVENTS_SQL``) finds them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ablab.platform.events import ExposureEvent, InferenceEvent, derive_event_id

BASE: dict[str, Any] = {"type": "exposure", "ts": "2026-01-01T00:00:00Z", "trace_id": "t1", "experiment": "e",
                        "variant": "router", "unit_id": "u1"}
INFERENCE: dict[str, Any] = {**BASE, "type": "inference", "ttft_ms": 10.0, "e2e_ms": 20.0, "prompt_tokens": 5,
                             "output_tokens": 3, "device_s": 0.0, "cost_usd": 0.0, "price_version": "p1", "strategy": "s"}
CHOICE = {"arm": "terse", "propensity": 0.05, "policy_version": "uniform:0123456789abcdef"}


@pytest.mark.parametrize("model", [ExposureEvent, InferenceEvent])
def test_the_choice_is_accepted_and_optional(model: Any) -> None:
    base = BASE if model is ExposureEvent else INFERENCE
    ev = model.model_validate({**base, **CHOICE})
    assert (ev.arm, ev.propensity, ev.policy_version) == ("terse", 0.05, "uniform:0123456789abcdef")
    plain = model.model_validate(base)
    assert plain.arm is None and plain.propensity is None
    assert model.model_validate({**base, "propensity": 1}).propensity == 1.0  # a fixed variant's whole share


@pytest.mark.parametrize(("field", "value"), [("propensity", 0.0), ("propensity", 1.01), ("propensity", -0.1),
                                              ("arm", "Terse"), ("arm", ""), ("policy_version", "has space")])
def test_a_bad_choice_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        ExposureEvent.model_validate({**BASE, field: value})
    assert exc.value.errors()[0]["loc"][0] == field


def test_an_exposure_without_the_choice_keeps_its_derived_id() -> None:
    # null fields are dropped from the content hash, so old producers' ids do not move
    assert ExposureEvent.model_validate(BASE).event_id == derive_event_id(BASE)
