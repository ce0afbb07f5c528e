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
    # shadow requests (issue 34): present on both sides or on neither, and the same rows
    assert (actual.get("shadows") is None) == (expected.get("shadows") is None)
    if expected.get("shadows") is not None:
        assert_same_shadows(actual["shadows"], expected["shadows"])


def assert_same_shadows(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The same (variant, metric) rows with the same keys, coverage counts and figures (to
    1e-6 relative, as :func:`assert_same_results`: sums taken in another order)."""
    assert [(r["variant"], r["metric"]) for r in actual] == [(r["variant"], r["metric"]) for r in expected]
    for got, want in zip(actual, expected):
        where = (got["variant"], got["metric"])
        assert set(got) == set(want), (where, set(got) ^ set(want))
        assert got["coverage"] == want["coverage"], where
        for key, value in want.items():
            if key == "coverage":
                continue
            if isinstance(value, list):
                assert [x is None for x in got[key]] == [x is None for x in value], (where, key)
                assert [x for x in got[key] if x is not None] == pytest.approx([x for x in value if x is not None],
                                                                               rel=1e-6, abs=1e-12), (where, key)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-12), (where, key)
            else:
                assert got[key] == value, (where, key)
