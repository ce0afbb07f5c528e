"""Deleting a declared factor: only one no experiment sets, whatever that experiment's
status; audited like every other registry write; the name free to declare again."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict, NotFound
from ablab.platform.registry import service as registry
from ablab.platform.registry.factors import service as factors
from ablab.platform.registry.factors.schemas import FactorCreate
from ablab.platform.registry.schemas import ExperimentCreate

UnitOfWork = Callable[[], AbstractContextManager[Session]]
ENGINE = {"name": "engine", "type": "enum", "values": ["vllm", "sglang"], "default": "vllm"}
TEMPERATURE = {"name": "params.temperature", "type": "number", "min": 0, "max": 2}


def _declare(uow: UnitOfWork, body: dict) -> None:
    with uow() as session:
        factors.declare_factor(session, data=FactorCreate.model_validate(body), actor="ed")


def _experiment(uow: UnitOfWork, key: str, treatment: dict, *then: str) -> None:
    body = {"key": key, "name": key, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": treatment}]}
    with uow() as session:
        registry.create_experiment(session, data=ExperimentCreate.model_validate(body), actor="ed", bucket_space=10_000)
    for action in then:
        with uow() as session:
            if action == "archive":
                registry.archive_experiment(session, key=key, actor="ed")
            else:
                registry.transition(session, key=key, action=action, actor="ed")


def _delete(uow: UnitOfWork, name: str) -> None:
    with uow() as session:
        factors.delete_factor(session, name=name, actor="ed")


def test_an_unused_factor_is_deleted_audited_and_can_be_declared_again(unit_of_work: UnitOfWork) -> None:
    _declare(unit_of_work, ENGINE)
    _delete(unit_of_work, "engine")
    with unit_of_work() as session:
        assert "engine" not in {f.name for f in factors.list_factors(session)}
        with pytest.raises(NotFound):
            factors.get_factor(session, "engine")
        [entry, declared] = registry.audit_log(session, key="engine", entity_type="factor")
    assert (entry.action, entry.actor, entry.after) == ("delete", "ed", None)
    assert entry.before == declared.after  # the definition that was deleted, as it was declared
    assert entry.before["values"] == ["vllm", "sglang"] and entry.before["default"] == "vllm"
    # the name is free: a different declaration under it is a new factor, not a 409
    _declare(unit_of_work, {"name": "engine", "type": "string"})
    with unit_of_work() as session:
        assert factors.get_factor(session, "engine").type == "string"


@pytest.mark.parametrize("then", [(), ("start",), ("start", "stop"), ("stop", "archive"), ("start", "stop", "archive")],
                         ids=["draft", "running", "stopped", "archived draft", "archived"])
def test_a_factor_any_experiment_sets_is_kept_with_a_409_naming_it(unit_of_work: UnitOfWork, then: tuple[str, ...]) -> None:
    _declare(unit_of_work, ENGINE)
    _declare(unit_of_work, TEMPERATURE)
    _experiment(unit_of_work, "uses-engine", {"engine": "sglang"}, *then)
    _experiment(unit_of_work, "uses-temp", {"params": {"temperature": 0.5}}, *then)
    for name, user in (("engine", "uses-engine"), ("params.temperature", "uses-temp")):
        with pytest.raises(Conflict) as refused:
            _delete(unit_of_work, name)
        assert refused.value.field == "name"
        assert f"experiment {user};" in refused.value.message and ("uses-temp" in refused.value.message) == (user == "uses-temp")
    with unit_of_work() as session:
        assert factors.get_factor(session, "engine").origin == "declared"  # still there
        assert [e.action for e in registry.audit_log(session, entity_type="factor")] == ["declare", "declare"]


def test_deleting_a_draft_that_set_it_frees_the_factor(unit_of_work: UnitOfWork) -> None:
    _declare(unit_of_work, ENGINE)
    _experiment(unit_of_work, "draft", {"engine": "sglang"})
    with pytest.raises(Conflict, match="draft"):
        _delete(unit_of_work, "engine")
    with unit_of_work() as session:
        registry.delete_experiment(session, key="draft", actor="ed")
    _delete(unit_of_work, "engine")
    with unit_of_work() as session:
        assert "engine" not in {f.name for f in factors.list_factors(session)}


def test_an_experiment_that_only_leaves_it_to_its_default_does_not_hold_it(unit_of_work: UnitOfWork) -> None:
    _declare(unit_of_work, ENGINE)
    _experiment(unit_of_work, "plain", {"cot_depth": 2}, "start")
    _delete(unit_of_work, "engine")
    with unit_of_work() as session:
        assert factors.catalog(session).get("engine") is None


@pytest.mark.parametrize(("name", "origin"), [("precision", "builtin"), ("compression.tau", "builtin"),
                                              ("backend", "gateway"), ("params", "gateway")])
def test_built_in_and_gateway_factors_cannot_be_deleted(unit_of_work: UnitOfWork, name: str, origin: str) -> None:
    with pytest.raises(Conflict) as refused:
        _delete(unit_of_work, name)
    assert f"'{name}' is a {origin} factor" in refused.value.message and "cannot be deleted" in refused.value.message
    with unit_of_work() as session:
        assert factors.get_factor(session, name).origin == origin


@pytest.mark.parametrize("name", ["nothing", "params.top_p"])
def test_an_unknown_factor_is_404(unit_of_work: UnitOfWork, name: str) -> None:
    with pytest.raises(NotFound, match="not declared"):
        _delete(unit_of_work, name)
