"""Test and benchmark support (``tests/ablab_testing``) is not part of the product: no
shipped module imports it, so an installed ablab works without the tests folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("platform", "streaming", "inference", "dashboards", "migrations")
IMPORT = re.compile(r"^\s*(from|import)\s+ablab_testing\b", re.M)


def test_no_shipped_module_imports_the_test_support():
    offenders = sorted(str(path.relative_to(ROOT)) for folder in PRODUCT for path in (ROOT / folder).rglob("*.py")
                       if IMPORT.search(path.read_text(encoding="utf-8")))
    assert offenders == []


def test_the_detector_sees_an_import():
    assert IMPORT.search("x = 1\n    from ablab_testing.pipeline import wait_for\n")
    assert not IMPORT.search("# see ablab_testing for the harness\n")
