"""``POST /v1/assign`` decides policy variants (issue #33, docs/policies.md "Assign API"): a
policy assignment carries ``decision: {arm, propensity, policy_version, strategy, trace_id}``
drawn exactly as the gateway and the SDK draw (same server, salt, trace id, features and
model), so all three choose the same arm; ordinary assignments are unchanged. Also: the models
the SDK config serves are the config DB's (``policy_models``), kept bounded per variant, and
``GET /v1/experiments/{key}/policy-models`` lists them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from ablab.platform.api.app import create_app
from ablab.platform.auth import create_api_key
from ablab.platform.config import Settings
from ablab.platform.gateway import protocol
from ablab.platform.gateway.app import create_app as create_gateway
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.policy.evaluate import Decider, recompute_propensity
from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import fit_after_exploring, router_policy
from ablab.platform.policy.spec import parse_policy
from ablab.platform.registry.audit import bump_revision
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.models import Experiment, PolicyModelRow
from ablab.platform.registry.schemas import Scope
from ablab.platform.registry.sdk_config import KEEP_VERSIONS, publish_model
from ablab.platform.sdk import AblabClient
from ablab_testing.gateway_harness import serve

ROUTER = router_policy()
MODEL = fit_after_exploring(ROUTER)
RULE = {"kind": "rule", "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help."}},
        "rules": [{"when": {"attr.plan": {"in": ["pro"]}, "max_tokens": {"le": 100}}, "arm": "terse"}],
        "default": "helpful", "explore": 0.2}
VARIANTS = [{"key": "plain", "weight": 1, "strategy": {"params": {"temperature": 0.2}}},
            {"key": "router", "weight": 2, "strategy": {"policy": ROUTER.model_dump(mode="json")}},
            {"key": "rule", "weight": 2, "strategy": {"policy": RULE}}]
PLANS = ("pro", "free", "team", None)


class Api:
    def __init__(self, client: TestClient, auth: dict[str, str], sessions: Any) -> None:
        self.client, self.auth, self.sessions = client, auth, sessions

    def post(self, path: str, body: dict[str, Any], scope: str = "sdk") -> httpx.Response:
        return self.client.post(path, json=body, headers={"Authorization": self.auth[scope]})

    def get(self, path: str, scope: str = "viewer", **params: Any) -> httpx.Response:
        return self.client.get(path, params=params, headers={"Authorization": self.auth[scope]})

    def publish(self, experiment: str, variant: str, model: PolicyModel) -> bool:
        with transaction(self.sessions) as session:
            exp_id = session.query(Experiment.id).filter(Experiment.key == experiment).scalar()
            new = publish_model(session, exp_id, variant, model.version, json.loads(model.to_json()))
            bump_revision(session)
        self.client.app.state.ablab.assignments.invalidate()
        return new


def _settings(home: Path) -> Settings:
    return Settings(home=home, analytics=False, guardrail_interval_s=0, kafka_bootstrap="127.0.0.1:1")


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[Api]:
    settings = _settings(tmp_path)
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as session:
        tokens = {s.value: create_api_key(session, name=s.value, scope=s)[1] for s in (Scope.editor, Scope.viewer, Scope.sdk)}
    auth = {k: f"Bearer {v}" for k, v in tokens.items()}
    with TestClient(create_app(settings)) as client:
        api = Api(client, auth, sessions)
        body = {"key": "exp", "name": "exp", "unit": "user", "traffic": 1, "control": "plain", "variants": VARIANTS}
        api.post("/v1/experiments", body, "editor").raise_for_status()
        api.post("/v1/experiments/exp/start", {}, "editor").raise_for_status()
        yield api
    engine.dispose()


def _units(api: Api, variant: str, n: int) -> list[str]:
    """``n`` units assigned ``variant``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        i += 1
        (a,) = api.post("/v1/assign", {"unit_id": f"u{i}", "experiments": ["exp"]}).json()["assignments"]
        if a["variant"] == variant:
            out.append(f"u{i}")
    return out


