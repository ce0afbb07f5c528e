"""Shipping a variant (issue 33 item 5) on a real, migrated SQLite registry: the gate reads the
engine's results (its decisions), the effect is an audited new phase in which the
shipped variant takes every unit the experiment assigns, a retry is the same event, and every
refusal says why and what to do."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session

from ablab.platform.assignment import assign_batch
from ablab.platform.errors import Conflict, Invalid, NotFound, Unavailable
from ablab.platform.registry import service as registry
from ablab.platform.registry.schemas import ExperimentCreate, ExperimentRead, HoldoutCreate, LayerCreate
from ablab.platform.registry.ship import ShipRefused, ShipRequest, current_ship, ship_gate
from ablab.platform.stats.result_models import Results

UnitOfWork = Callable[[], AbstractContextManager[Session]]
SPACE = 10_000
UNITS = [f"u{i}" for i in range(2000)]


def _result(decision: str = "ship", *, variant: str = "b", reasons: list[str] | None = None,
            guardrail: str = "pass") -> Results:
    """Results as the engine builds them (only the parts the gate reads set)."""
    return Results.model_validate({
        "experiment": "x", "control": "a", "unit": "user", "alpha": 0.05, "srm": {"p_value": 0.4, "flagged": False},
        "metrics": [
            {"metric": "e2e_ms", "variant": "a", "estimate": 100.0, "n": 500, "abs_diff": None, "p_value": None},
            {"metric": "e2e_ms", "variant": variant, "estimate": 80.0, "n": 500, "abs_diff": -20.0, "rel_diff": -0.2,
             "rel_ci": [-0.25, -0.15], "p_value": 1e-6, "p_value_adjusted": 2e-6},
            {"metric": "cost_usd", "variant": variant, "estimate": 0.1, "n": 500},
        ],
        "guardrails": [{"variant": variant, "metric": "ttft_ms_p95", "kind": "sla", "status": guardrail,
                        "reason": f"ttft_ms_p95 {guardrail}"}],
        "decisions": [{"variant": variant, "decision": decision,
                       "reasons": reasons or ["e2e_ms better than control: -20% (p_adj = 2e-06)", "all guardrails pass"]}],
    })


class Reader:
    """The results reader the API passes: fixed results; counts its calls."""

    def __init__(self, document: Results) -> None:
        self.document, self.calls = document, 0

    def __call__(self, exp: ExperimentRead) -> Results:
        self.calls += 1
        return self.document


def _experiment(uow: UnitOfWork, key: str = "x", *then: str, **extra: Any) -> None:
    body = {"key": key, "name": key, "traffic": 0.5, "control": "a", "forced": {"qa-1": "a"},
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}, {"key": "c", "weight": 2}], **extra}
    with uow() as session:
        registry.create_experiment(session, data=ExperimentCreate.model_validate(body), actor="ed", bucket_space=SPACE)
    for action in then or ("start",):
        with uow() as session:
            registry.transition(session, key=key, action=action, actor="ed")


def _ship(uow: UnitOfWork, variant: str = "b", results: Callable[[ExperimentRead], Results] | None = None,
          key: str = "x", **request: Any) -> Any:
    with uow() as session:
        return registry.ship_variant(session, key=key, request=ShipRequest(variant=variant, **request), actor="alice",
                                     results_of=results)


def _assigned(uow: UnitOfWork, key: str = "x") -> dict[str, int]:
    with uow() as session:
        config = registry.config_from_payload(registry.sdk_config(session, bucket_space=SPACE))
    counts: dict[str, int] = {}
    for found in assign_batch(config, UNITS, experiments=[key]):
        for a in found:
            counts[a.variant] = counts.get(a.variant, 0) + 1
    return counts


def test_gate_reads_the_decision_and_keeps_its_evidence() -> None:
    gate = ship_gate(_result(), "b", ["e2e_ms"])
    assert gate.passes and gate.decision == "ship" and gate.reasons[-1] == "all guardrails pass"
    assert [(r["metric"], r["variant"]) for r in gate.evidence["primary"]] == [("e2e_ms", "a"), ("e2e_ms", "b")]
    assert gate.evidence["guardrails"][0]["status"] == "pass" and gate.evidence["srm"] == {"p_value": 0.4, "flagged": False}
    assert not ship_gate(_result("keep_running"), "b", ["e2e_ms"]).passes
    missing = ship_gate(_result(), "c", ["e2e_ms"])
    assert missing.decision is None and not missing.passes


def test_a_winner_ships_as_an_audited_new_phase_that_every_unit_follows(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    before = _assigned(unit_of_work)
    assert set(before) == {"a", "b", "c"} and sum(before.values()) < len(UNITS)  # traffic 0.5
    with unit_of_work() as session:
        revision = registry.registry_revision(session)
    results = Reader(_result())
    shipped = _ship(unit_of_work, results=results)
    assert results.calls == 1 and not shipped.replayed
    exp = shipped.experiment
    assert (exp.phase, exp.traffic, exp.status.value, exp.forced) == (2, 1.0, "running", {})
    assert {v.key: v.weight for v in exp.variants} == {"a": 0.0, "b": 1.0, "c": 0.0}
    record = shipped.ship
    assert (record.variant, record.phase, record.previous_phase, record.actor, record.forced) == ("b", 2, 1, "alice", False)
    assert record.decision == "ship" and record.evidence["primary"][1]["estimate"] == 80.0

    assert _assigned(unit_of_work) == {"b": len(UNITS)}  # every unit, the forced QA unit's override gone too
    with unit_of_work() as session:
        assert registry.registry_revision(session) == revision + 1  # caches and SDK ETags see it
        [entry, *_] = registry.audit_log(session, key="x")
        assert current_ship(session, "x") == record
    assert (entry.action, entry.actor, entry.before["phase"], entry.after["phase"]) == ("ship", "alice", 1, 2)
    assert entry.before["traffic"] == 0.5 and entry.before["forced"] == {"qa-1": "a"}  # what the ship changed
    assert entry.after["ship"]["decision"] == "ship" and entry.after["ship"]["reasons"] == record.reasons


def test_a_retry_is_the_same_event(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    first = _ship(unit_of_work, results=Reader(_result()))
    results = Reader(_result("no_ship"))  # results after a ship read against the new weights; a retry never asks
    again = _ship(unit_of_work, results=results)
    assert again.replayed and again.ship == first.ship and again.experiment.phase == 2 and results.calls == 0
    with unit_of_work() as session:
        assert [e.action for e in registry.audit_log(session, key="x")].count("ship") == 1
        assert registry.sdk_config(session, bucket_space=SPACE)["revision"] == registry.registry_revision(session)


@pytest.mark.parametrize(("decision", "says"), [
    ("keep_running", "keep the experiment running until the decision is ship"),
    ("no_ship", "a guardrail is harmed or the primary metric is worse"),
])
def test_no_win_or_harm_is_refused_with_the_decision_and_what_to_do(unit_of_work: UnitOfWork, decision: str, says: str) -> None:
    _experiment(unit_of_work)
    reasons = ["guardrail breached: ttft_ms_p95 fail"] if decision == "no_ship" else ["e2e_ms: no significant difference yet"]
    with pytest.raises(ShipRefused) as refused:
        _ship(unit_of_work, results=Reader(_result(decision, reasons=reasons, guardrail="fail")))
    exc = refused.value
    assert exc.status_code == 409 and exc.field == "variant" and exc.decision == decision and exc.reasons == reasons
    assert says in exc.message and reasons[0] in exc.message and "force: true with a reason" in exc.message
    with unit_of_work() as session:
        assert registry.get_experiment(session, "x").phase == 1 and current_ship(session, "x") is None
        assert "ship" not in [e.action for e in registry.audit_log(session, key="x")]


def test_a_forced_ship_needs_a_reason_and_is_audited_as_forced(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    with pytest.raises(ValidationError, match="needs a reason"):
        ShipRequest(variant="c", force=True, reason="  ")
    shipped = _ship(unit_of_work, "c", Reader(_result("keep_running", variant="c")), force=True, reason="launch deadline")
    assert shipped.ship.forced and shipped.ship.reason == "launch deadline" and shipped.ship.decision == "keep_running"
    assert _assigned(unit_of_work) == {"c": len(UNITS)}
    with unit_of_work() as session:
        [entry, *_] = registry.audit_log(session, key="x")
    assert entry.after["ship"]["forced"] is True and entry.after["ship"]["reason"] == "launch deadline"


def test_the_control_and_a_store_less_api_need_force(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    with pytest.raises(ShipRefused, match="is the control"):
        _ship(unit_of_work, "a", Reader(_result()))
    with pytest.raises(ShipRefused, match="no analytics store") as refused:
        _ship(unit_of_work, "b", None)
    assert refused.value.field == "analytics"
    shipped = _ship(unit_of_work, "a", None, force=True, reason="roll back: the treatment leaks memory")
    assert shipped.ship.forced and shipped.ship.decision is None and _assigned(unit_of_work) == {"a": len(UNITS)}


def test_a_paused_experiment_ships_and_serves_again(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work, "x", "start", "pause")
    shipped = _ship(unit_of_work, results=Reader(_result()))
    assert shipped.experiment.status.value == "running" and _assigned(unit_of_work) == {"b": len(UNITS)}


@pytest.mark.parametrize(("then", "says"), [(("start", "stop"), "stopped, which is final"), (("stop",), "stopped"),
                                            ((), "never started")], ids=["stopped", "stopped draft", "draft"])
def test_stopped_and_draft_experiments_are_refused(unit_of_work: UnitOfWork, then: tuple[str, ...], says: str) -> None:
    body = {"key": "x", "name": "x", "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
    with unit_of_work() as session:
        registry.create_experiment(session, data=ExperimentCreate.model_validate(body), actor="ed", bucket_space=SPACE)
    for action in then:
        with unit_of_work() as session:
            registry.transition(session, key="x", action=action, actor="ed")
    with pytest.raises(Conflict, match=says) as refused:
        _ship(unit_of_work, results=Reader(_result()), force=True, reason="even forced")
    assert refused.value.field == "status"


def test_results_that_cannot_be_read_hold_a_ship_back_unless_forced(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)

    def broken(exp: ExperimentRead) -> Results:
        raise Invalid(f"experiment '{exp.key}' cannot be analyzed: metrics.primary: unknown metric", field="metrics")

    with pytest.raises(Unavailable, match="could not be read .experiment 'x' cannot be analyzed") as refused:
        _ship(unit_of_work, results=broken)
    assert refused.value.field == "results"
    shipped = _ship(unit_of_work, results=broken, force=True, reason="store down")
    assert shipped.ship.forced and shipped.ship.decision is None and "could not be read" in shipped.ship.reasons[0]


def test_paused_and_unknown_variants(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    with pytest.raises(NotFound, match="has no variant 'z'"):
        _ship(unit_of_work, "z", Reader(_result()))
    with unit_of_work() as session:
        registry.pause_variant(session, key="x", variant="b", reason="guardrail ttft", actor="guardian")
    with pytest.raises(ShipRefused, match="paused .guardrail ttft.*resume it first"):
        _ship(unit_of_work, "b", Reader(_result()), force=True, reason="anyway")


def test_layer_range_and_holdout_stay(unit_of_work: UnitOfWork) -> None:
    with unit_of_work() as session:
        registry.create_layer(session, data=LayerCreate(key="ranking"), actor="ed")
        registry.create_holdout(session, data=HoldoutCreate(key="global", fraction=0.1), actor="ed")
    _experiment(unit_of_work, "x", layer="ranking", layer_share=0.5, holdout="global")
    _experiment(unit_of_work, "y", layer="ranking")  # the rest of the layer
    neighbour = _assigned(unit_of_work, "y")
    _ship(unit_of_work, results=Reader(_result()))
    shipped = _assigned(unit_of_work, "x")
    assert set(shipped) == {"b"} and 0.4 * len(UNITS) < shipped["b"] < 0.5 * len(UNITS)  # half the layer, less the holdout
    assert _assigned(unit_of_work, "y") == neighbour  # the neighbour keeps its units
    with unit_of_work() as session:
        exp = registry.to_read(registry.get_experiment(session, "x"))
    assert exp.layer_range == (0, SPACE // 2) and exp.holdout == "global"


def test_a_later_phase_ends_the_ship(unit_of_work: UnitOfWork) -> None:
    _experiment(unit_of_work)
    _ship(unit_of_work, results=Reader(_result()))
    with unit_of_work() as session:
        registry.resume_variant(session, key="x", variant="b", actor="ed")  # nothing to resume: no change
        registry.transition(session, key="x", action="pause", actor="ed")
        assert current_ship(session, "x") is None  # paused: the ship is no longer what serves


def test_the_route_in_process(api: tuple[Any, dict[str, str]]) -> None:
    """The HTTP edges on an API without an analytics store: scopes, problems, ETags, replay."""
    client, auth = api
    editor, sdk = {"Authorization": auth["editor"]}, {"Authorization": auth["sdk"]}
    body = {"key": "x", "name": "x", "traffic": 1, "control": "a", "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
    assert client.post("/v1/experiments", json=body, headers=editor).status_code == 201
    assert client.post("/v1/experiments/x/start", headers=editor).status_code == 200
    etag = client.get("/v1/sdk/config", headers=sdk).headers["ETag"]

    assert client.post("/v1/experiments/x/ship", json={"variant": "b"}, headers=sdk).status_code == 403
    missing = client.post("/v1/experiments/nope/ship", json={"variant": "b"}, headers=editor)
    assert missing.status_code == 404 and missing.json()["field"] == "key"
    for bad, field in (({"variant": "b", "force": True}, "reason"), ({"variant": "b", "extra": 1}, "extra"), ({}, "variant")):
        r = client.post("/v1/experiments/x/ship", json=bad, headers=editor)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    refused = client.post("/v1/experiments/x/ship", json={"variant": "b"}, headers=editor)
    assert refused.status_code == 409 and refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["field"] == "analytics" and "force: true" in refused.json()["detail"]
    assert client.get("/v1/experiments/x/ship", headers=editor).json() == {"experiment": "x", "shipped": None}

    forced = client.post("/v1/experiments/x/ship", json={"variant": "b", "force": True, "reason": "store down"}, headers=editor)
    assert forced.status_code == 200 and forced.headers["ETag"] == f'"{forced.json()["experiment"]["version"]}"'
    assert forced.json()["ship"]["forced"] and client.get("/v1/sdk/config", headers=sdk).headers["ETag"] != etag
    again = client.post("/v1/experiments/x/ship", json={"variant": "b"}, headers=editor)  # a retry needs no results
    assert again.status_code == 200 and again.json()["replayed"] and again.json()["ship"] == forced.json()["ship"]
    assert client.get("/v1/experiments/x/ship", headers=editor).json()["shipped"] == forced.json()["ship"]
