"""The analysis window (issue 33 item 5): ``start <= ts < end``, where the end is ``analysis.end``
or a ship. Offline (``ablab analyze``): events at or after the end are ignored, so the numbers
equal those of the events before it; after a ship, winner-only traffic leaves the split check,
the decisions and every estimate as the comparison left them, and the results say so in
``window``. The spec refuses an end that is not ISO-8601 or not after the start, naming it.
The store's SQL rendering of the same bound: tests/unit/streaming/test_store_analysis_end.py."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import Shipped, SpecError, parse_spec, with_ship
from ablab.platform.stats.synthetic import spec_dict
from ablab_testing.analysis_window import (
    PAIR,
    SHIP_AT,
    START,
    after_ship_events,
    comparison_events,
    numbers,
    shipped_spec,
    spec_of,
)


def test_events_after_the_end_are_ignored_and_the_numbers_equal_those_before_it() -> None:
    before, after = comparison_events(), after_ship_events()
    mid = START + pd.Timedelta(minutes=30)
    bounded, agg = analyze_events(pd.concat([before, after], ignore_index=True), spec_of(end=mid.isoformat()))
    # a label is its request's, whenever it arrives (as the store joins labels by trace)
    alone, _ = analyze_events(before[(before["ts"] < mid) | (before["type"] == "feedback")], spec_of())
    assert numbers(bounded) == numbers(alone)
    assert bounded.window is not None and bounded.window.end == mid.isoformat() and bounded.window.shipped is None
    # the bound is what made them equal: the later half moves the numbers
    assert numbers(analyze_events(before, spec_of())[0]) != numbers(alone)
    # every event at or after the end is counted out, exposures included
    late = ((before["ts"] >= mid) & (before["type"] != "feedback")).sum() + (after["type"] != "feedback").sum()
    assert agg.data_quality["after_end_events"] == late


def test_after_a_ship_winner_only_traffic_changes_nothing() -> None:
    before, after = comparison_events(), after_ship_events()
    everything = pd.concat([before, after], ignore_index=True)
    comparison, _ = analyze_events(before, spec_of())
    assert not comparison.srm.flagged
    assert {d.variant: d.decision for d in comparison.decisions} == {"int8": "ship"}

    shipped, _ = analyze_events(everything, shipped_spec())
    assert numbers(shipped) == numbers(comparison)
    window = shipped.model_dump(mode="json")["window"]
    assert window == {"start": START.isoformat(), "end": SHIP_AT.isoformat(),
                      "shipped": {"variant": "int8", "at": SHIP_AT.isoformat(), "phase": 2}}

    # without the window, as results were before: the split check flags and the decision turns
    unbounded, _ = analyze_events(everything, replace(spec_of(), variants=shipped_spec().variants))
    assert unbounded.srm.flagged and {d.variant: d.decision for d in unbounded.decisions} == {"int8": "no_ship"}


def test_the_ship_takes_the_split_before_it_and_the_earlier_of_two_ends() -> None:
    spec = with_ship(spec_of(), Shipped("int8", SHIP_AT.isoformat(), 3), {"control": 3.0, "int8": 1.0})
    assert spec.weights == {"control": 3.0, "int8": 1.0} and spec.end == SHIP_AT.isoformat()
    earlier = (START + pd.Timedelta(minutes=10)).isoformat()
    assert with_ship(spec_of(end=earlier), Shipped("int8", SHIP_AT.isoformat(), 2), {}).end == earlier
    assert with_ship(spec_of(end="2027-01-01T00:00:00Z"), Shipped("int8", SHIP_AT.isoformat(), 2), {}).end \
        == SHIP_AT.isoformat()
    # a variant added after the ship had no share of the comparison
    assert with_ship(spec_of(), Shipped("int8", SHIP_AT.isoformat(), 2), {"control": 1.0}).weights == {"control": 1.0, "int8": 0.0}


def test_no_bound_no_window_in_the_json() -> None:
    result, _ = analyze_events(comparison_events(), parse_spec(spec_dict(PAIR)))
    assert result.window is None and "window" not in result.model_dump(mode="json")
    started, _ = analyze_events(comparison_events(), spec_of())
    assert started.model_dump(mode="json")["window"] == {"start": START.isoformat(), "end": None, "shipped": None}


@pytest.mark.parametrize(("end", "message"), [
    ("tomorrow", "analysis.end: not an ISO-8601 time"),
    ("2026-11-30T23:00:00Z", r"analysis.end: 2026-11-30T23:00:00\+00:00 is not after the start"),
    (START.isoformat(), "is not after the start"),
])
def test_a_bad_end_is_refused_naming_it(end: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as refused:
        spec_of(end=end)
    assert str(refused.value).startswith("analysis.end:")


def test_an_end_without_a_start_and_a_zone_less_end_read_as_utc() -> None:
    spec = parse_spec(spec_dict(PAIR, analysis={"end": "2026-12-01 00:30:00"}))
    assert ua.end_ms(spec.end) == int((START + pd.Timedelta(minutes=30)).timestamp() * 1000)