def test_sdk_gateway_and_assign_choose_the_same_arm(api: Api, tmp_path: Path) -> None:
    assert api.publish("exp", "router", MODEL)
    sdk = AblabClient("http://testserver", "unused", start=False,
                      http=TestClient(api.client.app, headers={"Authorization": api.auth["sdk"]}))
    assert sdk.refresh() and sdk.config.policy_models[("exp", "router")]["version"] == MODEL.version
    compared = {"router": 0, "rule": 0}
    arms: dict[str, set[str]] = {"router": set(), "rule": set()}
    with ScriptedBackend(tokens=3) as backend:
        settings = GatewaySettings(backends={"scripted": Backend("scripted", backend.url, timeout_s=5.0)},
                                   default_backend="scripted", outbox_dir=tmp_path / "outbox", variant_headers=True)
        with serve(create_gateway(settings, sdk=sdk, ship=False)) as url, httpx.Client(base_url=url, timeout=30) as gw:
            for i in range(240):
                unit, plan = f"u{i}", PLANS[i % len(PLANS)]
                prompt = "word " * (10 + 37 * (i % 23))  # prompt lengths across the model's bins
                max_tokens = (50, 200, None)[i % 3]
                body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
                if max_tokens is not None:
                    body["max_tokens"] = max_tokens
                headers = {"X-Ablab-Unit": unit, **({"X-Ablab-Attr-Plan": plan} if plan else {})}
                r = gw.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                trace = r.headers["x-ablab-trace-id"]
                variant = r.headers["x-ablab-variant"]
                if variant == "plain":
                    continue
                event = next(e for e in _outbox(tmp_path / "outbox") if e["trace_id"] == trace and e["type"] == "inference")
                attributes = {"plan": plan} if plan else None
                estimate = protocol.estimate_tokens(len(protocol.message_text(body)))
                features = {"prompt_tokens": estimate, **({"max_tokens": max_tokens} if max_tokens is not None else {})}
                (got,) = api.post("/v1/assign", {"unit_id": unit, "attributes": attributes, "features": features,
                                                 "trace_id": trace}).json()["assignments"]
                assert got["variant"] == variant
                decision = got["decision"]
                (assignment,) = sdk.assign(unit, attributes, log_exposure=False)
                served = sdk.decide(assignment, trace, prompt_tokens=estimate, max_tokens=max_tokens, attributes=attributes)
                assert served is not None
                gateway = (event["arm"], event["propensity"], event["policy_version"])
                assert (decision["arm"], decision["propensity"], decision["policy_version"]) == gateway
                assert served.choice_fields() == {"arm": gateway[0], "propensity": gateway[1], "policy_version": gateway[2]}
                assert decision["trace_id"] == trace
                policy = ROUTER if variant == "router" else parse_policy(RULE)
                assert decision["strategy"] == dict(policy.arms[decision["arm"]])  # one experiment: the arm's own
                sent = next(b for h, b in reversed(backend.requests) if h.get("x-request-id") == trace)
                assert sent["messages"][0]["content"] == decision["strategy"]["system_prompt"]
                compared[variant] += 1
                arms[variant].add(decision["arm"])
    assert compared["router"] >= 60 and compared["rule"] >= 60, compared
    assert arms["router"] == set(ROUTER.arms) and arms["rule"] == {"terse", "helpful"}
    assert decision["policy_version"] in (MODEL.version, f"rule:{parse_policy(RULE).content_hash}")


def _outbox(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(folder.glob("*.jsonl")) for line in p.read_text().splitlines() if line]


def test_a_decision_without_features_or_trace_id_reads_them_as_absent(api: Api) -> None:
    api.publish("exp", "router", MODEL)
    model = PolicyModel.from_json(MODEL.to_json())
    for unit in _units(api, "router", 20):
        (got,) = api.post("/v1/assign", {"unit_id": unit, "attributes": {"plan": "pro"}}).json()["assignments"]
        d = got["decision"]
        assert len(d["trace_id"]) == 32 and int(d["trace_id"], 16) >= 0  # a new trace id, returned to log under
        again = Decider(ROUTER, model, salt="exp:router").decide({"prompt_tokens": None, "attr.plan": "pro"}, d["trace_id"])
        assert (d["arm"], d["propensity"], d["policy_version"]) == (again.arm, again.propensity, model.version)
        assert recompute_propensity(ROUTER, model, {"attr.plan": "pro"}, d["arm"]) == d["propensity"]


