"""Comparing results documents (``ablab analyze`` / ``GET …/results``) from two sources."""

from __future__ import annotations

from typing import Any

import pytest


def assert_same_results(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """The same decisions, SRM p-value and per-metric figures. Sums of the same numbers
    added in another order (a store against the offline engine) differ in the last bits,
    hence the relative tolerance; methods and missing values must match exactly."""
    assert actual["srm"]["p_value"] == pytest.approx(expected["srm"]["p_value"], rel=1e-9)
    assert [d["decision"] for d in actual["decisions"]] == [d["decision"] for d in expected["decisions"]]
    by_key = {(r["metric"], r["variant"]): r for r in expected["metrics"]}
    for row in actual["metrics"]:
        want = by_key[(row["metric"], row["variant"])]
        for key in ("n", "estimate", "abs_diff", "p_value"):
            if want[key] is None:
                assert row[key] is None, (row["metric"], key)
            else:
                assert row[key] == pytest.approx(want[key], rel=1e-6, abs=1e-12), (row["metric"], row["variant"], key)
        assert row["method"] == want["method"]
