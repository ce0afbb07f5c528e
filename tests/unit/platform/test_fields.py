"""The field catalogue against everything that names a field without a database: the event
models' bounds, the loader's column tuples, the timeseries maps and the dashboard labels.
The Flink job renders its column lists from the catalogue
(``tests/unit/streaming/test_flink_catalogue.py`` reads them back);
``tests/integration/streaming/test_catalogue.py`` checks the ClickHouse tables of a migrated
store; ``test_fields_catalogue.py`` adds a field and follows it through the results side."""

from __future__ import annotations

import re
import typing

import pytest

from ablab.platform import events, fields
from ablab.platform.fields import FIELDS, mismatches
from ablab.streaming.loader import rows


def test_loader_column_tuples_agree_with_the_catalogue() -> None:
    assert rows.WINDOW_COLUMNS == fields.WINDOW_COLUMNS
    assert set(fields.EVENT_FIELDS) <= set(rows.RAW_COLUMNS)
    assert set(fields.LATE_FIELDS) | {"is_error"} <= set(rows.LATE_COLUMNS)
    late_stats = {c for c in rows.LATE_COLUMNS if c not in fields.CLICKHOUSE_FIXED["late_events"]}
    assert late_stats == set(fields.LATE_FIELDS) | {"is_error"}


def test_the_column_check_fails_on_a_wrong_list() -> None:
    kind, expected = fields.clickhouse_expected()["window_stats"]
    actual = {**expected, "e2e_sum": "Float64"}
    del actual["ttft_ms_sumsq"]
    actual["n"] = "UInt32"
    problems = mismatches("window_stats", kind, expected, actual)
    assert len(problems) == 3
    assert any("missing column ttft_ms_sumsq" in p for p in problems)
    assert any("e2e_sum is not in the field catalogue" in p for p in problems)
    assert any("window_stats.n: type UInt32" in p for p in problems)


def test_event_models_take_their_bounds_from_the_catalogue() -> None:
    assert {name: (b.lo, b.hi, b.unit) for name, b in events.FIELD_BOUNDS.items()} == {
        f.name: (f.lo, f.hi, f.unit) for f in FIELDS.values()
    }
    models = {
        "inference": events.InferenceEvent, "rum": events.RumEvent,
        "feedback": events.FeedbackEvent, "cost": events.CostEvent,
    }
    for kind, model in models.items():
        numeric = {
            name for name, info in model.model_fields.items()
            if name in FIELDS or any(t in (int, float) for t in typing.get_args(info.annotation) or (info.annotation,))
        } - {"v", "correct"}
        assert numeric == {f.name for f in fields.fields_of(kind)}, kind
        for f in fields.fields_of(kind):
            metadata = model.model_fields[f.name].metadata
            ge = [m.ge for m in metadata if hasattr(m, "ge")]
            le = [m.le for m in metadata if hasattr(m, "le")]
            assert (ge, le) == ([f.lo], [f.hi]) or f.nullable, (kind, f.name, metadata)


def test_timeseries_maps_and_dashboard_labels_come_from_the_catalogue() -> None:
    from ablab.dashboards.format import METRIC_LABELS
    from ablab.platform.stats import timeseries

    for f in fields.WINDOWED:
        assert timeseries.MEAN_COLUMNS[f.name][1:] == (f"{f.name}_sum", f"{f.name}_sumsq")
    assert set(timeseries.QUANTILE_COLUMNS) == {"e2e_ms_p50", "e2e_ms_p95", "e2e_ms_p99",
                                                 "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99"}
    for metric in (*timeseries.TIMESERIES_METRICS, *FIELDS):
        assert metric in METRIC_LABELS, metric
    assert METRIC_LABELS["e2e_ms"] == (FIELDS["e2e_ms"].label, "ms")


def test_window_column_names_follow_one_scheme() -> None:
    for f in fields.WINDOWED:
        for stat in f.window:
            assert fields.window_column(f.name, stat) == f"{f.name}_{stat}"
    with pytest.raises(KeyError, match="no window statistic"):
        fields.window_column("device_s", "sum")
    assert fields.SLO_FIELDS == ("e2e_ms", "ttft_ms", "tpot_ms")


def test_migration_0012_renames_every_legacy_window_name() -> None:
    from ablab.streaming.store.ddl import migration_files

    [migration] = [m for m in migration_files() if m.version == 12]
    renames = dict(re.findall(r"RENAME COLUMN IF EXISTS (\w+) TO (\w+)", migration.sql))
    assert renames == dict(fields.LEGACY_WINDOW_NAMES)
    assert set(renames.values()) <= set(fields.WINDOW_COLUMNS)


def test_the_loader_reads_a_window_record_under_the_names_before_0012() -> None:
    import json

    new = {name: 1 for name in fields.WINDOW_COLUMNS if name not in fields.WINDOW_KEY and name != "emitted_at"}
    record = {"kind": "inference", "experiment": "e", "variant": "a", "window_start": "2026-01-01T00:00:00Z",
              "window_end": "2026-01-01T00:00:10Z", "emitted_at": "2026-01-01T00:00:11Z",
              **{old: 1 for old in fields.LEGACY_WINDOW_NAMES},
              **{k: v for k, v in new.items() if k not in fields.LEGACY_WINDOW_NAMES.values()}}
    routed = rows.route(topic="w", value=json.dumps(record).encode(), partition=0, offset=0, windows_topic="w")
    assert isinstance(routed, rows.Routed), routed
    assert routed.table == "window_stats" and len(routed.row) == len(fields.WINDOW_COLUMNS)