def test_an_ordinary_assignment_is_unchanged_and_a_batch_decides_per_unit(api: Api) -> None:
    (plain,) = _units(api, "plain", 1)
    (got,) = api.post("/v1/assign", {"unit_id": plain, "features": {"prompt_tokens": 5}}).json()["assignments"]
    stored = next(v for v in api.get("/v1/experiments/exp").json()["variants"] if v["key"] == "plain")["strategy"]
    assert got == {"experiment": "exp", "variant": "plain", "strategy": stored}  # no decision key
    rules = _units(api, "rule", 30)
    units = [{"unit_id": u, "attributes": {"plan": "pro"}, "features": {"max_tokens": 10 * i}, "trace_id": f"t{i}"}
             for i, u in enumerate(rules)] + [{"unit_id": plain}]
    results = api.post("/v1/assign/batch", {"units": units}).json()["results"]
    assert results[-1] == [got]
    for unit, (one,) in zip(units, results[:-1]):
        (alone,) = api.post("/v1/assign", unit).json()["assignments"]
        assert one == alone and one["decision"]["trace_id"] == unit["trace_id"]
        chosen = "terse" if unit["features"]["max_tokens"] <= 100 else "helpful"
        assert one["decision"]["propensity"] == (0.8 if one["decision"]["arm"] == chosen else 0.2)
    big = api.post("/v1/assign/batch", {"units": [{"unit_id": u} for u in rules] * 10}).json()["results"]  # on a worker thread
    assert len(big) == 300 and all(r[0]["decision"]["policy_version"].startswith("rule:") for r in big)


@pytest.mark.parametrize(("features", "field"), [
    ({"prompt_tokens": -1}, "features.prompt_tokens"),
    ({"max_tokens": "12"}, "features.max_tokens"),
    ({"max_tokens": True}, "features.max_tokens"),
    ({"max_tokens": 1.5}, "features.max_tokens"),
    ({"plan": "pro"}, "features.plan"),
])
def test_bad_features_are_a_422_naming_the_field(api: Api, features: dict[str, Any], field: str) -> None:
    r = api.post("/v1/assign", {"unit_id": "u1", "features": features})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    r = api.post("/v1/assign/batch", {"units": [{"unit_id": "u1", "features": features}]})
    assert r.status_code == 422 and r.json()["field"] == f"units.0.{field}", r.text
    r = api.post("/v1/assign", {"unit_id": "u1", "trace_id": "not a trace id"})
    assert r.status_code == 422 and r.json()["field"] == "trace_id"


