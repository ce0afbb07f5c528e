"""The Flink job's column lists are rendered from the field catalogue: every source column,
bound check, window statistic, late field and sink column of the rendered statements is the
catalogue's, and the positional INSERTs line up."""

from __future__ import annotations

import re

import pytest

from ablab.platform import fields
from ablab.platform.fields import FIELDS, mismatches
from ablab.streaming.flink import job
from ablab_testing.flink_sql import declared_tables, view_columns


def _text(config: job.JobConfig | None = None) -> str:
    return ";\n".join(job.statements(config or job.JobConfig())) + ";"


def _problems(declared: dict[str, dict[str, str]]) -> list[str]:
    problems = []
    for table, (kind, expected) in fields.flink_expected().items():
        if table not in declared:
            problems.append(f"{table}: not declared in streaming/flink/sql")
            continue
        problems += mismatches(table, kind, expected, declared[table], fields.FLINK_FIXED.get(table, frozenset()))
    return problems


def test_rendered_sources_and_sinks_agree_with_the_catalogue() -> None:
    assert _problems(declared_tables(_text())) == []


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("e2e_ms_sumsq DOUBLE,", "e2e_ms_sumsq BIGINT,", "inference_window_sink.e2e_ms_sumsq: type BIGINT"),
        ("ttft_ms_p99 DOUBLE,", "", "inference_window_sink: missing column ttft_ms_p99"),
        ("cost_usd_sumsq DOUBLE,", "cost_usd_sumsq DOUBLE, cost_usd_p95 DOUBLE,", "column cost_usd_p95 is not in the field catalogue"),
        ("    output_tokens BIGINT,\n", "", "inference_events: missing column output_tokens"),
    ],
)
def test_the_check_fails_on_a_wrong_schema(old: str, new: str, complaint: str) -> None:
    text = _text()
    assert old in text
    problems = _problems(declared_tables(text.replace(old, new, 1)))
    assert any(complaint in p for p in problems), problems


def test_every_flink_field_is_bounded_and_required_unless_nullable() -> None:
    text = _text()
    screened = re.findall(r"WHEN (\w+ IS NOT NULL AND )?NOT \((\w+) BETWEEN (\S+) AND (\S+)\) THEN '(\w+)'", text)
    assert [s[1] for s in screened] == list(fields.FLINK_FIELDS)
    for guard, name, lo, hi, named in screened:
        f = FIELDS[name]
        assert named == name and bool(guard) == f.nullable
        assert float(lo) == f.lo == 0 and lo == "0"  # an integer 0: -0.0 passes, as at the edge
        assert float(hi) == f.hi
        assert hi.endswith("E0") if f.type == "float" else hi.isdigit()  # DOUBLE literals for DOUBLE columns
    where = text[text.index("WHERE shadow_of IS NULL"):]
    where = where[:where.index(";")]
    required = set(re.findall(r"(\w+) IS NOT NULL", where)) & set(fields.FLINK_FIELDS)
    assert required == {n for n in fields.FLINK_FIELDS if not FIELDS[n].nullable}


def test_a_configured_ceiling_reaches_every_field_of_its_unit() -> None:
    text = _text(job.JobConfig(max_latency_ms=1000.0, max_tokens=77))
    for name in fields.FLINK_FIELDS:
        f = FIELDS[name]
        if f.unit == "ms":
            assert re.search(rf"NOT \({name} BETWEEN 0 AND 1000.0E0\)", text), name
        if f.unit == "tokens":
            assert f"NOT ({name} BETWEEN 0 AND 77)" in text


def test_positional_inserts_line_up_with_their_sinks() -> None:
    """``INSERT INTO sink SELECT * FROM view`` is positional: the view's columns are the sink's, in order."""
    text = _text()
    tables = declared_tables(text)
    for sink, view in (("inference_window_sink", "inference_window_stats"), ("late_sink", "late_rows")):
        assert f"INSERT INTO {sink} SELECT * FROM {view}" in text
        assert view_columns(text, view) == list(tables[sink])
    assert view_columns(text, "inference_window_stats") == [
        "kind", *fields.WINDOW_KEY, *fields.WINDOW_COUNTS, *fields.window_value_columns(), "emitted_at"]


def test_window_statistics_are_computed_as_the_catalogue_says() -> None:
    text = _text()
    for f in fields.WINDOWED:
        for stat in f.window:
            name = fields.window_column(f.name, stat)
            if stat == "n":
                assert f"COUNT({f.name}) AS {name}" in text
            elif stat in fields.WINDOW_QUANTILES:
                assert re.search(rf"{f.name}_q\[\d\] AS {name}\b", text), name
            else:
                value = f.name if stat == "sum" else f"{f.name} * {f.name}"
                assert re.search(rf"SUM\({re.escape(value)}\)(, 0\.0\))?( AS DOUBLE\))? AS {name}\b", text), name


def test_no_placeholder_is_left_and_no_field_is_hand_written_in_the_templates() -> None:
    assert "${" not in _text()
    templates = "\n".join(p.read_text() for p in job.sql_files())
    assert not [name for name in FIELDS if re.search(rf"\b{name}\b", templates)]
