"""Property-based fuzzing of the live API's own OpenAPI spec (schemathesis).

Every operation the server publishes is called with generated inputs — ones that fit
the schema and ones that do not — over real HTTP against the real uvicorn server
(SQLite, and PostgreSQL when configured), with an admin token so every route is
reachable past auth. The one property: no input makes the server answer 5xx. A 5xx is
a bug; the failure names the operation and the payload and carries the server's
``api.log`` tail (the traceback).

Ingestion is on: the ingestion routes publish the event models as their request bodies,
so generated batches carry real event shapes with hostile values (the emitter's broker
is a closed port: accepted events go to the API's disk spool, never to a shared broker).

The operations are driven with ``operation.as_strategy()`` under hypothesis rather than
``schemathesis.pytest.from_fixture``: the latter reads ``request.node._nodeid``, which
pytest 9 no longer has.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from ablab_testing import closed_port, start_api, stop_api

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 20
CORE_PATHS = ("/v1/experiments", "/v1/experiments/{key}", "/v1/assign", "/v1/assign/batch", "/v1/sdk/config",
              "/v1/events", "/v1/feedback", "/v1/webhooks/billing")


@pytest.fixture(scope="module")
def api_server(database_url: str, tmp_path_factory: pytest.TempPathFactory):
    server = start_api(database_url, tmp_path_factory.mktemp("home"),
                       extra_env={"ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}"})
    yield server
    stop_api(server)


@pytest.fixture(scope="module")
def api_schema(api_server):
    return schemathesis.openapi.from_url(f"{api_server.base_url}/openapi.json", timeout=30)


def test_spec_lists_the_control_plane(api_server) -> None:
    # Guards the fuzz test against silently fuzzing an empty or partial spec.
    paths = httpx.get(f"{api_server.base_url}/openapi.json", timeout=30).json()["paths"]
    for path in CORE_PATHS:
        assert path in paths, sorted(paths)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_input_makes_the_server_fail(api_server, api_schema, mode: GenerationMode) -> None:
    headers = {"Authorization": f"Bearer {api_server.tokens['admin']}"}
    failures: list[str] = []
    calls: dict[str, int] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= set(CORE_PATHS)
    # Deletes last: DELETE /v1/keys/{id} may revoke the fuzzing admin's own key (id 1),
    # after which every other operation would only ever see 401.
    operations.sort(key=lambda op: op.method.upper() == "DELETE")
    if mode is GenerationMode.NEGATIVE:
        # Only bodies and query strings can be made schema-invalid here (path keys are free
        # strings, and the Authorization header is always replaced by the admin token).
        operations = [op for op in operations if len(op.body) or len(op.query)]

    for operation in operations:
        calls[operation.label] = 0

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
        def fuzz(case) -> None:  # hypothesis runs it within this iteration of the loop
            calls[operation.label] += 1  # noqa: B023
            case.call_and_validate(base_url=api_server.base_url, headers=headers, checks=[not_a_server_error], timeout=30)

        try:
            fuzz()
        except Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise
            del calls[operation.label]  # nothing schema-invalid to generate for this one
        except Exception as exc:  # collect all operations' failures, then report them together
            failures.append(f"{operation.label}: {exc}")

    log = (api_server.home / "api.log").read_text(errors="replace")
    assert not failures, "\n\n".join(failures) + f"\n--- api.log (tail) ---\n{log[-6000:]}"
    # Every operation was really exercised (a strategy that generates nothing proves nothing).
    assert all(n > 0 for n in calls.values()), calls
    # The ingestion routes' generated bodies reached event validation, not only auth or parsing.
    metrics = httpx.get(f"{api_server.base_url}/metrics", timeout=30).text
    validated = [line for line in metrics.splitlines() if line.startswith("ablab_ingest_events_total{")
                 and ('outcome="accepted"' in line or 'outcome="rejected"' in line)]
    assert sum(float(line.split()[-1]) for line in validated) > 0, validated
