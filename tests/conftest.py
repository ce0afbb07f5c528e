"""Shared fixtures: a real SQL database (SQLite file or PostgreSQL) and a real API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ablab_testing import ApiServer, fresh_postgres_database, start_api, stop_api

__all__ = ["ApiServer", "fresh_postgres_database", "start_api", "stop_api"]


# Parallel runs (`scripts/test` passes `-n 2 --dist loadscope`): each test runs on the worker
# that holds the stack it shares, so each stack starts once. A module's module-scoped stack
# makes the module the unit of scheduling (xdist's loadscope); a folder whose modules share a
# session-scoped stack (the seeded dashboard API) is one unit. Each worker has its own session
# fixtures (a Kafka broker each), temp dirs (`basetemp/popen-gwN`) and free ports
# (`server_ports`, picked at random below the ephemeral range). (Not `xdist_group` marks:
# xdist 3.8's loadgroup renames `item._nodeid`, which pytest 9 no longer reports.)
SHARED_STACK_FOLDERS = ("tests/integration/dashboards/",)
# Units that run longest (`--durations` on 2 cores) go first, so both workers finish
# together instead of one starting a long module at the end; the rest keep their order.
LONGEST_FIRST = (  # seconds per unit, 2 workers on a loaded 2-core machine
    "tests/integration/cluster/test_cluster_faults.py",  # 440
    "tests/integration/stack/test_up_demo.py",  # 380
    "tests/integration/streaming/test_pipeline_canned.py",  # 330
    "tests/integration/dashboards/",  # 300
    "tests/integration/streaming/test_pipeline_faults.py",  # 260
    "tests/integration/streaming/test_hostile_input.py",  # 230
    "tests/integration/streaming/test_replay.py",  # 170
    "tests/integration/streaming/test_flink_bounded.py",  # 150
    "tests/browser/test_dashboard_e2e.py",  # 150
    "tests/integration/cluster/test_cluster_cli.py",  # 145
    "tests/integration/gateway/test_gateway_prompting_llamacpp.py",
)


def stack_group(nodeid: str) -> str:
    """The scheduling unit of a test: its module, or the shared-stack folder it is in."""
    module = nodeid.split("::", 1)[0]
    return next((folder for folder in SHARED_STACK_FOLDERS if module.startswith(folder)), module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own choice
    from xdist.scheduler import LoadScopeScheduling

    class StackScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return stack_group(nodeid)

    return StackScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after pytest has ordered the items by their fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    # a stable sort: a unit's tests keep pytest's order among themselves
    items.sort(key=lambda item: rank.get(stack_group(item.nodeid), len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    # A private base temp dir per run: pytest's default numbered dirs are pruned by any
    # newer run, which deletes the databases of a run still in progress beside it.
    if not config.option.basetemp:
        import tempfile

        # Short: an xdist worker's dir adds `popen-gwN/`, and a test that reads a path out of
        # 80-column console output must see it wrapped as in a serial run.
        config.option.basetemp = tempfile.mkdtemp(prefix="ab-")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'ablab.db'}"
    return fresh_postgres_database()


@pytest.fixture(scope="module")
def api_server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A real uvicorn process on a free port, over a freshly migrated database."""
    home = tmp_path_factory.mktemp("home")
    server = start_api(database_url, home)
    yield server
    stop_api(server)
