"""Refitting a served router from its experiment's logged events (the API refresher's pure step):
uniform exploration logs → a model whose choices are the environment's best arms; too few
requests → NotEnoughData (the caller keeps the previous model)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.model import NotEnoughData, PolicyModel
from ablab.platform.policy.refit import fit_variant
from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy
from ablab.platform.stats.spec import parse_spec


def _logs(n: int) -> tuple[pa.Table, object]:
    env = Environment()
    router = router_policy(env)
    events, spec = experiment_events(env, Decider(router, None, salt="sim:router"), np.random.default_rng(3),
                                     key="sim", n=n, n_units=n // 10)
    return pa.Table.from_pandas(pd.DataFrame(events), preserve_index=False), parse_spec(spec)


def test_the_refit_model_serves_and_round_trips() -> None:
    table, spec = _logs(12_000)
    router = router_policy()
    model = fit_variant(table, spec, "router", router)
    assert model.policy_hash == router.content_hash and model.trained_on > 5000  # the router's half of the units
    assert PolicyModel.from_json(model.to_json()).version == model.version
    # same logs, same model: every API process that refits publishes the same version
    assert fit_variant(table, spec, "router", router).version == model.version
    decider = Decider(router, model)
    assert decider.version == model.version and not decider.uniform
    # it learned: its exact value in the environment beats uniform exploration's, as a fit on
    # the environment's own exploration logs does
    env = Environment()
    uniform = env.value(Decider(router))
    assert env.value(decider) > uniform + 0.02
    assert env.value(Decider(router, fit_after_exploring(router))) > uniform + 0.02


def test_too_few_requests_is_not_enough_data() -> None:
    table, spec = _logs(200)
    with pytest.raises(NotEnoughData):
        fit_variant(table, spec, "router", router_policy())
