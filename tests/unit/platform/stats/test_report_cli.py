"""`ablab report KEY` fetches GET /v1/experiments/KEY/results with the token and renders it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from typer.testing import CliRunner

from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events


@pytest.fixture
def results_server():
    body = json.dumps(analyze_events(synthetic_events(n_requests=3_000, n_units=300, seed=1), parse_spec(spec_dict()))[0].model_dump(mode="json")).encode()
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            ok = self.headers.get("Authorization") == "Bearer s3cret" and self.path == "/v1/experiments/exp/results"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if ok else b'{"title": "unauthorized"}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)  # an ephemeral loopback port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def test_report_renders_results_from_the_api(results_server):
    from ablab.cli import app

    url, seen = results_server
    runner = CliRunner()
    res = runner.invoke(app, ["report", "exp", "--api-url", url, "--token", "s3cret", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{"):])["experiment"] == "exp"
    assert seen[-1] == ("/v1/experiments/exp/results", "Bearer s3cret")
    table = runner.invoke(app, ["report", "exp", "--api-url", url], env={"ABLAB_TOKEN": "s3cret"})
    assert table.exit_code == 0 and "decisions" in table.stdout
    denied = runner.invoke(app, ["report", "exp", "--api-url", url, "--token", "wrong"])
    assert denied.exit_code == 1 and "401" in denied.output
