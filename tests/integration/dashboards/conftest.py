"""One real API process over a real SQL database and an embedded ClickHouse store that
was seeded with synthetic events before the API took ownership of it (chDB allows one
owning process per data directory, so seeding runs in its own process first)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ablab_testing import ApiServer, closed_port, start_api, stop_api

APP = Path(__file__).resolve().parents[3] / "dashboards" / "app.py"
SEEDED = "factorial"


@pytest.fixture(scope="session")
def seeded_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    from ablab_testing import policy_seed
    from ablab_testing.dashboard_seed import SEGMENTED_METRICS, experiment_body, seed_in_child
    from ablab_testing.policy_seed import EXPERIMENT as POLICY_SEEDED

    home = tmp_path_factory.mktemp("dash-home")
    # results count the events after the experiment's start (earlier ones are its pre-period),
    # and the start comes after seeding: the seeded traffic begins ahead of it
    # with a task domain per unit and a tool-call measure: segments and custom metrics to show
    counts = seed_in_child(home=home, experiment=SEEDED, requests=12000, units=2000, begin_in_s=600, segments=True)
    assert counts["raw_events"] > 8000 and counts["window_rows"] > 0
    routed = policy_seed.seed_in_child(home=home, experiment=POLICY_SEEDED, begin_in_s=600)
    assert routed["raw_events"] == 8000  # 4,000 requests, each an inference and a label
    # a llama.cpp backend that does not answer: the results page's waiting state names it
    backends = {"smollm2": {"url": f"http://127.0.0.1:{closed_port()}/v1", "kind": "llamacpp"}}
    server = start_api(f"sqlite:///{home / 'ablab.db'}", home,
                       {"ABLAB_ANALYTICS": "true", "ABLAB_RUN_LOADER": "false", "ABLAB_GUARDRAIL_INTERVAL_S": "0",
                        "ABLAB_GATEWAY_BACKENDS": json.dumps(backends)})
    try:
        with server.client("admin") as admin:
            metrics = {"primary": ["e2e_ms"], "slos": {"ttft_ms": 400}, **SEGMENTED_METRICS}
            admin.post("/v1/experiments", json=experiment_body(SEEDED, metrics=metrics)).raise_for_status()
            admin.post(f"/v1/experiments/{SEEDED}/start").raise_for_status()
            admin.post("/v1/experiments", json=routed["body"]).raise_for_status()
            admin.post(f"/v1/experiments/{POLICY_SEEDED}/start").raise_for_status()
        yield server
    finally:
        stop_api(server)


@pytest.fixture
def dashboard_api(seeded_api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    """The in-process app (AppTest) started against the seeded API: ``ABLAB_API_URL`` is
    the only API the dashboard may talk to."""
    from ablab.platform.config import get_settings

    monkeypatch.setenv("ABLAB_API_URL", seeded_api.base_url)
    get_settings.cache_clear()
    yield seeded_api
    monkeypatch.undo()
    get_settings.cache_clear()


@pytest.fixture
def open_app(dashboard_api: ApiServer) -> Callable[..., AppTest]:  # noqa: F821
    seeded_api = dashboard_api
    """An AppTest of the real app file, signed in with a token of ``scope``, on ``page``."""
    from streamlit.testing.v1 import AppTest

    def _open(page: str = "experiments", *, scope: str = "editor", exp: str | None = None, run: bool = True) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=180)
        at.session_state["api_url"] = seeded_api.base_url
        at.session_state["token"] = seeded_api.tokens[scope]
        at.session_state["scope"] = scope
        at.session_state["user"] = f"test-{scope}"
        at.query_params["page"] = page
        if exp:
            at.query_params["exp"] = exp
        return at.run() if run else at

    return _open
