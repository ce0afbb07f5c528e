"""Deleting a layer or a holdout: only one no experiment names, whatever that experiment's
status; audited, the registry revision bumped (the SDK config changes), the key reusable."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict, NotFound
from ablab.platform.registry import service as registry
from ablab.platform.registry.schemas import ExperimentCreate, HoldoutCreate, LayerCreate

UnitOfWork = Callable[[], AbstractContextManager[Session]]
SPACE = 10_000


def _experiment(uow: UnitOfWork, key: str, *then: str, **placement: object) -> None:
    body = {"key": key, "name": key, "traffic": 1.0, "control": "a", **placement,
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
    with uow() as session:
        registry.create_experiment(session, data=ExperimentCreate.model_validate(body), actor="ed", bucket_space=SPACE)
    for action in then:
        with uow() as session:
            if action == "archive":
                registry.archive_experiment(session, key=key, actor="ed")
            else:
                registry.transition(session, key=key, action=action, actor="ed")


def test_an_empty_layer_is_deleted_audited_out_of_the_sdk_config_and_its_key_reusable(unit_of_work: UnitOfWork) -> None:
    with unit_of_work() as session:
        registry.create_layer(session, data=LayerCreate(key="ranking", name="Ranking"), actor="ed")
        registry.create_layer(session, data=LayerCreate(key="other"), actor="ed")
        revision = registry.registry_revision(session)
    with unit_of_work() as session:
        registry.delete_layer(session, key="ranking", actor="ed")
    with unit_of_work() as session:
        assert [layer.key for layer in registry.list_layers(session)] == ["other"]
        config = registry.sdk_config(session, bucket_space=SPACE)
        [entry, created] = registry.audit_log(session, key="ranking", entity_type="layer")
    assert [layer["key"] for layer in config["layers"]] == ["other"]
    assert config["revision"] == revision + 1  # caches and SDK ETags see the change
    assert (entry.action, entry.before, entry.after) == ("delete", {"key": "ranking", "name": "Ranking"}, None)
    assert created.action == "create"
    with unit_of_work() as session:
        registry.create_layer(session, data=LayerCreate(key="ranking"), actor="ed")
    _experiment(unit_of_work, "fresh", layer="ranking")  # the new layer is usable


@pytest.mark.parametrize("then", [(), ("start",), ("start", "stop"), ("start", "stop", "archive"), ("stop", "archive")],
                         ids=["draft", "running", "stopped", "archived", "archived draft"])
def test_a_layer_any_experiment_is_in_is_kept_with_a_409_naming_it(unit_of_work: UnitOfWork, then: tuple[str, ...]) -> None:
    with unit_of_work() as session:
        registry.create_layer(session, data=LayerCreate(key="ranking"), actor="ed")
    _experiment(unit_of_work, "in-layer", *then, layer="ranking")
    _experiment(unit_of_work, "elsewhere")
    with pytest.raises(Conflict) as refused:
        with unit_of_work() as session:
            registry.delete_layer(session, key="ranking", actor="ed")
    assert refused.value.field == "key"
    assert "experiment in-layer;" in refused.value.message and "elsewhere" not in refused.value.message
    with unit_of_work() as session:
        assert [layer.key for layer in registry.list_layers(session)] == ["ranking"]
        assert registry.to_read(registry.get_experiment(session, "in-layer")).layer == "ranking"


def test_deleting_the_drafts_in_a_layer_frees_it(unit_of_work: UnitOfWork) -> None:
    with unit_of_work() as session:
        registry.create_layer(session, data=LayerCreate(key="ranking"), actor="ed")
    _experiment(unit_of_work, "d1", layer="ranking", layer_share=0.5)
    _experiment(unit_of_work, "d2", layer="ranking", layer_share=0.5)
    with pytest.raises(Conflict, match="experiments d1, d2;"):
        with unit_of_work() as session:
            registry.delete_layer(session, key="ranking", actor="ed")
    with unit_of_work() as session:
        registry.delete_experiment(session, key="d1", actor="ed")
        registry.delete_experiment(session, key="d2", actor="ed")
    with unit_of_work() as session:
        registry.delete_layer(session, key="ranking", actor="ed")
        assert registry.list_layers(session) == []


def test_holdouts_follow_the_same_rule(unit_of_work: UnitOfWork) -> None:
    with unit_of_work() as session:
        registry.create_holdout(session, data=HoldoutCreate(key="global", fraction=0.05), actor="ed")
        registry.create_holdout(session, data=HoldoutCreate(key="spare", fraction=0.1), actor="ed")
    _experiment(unit_of_work, "held", "start", "stop", holdout="global")
    with pytest.raises(Conflict, match="holdout 'global' is used by experiment held;"):
        with unit_of_work() as session:
            registry.delete_holdout(session, key="global", actor="ed")
    with unit_of_work() as session:
        registry.delete_holdout(session, key="spare", actor="ed")
    with unit_of_work() as session:
        assert [h.key for h in registry.list_holdouts(session)] == ["global"]
        assert [h["key"] for h in registry.sdk_config(session, bucket_space=SPACE)["holdouts"]] == ["global"]
        [entry, _] = registry.audit_log(session, key="spare", entity_type="holdout")
    assert (entry.action, entry.before, entry.after) == ("delete", {"key": "spare", "name": "spare", "fraction": 0.1}, None)


def test_unknown_layers_and_holdouts_are_404(unit_of_work: UnitOfWork) -> None:
    with unit_of_work() as session:
        with pytest.raises(NotFound, match="layer 'nope' does not exist"):
            registry.delete_layer(session, key="nope", actor="ed")
        with pytest.raises(NotFound, match="holdout 'nope' does not exist"):
            registry.delete_holdout(session, key="nope", actor="ed")
