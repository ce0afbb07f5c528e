"""Against a running demo (`ablab up --demo`): off-policy evaluation of "always router.terse"
from demo-llm's logs beside terse-t0's measured value (issue #33's live must-show), per
metric, with the router's model as the gateways see it.

    .venv/bin/python benchmarks/demo_ope_check.py                 # accuracy and e2e_ms
    .venv/bin/python benchmarks/demo_ope_check.py --metric accuracy --json

The API URL comes from ``--api-url``, else ``ABLAB_API_URL``, else the settings; the tokens
from ``--token``/``ABLAB_TOKEN`` (admin or viewer) and ``ABLAB_SDK_TOKEN``, else the demo's
tokens file under ``ABLAB_HOME/run``. The comparison itself is ``ablab_testing.demo_ope``,
the one ``tests/integration/stack/test_up_demo.py`` asserts on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import _path  # noqa: F401  (tests/ on the import path)
import httpx

from ablab.platform.config import get_settings
from ablab_testing.demo_ope import EXPERIMENT, ROUTER, ope_check, render, render_choices, router_choices


def _router_model(api_url: str, sdk_token: str | None) -> str:
    """The router's published model version in the SDK config (what gateways serve)."""
    if not sdk_token:
        return "unknown (no SDK token)"
    r = httpx.get(f"{api_url}/v1/sdk/config", headers={"Authorization": f"Bearer {sdk_token}"}, timeout=30)
    r.raise_for_status()
    models = [m for m in r.json().get("policy_models", []) if m.get("variant") == ROUTER and m.get("experiment") == EXPERIMENT]
    if not models:
        return "none yet: the router explores uniformly"
    m = models[0]
    return f"{m['version']} (trained on {m['model'].get('trained_on', '?')} requests)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api-url", default=None)
    parser.add_argument("--token", default=os.environ.get("ABLAB_TOKEN"))
    parser.add_argument("--metric", action="append", help="repeatable; default accuracy and e2e_ms")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args()
    settings = get_settings()
    api_url = (args.api_url or os.environ.get("ABLAB_API_URL") or settings.api_url).rstrip("/")
    tokens_file = settings.home / "run" / "demo-tokens.json"
    tokens = json.loads(tokens_file.read_text()) if tokens_file.exists() else {}
    token = args.token or tokens.get("admin")
    if not token:
        print(f"no token: pass --token or ABLAB_TOKEN (no {tokens_file})", file=sys.stderr)
        return 2
    api = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    checks = {m: ope_check(api, metric=m) for m in (args.metric or ["accuracy", "e2e_ms"])}
    model = _router_model(api_url, os.environ.get("ABLAB_SDK_TOKEN") or tokens.get("sdk"))
    choices = router_choices(api)
    if args.json:
        print(json.dumps({"router_model": model, "choices": choices, "checks": checks}, indent=2))
    else:
        print(f"router model: {model}")
        print(render_choices(choices) if choices else "router: no model yet (uniform exploration)")
        for metric, check in checks.items():
            print(render(check) if check else f"{metric}: not yet (no graded request on router.terse or terse-t0)")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
