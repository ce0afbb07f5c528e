"""The gateway and the SDK ship in the light install: they must not import torch, PyFlink,
chDB or Streamlit, even after serving a request path's pure parts."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import ablab.platform.sdk, ablab.platform.gateway.app, ablab.cli
from ablab.platform.gateway.metering import strategy_id
from ablab.platform.gateway.emit import schema_has_measures
from ablab.platform.gateway.rewrite import strategy_problems
strategy_id({"params": {"temperature": 0.2}}); strategy_id({"cot_depth": 2}); schema_has_measures()
strategy_problems({"compression": {"method": "entropy"}}, backends={}, templates={})
print(sorted(m for m in ("torch", "pyflink", "chdb", "streamlit") if m in sys.modules))
"""


def test_gateway_and_sdk_import_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
