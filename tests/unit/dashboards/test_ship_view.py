"""The results page's ship panel (issue 33 item 5): which variants are ready, what the
confirmation says, the banner once shipped (user text escaped), and the click flow (Ship →
confirm → the API's ship; cancel ships nothing; viewers get no button), run by Streamlit's
AppTest against a stand-in for the API client that records what it was asked."""

from __future__ import annotations

from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from ablab.dashboards.views.ship import confirm_text, shippable, shipped_text, window_text
from ablab.platform.analytics.schemas import Results

RESULT: dict[str, Any] = {
    "experiment": "x", "control": "a", "unit": "user", "alpha": 0.05,
    "decisions": [
        {"variant": "b", "decision": "ship", "reasons": ["e2e_ms better than control: -20% (p_adj = 1e-06)", "all guardrails pass"]},
        {"variant": "c", "decision": "keep_running", "reasons": ["e2e_ms: no significant difference yet"]},
    ],
}
EXP: dict[str, Any] = {"key": "x", "phase": 1, "forced": {"qa": "a"}, "control": "a",
                       "variants": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}
SHIPPED = {"variant": "b", "phase": 2, "previous_phase": 1, "actor": "alice", "at": "2026-12-06T05:00:00Z",
           "forced": False, "reason": "", "decision": "ship", "reasons": []}


@pytest.mark.parametrize("result", [RESULT, Results.model_validate(RESULT).model_dump(mode="json")], ids=["json", "checked"])
def test_only_a_ship_decision_is_ready(result: Any) -> None:
    assert shippable(result) == ["b"]
    assert shippable({"decisions": []}) == []


def test_the_confirmation_says_what_changes_what_stays_and_why() -> None:
    text = confirm_text(EXP, "b", RESULT["decisions"][0], force=False, reason="")
    assert "phase 2" in text and "forced test units are cleared" in text
    assert "Targeting, the layer range and the holdout stay" in text
    assert "🟢 ship" in text and "all guardrails pass" in text and "Forced" not in text
    forced = confirm_text(EXP, "c", RESULT["decisions"][1], force=True, reason="launch *deadline*")
    assert "🟡 keep running" in forced and "**Forced**" in forced and "launch \\*deadline\\*" in forced


def test_the_banner_names_the_ship_and_escapes_user_text() -> None:
    assert shipped_text(SHIPPED).startswith("**Shipped b**: it has all of this experiment's traffic since phase 2")
    forced = shipped_text({**SHIPPED, "variant": "[x](http://e.example)", "forced": True, "decision": "no_ship",
                           "reason": "<b>now</b>"})
    assert "](" not in forced and "<b>" not in forced and "**forced**" in forced


def test_after_a_ship_the_panel_reads_the_results_window() -> None:
    window = {"start": "2026-12-01T00:00:00+00:00", "end": "2026-12-06T05:00:00+00:00",
              "shipped": {"variant": "b", "at": "2026-12-06T05:00:00+00:00", "phase": 2}}
    result = Results.model_validate({**RESULT, "window": window}).model_dump(mode="json")
    text = window_text(SHIPPED, result)
    assert "comparison before the ship: events from 2026-12-01 00:00:00 UTC until 2026-12-06 05:00:00 UTC" in text
    assert "the phases before phase 2" in text and "every unit on b, is not in them" in text
    assert "audit log (action ship)" in text
    escaped = window_text({**SHIPPED, "variant": "[x](http://e.example)"}, RESULT)  # results read before the ship
    assert "left out" in escaped and "](" not in escaped


class Client:
    """The API client's two ship calls, answered from memory; records the ships asked for."""

    def __init__(self) -> None:
        self.shipped: dict[str, Any] | None = None
        self.calls: list[tuple[str, str, bool, str]] = []

    def ship_status(self, key: str) -> dict[str, Any] | None:
        return self.shipped

    def ship(self, key: str, variant: str, *, force: bool = False, reason: str = "") -> dict[str, Any]:
        self.calls.append((key, variant, force, reason))
        self.shipped = {**SHIPPED, "variant": variant, "forced": force, "reason": reason}
        return {"ship": self.shipped, "replayed": False}


def _panel(client, exp, result, scope):  # unannotated: AppTest runs its source alone, where no name resolves
    from ablab.dashboards.views import ship
    from ablab.dashboards.views.common import Context

    ship.render(Context(client=client, user="alice", scope=scope), exp, result)


def _app(client: Client, scope: str = "editor") -> AppTest:
    return AppTest.from_function(_panel, args=(client, EXP, RESULT, scope), default_timeout=30).run()


def _button(at: AppTest, label: str) -> Any:
    return next(b for b in at.button if b.label == label)


def test_ship_asks_for_confirmation_then_ships() -> None:
    client = Client()
    at = _app(client)
    assert not at.exception and "Ready to ship:" in at.markdown[0].value
    _button(at, "🚀 Ship b").click().run()
    assert client.calls == [] and "Ship **b**" in at.warning[0].value  # nothing shipped before the confirmation
    _button(at, "Cancel").click().run()
    assert client.calls == [] and not at.warning
    _button(at, "🚀 Ship b").click().run()
    _button(at, "Confirm: ship b").click().run()
    assert client.calls == [("x", "b", False, "")]
    assert at.success and at.success[0].value.startswith("**Shipped b**")
    assert any("traffic since it, every unit on b, is left out" in c.value for c in at.caption)
    assert not [b for b in at.button if b.label.startswith("🚀")]  # shipped: no button any more


def test_a_forced_ship_needs_a_reason() -> None:
    client = Client()
    at = _app(client)
    assert _button(at, "Ship anyway…").disabled
    at.selectbox(key="ship_force_variant").select("c").run()
    at.text_input(key="ship_force_reason").input("launch deadline").run()
    _button(at, "Ship anyway…").click().run()
    assert "**Forced**" in at.warning[0].value
    _button(at, "Confirm: ship c").click().run()
    assert client.calls == [("x", "c", True, "launch deadline")] and "**forced**" in at.success[0].value


def test_viewers_see_the_decision_but_no_button() -> None:
    at = _app(Client(), scope="viewer")
    assert not at.exception and "Ready to ship:" in at.markdown[0].value
    assert not at.button and "An editor can ship it" in at.caption[0].value
