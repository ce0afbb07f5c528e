"""The results side generates from the field catalogue: per-unit columns, the SLO set,
metric definitions and directions, the paired (shadow) metrics, ``ablab analyze``'s
columns, the timeseries maps and the dashboards' labels, orders and tooltips.

The proof: one entry added to a copy of ``platform/fields.py`` (a hypothetical measured
field, ``queue_ms``) and, in a fresh interpreter that imports that copy as
``ablab.platform.fields``, every derived list picks it up with no other edit. The windows
and the Flink job are proven by the streaming tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from ablab.platform import fields
from ablab.platform.stats import metrics, paired

CATALOGUE = Path(fields.__file__)

NEW_ENTRY = '''    Field("queue_ms", "float", "ms", "lower", 0.0, DAY_S * 1000, _LATENCY, ("inference",),
          "Queue wait (mean)", "ms", window=(*_SUMS, *WINDOW_QUANTILES),
          per_unit=("sum", "n", "sq"), slo=True, late=True, flink=True, paired=True,
          description="Time a request waited for a slot before its prefill (ms)."),
'''

# Runs in a fresh interpreter: the patched catalogue replaces ablab.platform.fields before
# anything imports it, then the consumers are imported and read.
PROBE = textwrap.dedent('''
    import importlib.util, json, sys
    import ablab.platform

    source = sys.stdin.read()
    spec = importlib.util.spec_from_loader("ablab.platform.fields", loader=None, origin="patched")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ablab.platform.fields"] = module
    exec(compile(source, "patched_fields.py", "exec"), module.__dict__)
    ablab.platform.fields = module

    from ablab.platform import fields
    from ablab.platform.stats import metrics, offline, paired, timeseries
    from ablab.dashboards import format as fmt
    from ablab.dashboards.views import shadows

    m = metrics.METRICS
    print(json.dumps({
        "patched": "queue_ms" in fields.FIELDS,
        "slo_fields": fields.SLO_FIELDS,
        "slo_metrics": metrics.SLO_METRICS,
        "unit_columns": metrics.UNIT_COLUMNS,
        "histograms": metrics.HISTOGRAM_SOURCES,
        "mean": [[d.kind, d.numerator, d.denominator, d.lower_is_better] for n, d in m.items() if n == "queue_ms"],
        "quantiles": {n: [d.kind, d.numerator, d.denominator, d.quantile] for n, d in m.items() if n.startswith("queue_ms_")},
        "default_metrics": metrics.DEFAULT_METRICS,
        "lower_sources": sorted(metrics.LOWER_IS_BETTER_SOURCES),
        "inference_sources": metrics.INFERENCE_SOURCES,
        "shadow": [[s.name, s.source, s.lower_is_better, s.rank_tests, s.success_only]
                   for s in paired.BUILTIN_SHADOW_METRICS if s.name == "queue_ms"],
        "analyze_reads": [offline.wanted("queue_ms"), "queue_ms" in offline.COLUMNS],
        "latencies": offline.LATENCIES,
        "timeseries": [timeseries.MEAN_COLUMNS.get("queue_ms"), timeseries.QUANTILE_COLUMNS.get("queue_ms_p95")],
        "labels": {k: fmt.METRIC_LABELS.get(k) for k in ("queue_ms", "queue_ms_p95", "queue_ms_p99")},
        "help": fmt.METRIC_HELP.get("queue_ms"),
        "order": fmt.RESULT_METRIC_ORDER,
        "rank_tested": shadows.RANK_TESTED,
    }))
''')


def _probe(source: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], input=source, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_new_catalogue_entry_reaches_every_derived_list_metric_label_and_column() -> None:
    source = CATALOGUE.read_text()
    anchor = '    Field("device_s",'
    assert source.count(anchor) == 1
    out = _probe(source.replace(anchor, NEW_ENTRY + anchor))

    assert out["patched"]
    assert out["slo_fields"] == out["slo_metrics"] == ["e2e_ms", "ttft_ms", "tpot_ms", "queue_ms"]
    assert [c for c in out["unit_columns"] if c.startswith("queue_ms")] == ["queue_ms_sum", "queue_ms_n", "queue_ms_sq"]
    assert "queue_ms" in out["histograms"]
    assert out["mean"] == [["mean", "queue_ms_sum", "queue_ms_n", True]]
    assert out["quantiles"] == {"queue_ms_p95": ["quantile", "queue_ms", "queue_ms_n", 0.95],
                                "queue_ms_p99": ["quantile", "queue_ms", "queue_ms_n", 0.99]}
    assert {"queue_ms", "queue_ms_p95", "queue_ms_p99"} <= set(out["default_metrics"])
    assert "queue_ms" in out["lower_sources"] and "queue_ms" in out["inference_sources"]
    assert out["shadow"] == [["queue_ms", "queue_ms", True, True, True]]  # paired, rank-tested, success only
    assert out["analyze_reads"] == [True, True] and "queue_ms" in out["latencies"]
    assert out["timeseries"] == [["n", "queue_ms_sum", "queue_ms_sumsq"], ["queue_ms_p95", "n"]]
    assert out["labels"] == {"queue_ms": ["Queue wait (mean)", "ms"], "queue_ms_p95": ["Queue wait p95", "ms"],
                             "queue_ms_p99": ["Queue wait p99", "ms"]}
    assert out["help"] == "Time a request waited for a slot before its prefill (ms)."
    assert out["order"][:6] == ["e2e_ms", "e2e_ms_p95", "ttft_ms", "ttft_ms_p95", "queue_ms", "queue_ms_p95"]
    assert "queue_ms" in out["rank_tested"]


def test_the_unpatched_probe_sees_none_of_it() -> None:
    out = _probe(CATALOGUE.read_text())
    assert not out["patched"] and "queue_ms" not in out["default_metrics"] and out["shadow"] == []


# --- today's catalogue derives what was written by hand before (values pinned) -------------


def test_the_derived_per_unit_columns_and_metrics_are_todays() -> None:
    assert metrics.UNIT_COLUMNS == (
        "requests", "errors", "e2e_ms_sum", "e2e_ms_n", "e2e_ms_sq", "ttft_ms_sum", "ttft_ms_n", "ttft_ms_sq",
        "tpot_ms_sum", "tpot_ms_n", "cost_usd_sum", "labeled", "correct", "labeled_cost_usd_sum", "good",
    )
    assert [(m.name, m.kind, m.numerator, m.denominator, m.lower_is_better, m.quantile) for m in metrics.METRICS.values()] == [
        ("e2e_ms", "mean", "e2e_ms_sum", "e2e_ms_n", True, None),
        ("ttft_ms", "mean", "ttft_ms_sum", "ttft_ms_n", True, None),
        ("tpot_ms", "mean", "tpot_ms_sum", "tpot_ms_n", True, None),
        ("e2e_ms_p95", "quantile", "e2e_ms", "e2e_ms_n", True, 0.95),
        ("ttft_ms_p95", "quantile", "ttft_ms", "ttft_ms_n", True, 0.95),
        ("e2e_ms_p99", "quantile", "e2e_ms", "e2e_ms_n", True, 0.99),
        ("ttft_ms_p99", "quantile", "ttft_ms", "ttft_ms_n", True, 0.99),
        ("accuracy", "proportion", "correct", "labeled", False, None),
        ("cost_usd", "mean", "cost_usd_sum", "requests", True, None),
        ("cost_per_correct", "ratio", "labeled_cost_usd_sum", "correct", True, None),
        ("goodput", "proportion", "good", "requests", False, None),
        ("error_rate", "proportion", "errors", "requests", True, None),
    ]
    assert metrics.HISTOGRAM_SOURCES == ("e2e_ms", "ttft_ms")


def test_one_slo_order_and_the_catalogues_directions() -> None:
    assert metrics.SLO_METRICS == fields.SLO_FIELDS == ("e2e_ms", "ttft_ms", "tpot_ms")
    assert metrics.LOWER_IS_BETTER_SOURCES == {"e2e_ms", "ttft_ms", "tpot_ms", "device_s", "cost_usd", "error"}
    assert fields.lower_is_better_fields() == metrics.LOWER_IS_BETTER_SOURCES - {"error"}
    assert not fields.lower_is_better("score") and fields.lower_is_better("output_tokens")  # "none": fewer is cheaper
    assert paired.RANK_TEST_METRICS == fields.LATENCY_FIELDS == ("e2e_ms", "ttft_ms", "tpot_ms")
    assert paired.MEASURED_SOURCES == set(metrics.INFERENCE_SOURCES) == {
        "e2e_ms", "ttft_ms", "tpot_ms", "prompt_tokens", "output_tokens", "device_s", "cost_usd"}


def test_the_named_roles_and_rules() -> None:
    assert (fields.HEADLINE_LATENCY, fields.SLA_LATENCY, fields.SLA_METRIC, fields.COST_FIELD) == \
        ("e2e_ms", "ttft_ms", "ttft_ms_p95", "cost_usd")
    assert fields.AT_MOST == (("ttft_ms", "e2e_ms", "ttft_exceeds_e2e"),)
    assert fields.otel_attributes()["ttft_ms"] == ("gen_ai.client.operation.time_to_first_chunk", 1e-3)
    assert fields.rum_timeseries_columns() == {"rum_e2e_ms": ("rum_n", "rum_e2e_ms_sum", "rum_e2e_ms_sumsq")}
    assert fields.rum_labels() == {"rum_e2e_ms": ("Client-side latency (RUM)", "ms")}
    assert all(f.description for f in fields.FIELDS.values())  # every tooltip is written
