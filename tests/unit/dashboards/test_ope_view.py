"""The policy evaluation page (issue 33 item 6): the client's route and body, the YAML and
refusal wording, the estimates beside the logged variants, and the form flow (type → evaluate →
answer; a refusal under the widget it names, user text escaped), run by Streamlit's AppTest
against a stand-in for the API client that records what it was asked."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from ablab.dashboards.client import ApiClient, ApiError
from ablab.dashboards.format import WORD_JOINER
from ablab.dashboards.views.ope import estimates_chart, estimates_frame, estimates_table, parse_policy, refusal

EXP: dict[str, Any] = {"key": "x", "name": "Router", "control": "a", "variants": [{"key": "a"}, {"key": "b"}]}
ANSWER: dict[str, Any] = {
    "experiment": "x", "metric": "accuracy", "source": "correct",
    "candidate": {"kind": "fixed", "policy_hash": "e437abcdef0123456789", "model": "fixed"},
    "n": 4000, "units": 400, "rows_without_value": 0,
    "ips": {"estimate": 0.648, "ci": [0.561, 0.735], "se": 0.0445},
    "snips": {"estimate": 0.667, "ci": [0.626, 0.708], "se": 0.0211},
    "dr": {"estimate": 0.663, "ci": [0.623, 0.702], "se": 0.0200},
    "ess": 593.0, "mean_weight": 0.97,
    "support": {"unsupported_share": 0.2, "warning": "20.0% of the candidate's choices fall on arms the logs never tried",
                "pairs": []},
    "logged": [{"arm": "a", "n": 2022, "units": 200, "estimate": 0.662, "ci": [0.636, 0.688], "se": 0.0134},
               {"arm": "b", "n": 1978, "units": 200, "estimate": 0.601, "ci": [0.575, 0.627], "se": 0.0133}],
    "notes": ["3 policy requests without arm were left out"],
}


def _plain(markdown: str) -> str:
    """What escaped Markdown reads as (backslash escapes and word joiners gone)."""
    return re.sub(r"\\(.)", r"\1", markdown).replace(WORD_JOINER, "")


def test_the_client_posts_the_policy_to_the_quoted_route() -> None:
    seen: list[tuple[str, bytes, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path, json.loads(request.content)))
        if b"%2F" in request.url.raw_path:
            return httpx.Response(404, json={"detail": "no experiment"})
        return httpx.Response(200, json=ANSWER)

    client = ApiClient("http://api.test", "t", transport=httpx.MockTransport(handler))
    assert client.ope("x", {"kind": "fixed", "arm": "b"}) == ANSWER
    client.ope("x", {"kind": "fixed", "arm": "b"}, metric="e2e_ms")
    with pytest.raises(ApiError) as raised:
        client.ope("../keys?x=1#y", {"kind": "fixed", "arm": "b"})
    assert raised.value.status == 404
    assert seen == [("POST", b"/v1/experiments/x/ope", {"policy": {"kind": "fixed", "arm": "b"}}),
                    ("POST", b"/v1/experiments/x/ope", {"policy": {"kind": "fixed", "arm": "b"}, "metric": "e2e_ms"}),
                    ("POST", b"/v1/experiments/..%2Fkeys%3Fx%3D1%23y/ope", {"policy": {"kind": "fixed", "arm": "b"}})]


def test_the_policy_must_be_a_yaml_mapping() -> None:
    assert parse_policy("kind: fixed\narm: b\n") == ({"kind": "fixed", "arm": "b"}, None)
    assert parse_policy("{kind: rule, rules: [{when: {prompt_tokens: {gt: 800}}, arm: a}], default: b}")[0] == {
        "kind": "rule", "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "a"}], "default": "b"}
    none, why = parse_policy("kind: [fixed\n")
    assert none is None and why is not None and why.startswith("The policy is not valid YAML (line")
    assert "must be a mapping" in (parse_policy("- fixed")[1] or "")
    assert "Type a policy" in (parse_policy("  \n")[1] or "")


def test_a_refusal_goes_under_the_widget_it_names() -> None:
    widget, text = refusal(ApiError(422, "rules.1: every request it matches is taken by rules.0 first", "rules.1"))
    assert widget == "policy"
    assert _plain(text) == "**Candidate policy**, at rules.1: every request it matches is taken by rules.0 first"
    widget, text = refusal(ApiError(422, "metric: no metric '*nope*' in this experiment", "metric"))
    assert widget == "metric" and text == "**Metric**: no metric \\'\\*nope\\*\\' in this experiment"
    assert _plain(refusal(ApiError(422, "policy: Field required", "policy"))[1]) == "**Candidate policy**: Field required"


def test_estimates_sit_beside_the_logged_variants() -> None:
    from ablab.platform.api.routers.ope import OpeResult

    assert OpeResult.model_validate(ANSWER).model_dump(mode="json") == ANSWER  # the stand-in is the route's shape
    frame = estimates_frame(ANSWER)
    assert list(frame["what"]) == ["candidate · IPS", "candidate · SNIPS", "candidate · Doubly robust", "logged · a",
                                   "logged · b"]
    assert list(frame["kind"]) == ["candidate"] * 3 + ["logged"] * 2
    assert frame["lo"].iloc[2] == 0.623 and frame["hi"].iloc[4] == 0.627
    table = estimates_table(ANSWER)
    assert list(table.columns) == ["Estimate of", "Accuracy", "95% CI", "Requests"]
    assert table["Accuracy"].iloc[0] == "64.8%" and table["95% CI"].iloc[3] == "[63.6%, 68.8%]"
    spec = estimates_chart(ANSWER).to_dict()
    assert "with 95% CI" in json.dumps(spec["title"]) and len(spec["layer"]) == 2
    missing = estimates_frame({**ANSWER, "ips": {"estimate": None, "ci": [None, None], "se": None}, "logged": []})
    assert len(estimates_chart({**ANSWER, "logged": []}).to_dict()["layer"]) == 2 and missing["estimate"].isna().sum() == 1


class Client:
    """The two calls the page makes, answered from memory; records the evaluations asked for."""

    def __init__(self, refuse: ApiError | None = None) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []

    def get_experiment(self, key: str) -> dict[str, Any]:
        return EXP

    def ope(self, key: str, policy: dict[str, Any], metric: str | None = None) -> dict[str, Any]:
        self.calls.append((key, policy, metric))
        if self.refuse is not None:
            raise self.refuse
        return ANSWER


def _page(client, key):  # unannotated: AppTest runs its source alone, where no name resolves
    from ablab.dashboards.views import ope
    from ablab.dashboards.views.common import Context

    ope.render(Context(client=client, user="alice", scope="viewer"), key)


def _app(client: Client, key: str | None = "x") -> AppTest:
    return AppTest.from_function(_page, args=(client, key), default_timeout=30).run()


def test_evaluate_shows_the_estimates_and_the_warning() -> None:
    client = Client()
    at = _app(client)
    assert not at.exception and at.text_area[0].value == "kind: fixed\narm: a\n" and client.calls == []
    at.text_area[0].input("kind: fixed\narm: b\n")
    at.button[1].click().run()  # the form's Evaluate (the first button opens the results)
    assert not at.exception
    assert client.calls == [("x", {"kind": "fixed", "arm": "b"}, None)]
    assert [m.label for m in at.metric] == ["IPS", "SNIPS", "Doubly robust", "Effective sample size"]
    assert at.metric[2].value == "66.3%" and at.metric[3].value == "593"
    assert "never tried" in at.warning[0].value
    assert any("left out" in c.value for c in at.caption)
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 5
    at.run()  # a rerun keeps the answer without asking again
    assert len(client.calls) == 1 and len(at.metric) == 4


def test_a_refusal_is_shown_under_the_policy_escaped() -> None:
    client = Client(ApiError(422, "arm: no logged action named '[x](http://e.example)'", "arm"))
    at = _app(client)
    at.text_area[0].input("kind: fixed\narm: '[x](http://e.example)'\n")
    at.button[1].click().run()
    assert not at.exception and not at.metric
    assert len(at.error) == 1 and _plain(at.error[0].value).startswith("**Candidate policy**, at arm: no logged action")
    assert "](" not in at.error[0].value
    assert at.text_area[0].value == "kind: fixed\narm: '[x](http://e.example)'\n"  # what was typed stays


def test_a_metric_refusal_and_bad_yaml_are_shown_in_the_form() -> None:
    client = Client(ApiError(422, "metric: unknown metric", "metric"))
    at = _app(client)
    at.text_input[0].input("nope")
    at.button[1].click().run()
    assert client.calls == [("x", {"kind": "fixed", "arm": "a"}, "nope")]
    assert _plain(at.error[0].value).startswith("**Metric**: unknown metric")
    at.text_area[0].input("kind: [fixed\n")
    at.button[1].click().run()
    assert len(client.calls) == 1  # not sent
    assert "not valid YAML" in at.error[0].value


def test_without_an_experiment_the_page_says_how_to_pick_one() -> None:
    at = _app(Client(), key=None)
    assert not at.exception and "Pick an experiment" in at.info[0].value and not at.text_area


def test_the_app_routes_a_deep_link_to_the_page() -> None:
    """``?page=ope&exp=KEY`` opens the page for a signed-in session, and the sidebar offers it."""
    from pathlib import Path

    from ablab.platform.config import get_settings

    api_url = get_settings().api_url

    class Signed(Client):
        base_url = api_url.rstrip("/")

        def check(self) -> None:  # the token still counts
            return None

    at = AppTest.from_file(str(Path(__file__).parents[3] / "dashboards" / "app.py"), default_timeout=30)
    at.session_state["token"] = "t"
    at.session_state["api_url"] = api_url
    at.session_state["_client"] = Signed()
    at.session_state["_cookie_read"] = True  # no cookie to read: the session is the state above
    at.query_params["page"] = "ope"
    at.query_params["exp"] = "x"
    at.run()
    assert not at.exception and [t.value for t in at.title] == ["Policy evaluation"]
    assert "Policy evaluation" in [b.label for b in at.sidebar.button] and at.text_area[0].value == "kind: fixed\narm: a\n"
