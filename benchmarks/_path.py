"""Puts ``tests/`` on the import path so benchmarks share the tests' support package
(``ablab_testing``: the pipeline harness, the offline reference, the strategy benchmark),
which is not part of the installed product. Import it before any ``ablab_testing`` import."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
