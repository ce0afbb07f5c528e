"""Shape 10 s window rows into per-variant series for ``GET …/timeseries?metric=M``.

Input rows carry the window table's columns (``migrations/clickhouse/0002_window_stats``
as returned by ``ablab.streaming.store.queries.window_rows``): ``variant, window_start,
n, errors, <field>_sum, <field>_sumsq, …, <field>_p95, …, labeled, correct``;
column names from ``ablab.platform.fields``. Each point has the
window's own value and CI, and the running (cumulative) value, which is what a
sequential test looks at after every window. Window percentiles do not merge, so
quantile metrics have no cumulative value. Each point also says how many of the window's
requests arrived late (``late``: folded in after the window was emitted; counts and sums
include them, percentiles are those of the on-time requests). Pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ablab.platform.fields import rum_timeseries_columns, timeseries_mean_columns, timeseries_quantile_columns

from .comparisons import mean_ci
from .engine import json_ready
from .sufficient import ProportionStats, SampleStats

WINDOW_S = 10
# From the field catalogue (one naming scheme for window columns); RUM latency is joined
# per window at query time (store/queries.py), labels likewise.
MEAN_COLUMNS = {
    **timeseries_mean_columns(),
    **rum_timeseries_columns(),
}
PROPORTION_COLUMNS = {"error_rate": ("n", "errors"), "accuracy": ("labeled", "correct")}
QUANTILE_COLUMNS = timeseries_quantile_columns()
TIMESERIES_METRICS = (*MEAN_COLUMNS, *PROPORTION_COLUMNS, *QUANTILE_COLUMNS)


def _f(row: Mapping[str, Any], key: str) -> float:
    v = row.get(key)
    try:
        return 0.0 if v is None else float(v)
    except (TypeError, ValueError):
        return 0.0


def _iso(ts: Any) -> Any:
    return ts.isoformat() if isinstance(ts, datetime) else ts


def _point(stats: SampleStats | ProportionStats, alpha: float) -> dict[str, Any]:
    return {"n": stats.n, "value": stats.mean, "ci": list(mean_ci(stats.mean, stats.mean_variance, alpha=alpha))}


def timeseries(
    rows: Iterable[Mapping[str, Any]], *, experiment: str, metric: str, alpha: float = 0.05
) -> dict[str, Any]:
    if metric not in TIMESERIES_METRICS:
        raise ValueError(f"metric: {metric!r} has no window series; choose one of {', '.join(TIMESERIES_METRICS)}")
    by_variant: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_variant[str(row["variant"])].append(row)
    series = []
    for variant in sorted(by_variant):
        points = []
        running: Any = None
        for row in sorted(by_variant[variant], key=lambda r: r["window_start"]):
            base = {"ts": _iso(row["window_start"]), "late": int(_f(row, "late_n"))}
            if metric in MEAN_COLUMNS:
                n, s, ss = MEAN_COLUMNS[metric]
                window = SampleStats(_f(row, n), _f(row, s), _f(row, ss))
                running = window if running is None else running + window
                points.append({**base, **_point(window, alpha), "cumulative": _point(running, alpha)})
            elif metric in PROPORTION_COLUMNS:
                n, k = PROPORTION_COLUMNS[metric]
                share = ProportionStats(_f(row, n), _f(row, k))
                running = share if running is None else running + share
                points.append({**base, **_point(share, alpha), "cumulative": _point(running, alpha)})
            else:
                col, n = QUANTILE_COLUMNS[metric]
                value = row.get(col)
                points.append({**base, "n": _f(row, n), "value": value if value is not None and math.isfinite(float(value)) else None,
                               "ci": [None, None], "cumulative": None})
        series.append({"variant": variant, "points": points})
    out: dict[str, Any] = json_ready({"experiment": experiment, "metric": metric, "window_s": WINDOW_S, "series": series})
    return out
