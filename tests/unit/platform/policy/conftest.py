"""A simulated environment and a router fitted on its uniform logs, shared by the policy tests."""

from __future__ import annotations

import pytest

from ablab.platform.policy.model import PolicyModel
from ablab.platform.policy.simulate import Environment, fit_after_exploring, router_policy
from ablab.platform.policy.spec import SloRouter


@pytest.fixture(scope="package")
def env() -> Environment:
    return Environment()


@pytest.fixture(scope="package")
def router() -> SloRouter:
    return router_policy()


@pytest.fixture(scope="package")
def model(router: SloRouter) -> PolicyModel:
    return fit_after_exploring(router)