def test_models_are_served_from_the_db_bounded_and_listed(api: Api, tmp_path: Path) -> None:
    versions = [fit_after_exploring(ROUTER, seed=s, n=3000) for s in range(KEEP_VERSIONS + 2)]
    assert len({m.version for m in versions}) == len(versions)
    first = api.get("/v1/sdk/config", "sdk")
    for m in versions:
        assert api.publish("exp", "router", m)
    assert not api.publish("exp", "router", versions[-1])  # the served version again: nothing new
    config = api.get("/v1/sdk/config", "sdk").json()
    assert [(m["variant"], m["version"]) for m in config["policy_models"]] == [("router", versions[-1].version)]
    assert api.get("/v1/sdk/config", "sdk").headers["ETag"] != first.headers["ETag"]

    listed = api.get("/v1/experiments/exp/policy-models").json()
    assert [i["version"] for i in listed["items"]] == [m.version for m in reversed(versions)][:KEEP_VERSIONS]
    assert [i["served"] for i in listed["items"]] == [True] + [False] * (KEEP_VERSIONS - 1)
    assert all(i["model"] is None and i["created_at"] for i in listed["items"])
    with transaction(api.sessions) as session:
        assert session.query(PolicyModelRow).count() == KEEP_VERSIONS  # the oldest two are gone

    old = versions[3]
    one = api.get("/v1/experiments/exp/policy-models", version=old.version).json()["items"]
    assert [(i["version"], i["served"]) for i in one] == [(old.version, False)]
    assert PolicyModel.from_json(one[0]["model"]).version == old.version  # recomputes an old propensity
    assert api.publish("exp", "router", old)  # the logs went back: the older version is served again
    assert api.get("/v1/sdk/config", "sdk").json()["policy_models"][0]["version"] == old.version
    assert api.get("/v1/experiments/exp/policy-models").json()["items"][0] == {
        **api.get("/v1/experiments/exp/policy-models", version=old.version).json()["items"][0], "model": None}

    gone = api.get("/v1/experiments/exp/policy-models", version=versions[0].version)
    assert gone.status_code == 404 and gone.json()["field"] == "version"
    assert api.get("/v1/experiments/nope/policy-models").status_code == 404
    assert api.get("/v1/experiments/exp/policy-models", variant="rule").json()["items"] == []
    assert api.get("/v1/experiments/exp/policy-models", "sdk").status_code == 403

    # a new API process on the same database serves the same model before any refit
    with TestClient(create_app(_settings(tmp_path))) as again:
        payload = again.get("/v1/sdk/config", headers={"Authorization": api.auth["sdk"]}).json()
    assert payload["policy_models"][0]["version"] == old.version


def test_the_decision_strategy_is_merged_with_the_units_other_assignments_as_the_gateway_merges(api: Api) -> None:
    other = {"key": "other", "name": "other", "unit": "user", "traffic": 1, "control": "a",
             "variants": [{"key": k, "weight": 1, "strategy": {"system_prompt": f"Other {k}.", "params": {"temperature": 0.9}}}
                          for k in ("a", "b")]}
    api.post("/v1/experiments", other, "editor").raise_for_status()
    api.post("/v1/experiments/other/start", {}, "editor").raise_for_status()
    seen = 0
    for unit in _units(api, "rule", 10):
        found = api.post("/v1/assign", {"unit_id": unit, "attributes": {"plan": "pro"}}).json()["assignments"]
        assert [a["experiment"] for a in found] == ["exp", "other"]
        rule, plain = found
        assert "decision" not in plain
        arm = parse_policy(RULE).arms[rule["decision"]["arm"]]
        # the first assignment to set a factor decides it: the arm's prompt, the other's params
        assert rule["decision"]["strategy"] == {**plain["strategy"], **arm}
        assert rule["decision"]["strategy"]["params"] == {"temperature": 0.9}
        seen += 1
    assert seen == 10


def test_a_model_that_fails_to_load_keeps_the_previous_one_and_is_counted(api: Api) -> None:
    class Corrupt:  # a stored model whose content no longer matches its version
        version = "0123456789abcdef"

        @staticmethod
        def to_json() -> str:
            return json.dumps({**json.loads(MODEL.to_json()), "trained_on": 1})

    (unit,) = _units(api, "router", 1)

    def version() -> str:
        (a,) = api.post("/v1/assign", {"unit_id": unit, "experiments": ["exp"]}).json()["assignments"]
        return str(a["decision"]["policy_version"])

    api.publish("exp", "router", Corrupt)  # type: ignore[arg-type]
    assert version() == f"uniform:{ROUTER.content_hash}"  # none before it: uniform, and the request is served
    api.publish("exp", "router", MODEL)
    assert version() == MODEL.version
    api.publish("exp", "router", Corrupt)  # type: ignore[arg-type]
    assert api.get("/v1/sdk/config", "sdk").json()["policy_models"][0]["version"] == Corrupt.version
    assert version() == MODEL.version  # the previous model stays in force
    assert api.client.app.state.ablab_policies.failures == {"model": 2}
