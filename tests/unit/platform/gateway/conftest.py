"""Fixtures of the gateway's unit tests; the harness they use is ablab_testing.gateway_harness."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ablab.platform.gateway.scripted import ScriptedBackend


@pytest.fixture(scope="module")
def backend() -> Iterator[ScriptedBackend]:
    with ScriptedBackend(tokens=9) as b:
        yield b
