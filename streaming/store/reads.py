"""The store side of the results port (:class:`ablab.platform.analytics.store_port.AnalyticsReads`):
executes the per-unit plan's SQL over ``raw_events`` (rendered, pure, by
:mod:`ablab.platform.stats.unit_agg`) and reads the per-unit rollup through
:class:`~ablab.streaming.store.rollup.RollupStore`, the one owner of the rollup tables.

Every value is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ablab.platform.fields import EVENT_FIELDS
from ablab.streaming.store.rollup import Columns, RollupStore

if TYPE_CHECKING:
    import pyarrow as pa
    from clickhouse_connect.driver.client import Client

    from ablab.platform.stats.spec import ExperimentSpec
    from ablab.platform.stats.unit_agg import ShadowSQL, StoreSQL, UnitPlan


# Every event of the experiment off-policy evaluation reads: its requests and their labels (a
# feedback event rarely names the experiment, so labels are found by trace); ``arm``,
# ``propensity``, ``policy_version`` and ``max_tokens`` come out of the stored JSON until the
# event schema gives them columns.
LOGGED_EVENTS_SQL = f"""
SELECT type, ts, trace_id, experiment, variant, unit_id, shadow_of, {', '.join(EVENT_FIELDS)}, error, correct, dims,
       JSONExtract(payload, 'arm', 'Nullable(String)') AS arm,
       JSONExtract(payload, 'propensity', 'Nullable(Float64)') AS propensity,
       JSONExtract(payload, 'policy_version', 'Nullable(String)') AS policy_version,
       if(mapContains(measures, 'max_tokens'), measures['max_tokens'],
          JSONExtract(payload, 'max_tokens', 'Nullable(Float64)')) AS max_tokens,
       if(mapContains(measures, 'policy_prompt_tokens'), measures['policy_prompt_tokens'], NULL)
          AS `measures.policy_prompt_tokens`
FROM raw_events FINAL
WHERE (type = 'inference' AND experiment = {{experiment:String}})
   OR (type = 'feedback' AND trace_id IN (
         SELECT trace_id FROM raw_events WHERE type = 'inference' AND experiment = {{experiment:String}}))
"""


class StoreReads:
    """Results' reads of one ClickHouse store (a clickhouse-connect client)."""

    def __init__(self, client: Client, rollup: RollupStore | None = None) -> None:
        self._client = client
        self.rollup = rollup or RollupStore(client)

    def _columns(self, sql: str, params: Mapping[str, Any]) -> Columns:
        table = self._client.query_arrow(sql, parameters=dict(params))
        return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}

    # -- the raw scan

    def has_billing(self) -> bool:
        # a primary-key range check (milliseconds): the billing join only when there is billing
        return bool(self._client.query("SELECT count() FROM raw_events WHERE type = 'cost'").result_rows[0][0])

    def top_values(self, sql: StoreSQL) -> dict[str, list[str]]:
        if sql.top_values is None:
            return {}
        top: dict[str, list[str]] = {}
        for dim, value, _ in self._client.query(sql.top_values, parameters=sql.params).result_rows:
            top.setdefault(str(dim), []).append(str(value))
        return top

    def unit_rows(self, sql: StoreSQL) -> Columns:
        return self._columns(sql.main, sql.params)

    def pre_rows(self, sql: StoreSQL) -> Columns | None:
        if sql.pre is None:
            return None
        got = self._columns(sql.pre, sql.params)
        return got if got["unit"].size else None

    def exposures(self, experiment: str, *, final: bool = True, end_ms: int | None = None) -> dict[str, int]:
        before = "" if end_ms is None else "AND toUnixTimestamp64Milli(ts) < {end_ms:Int64} "
        rows = self._client.query(
            f"SELECT toString(variant), uniqExact(unit_id) FROM raw_events {'FINAL' if final else ''} "
            f"WHERE type = 'exposure' AND experiment = {{experiment:String}} {before}GROUP BY variant",
            parameters={"experiment": experiment, **({} if end_ms is None else {"end_ms": end_ms})},
        ).result_rows
        return {str(v): int(n) for v, n in rows}

    def shadow_activity(self, sql: ShadowSQL) -> bool:
        return bool(self._client.query(sql.probe, parameters=sql.params).result_rows[0][0])

    def shadow_rows(self, sql: ShadowSQL) -> tuple[Columns, Columns]:
        return self._columns(sql.pairs, sql.params), self._columns(sql.requests, sql.params)

    def logged_events(self, experiment: str) -> pa.Table:
        return self._client.query_arrow(LOGGED_EVENTS_SQL, parameters={"experiment": experiment})

    # -- the rollup (its owner reads it)

    def rollup_current(self, spec: ExperimentSpec) -> bool:
        return self.rollup.current(spec)

    def rollup_units(self, spec: ExperimentSpec, plan: UnitPlan) -> Columns:
        return self.rollup.units(spec, plan)

    def rollup_spans(self, spec: ExperimentSpec) -> list[tuple[str, int, int]]:
        return self.rollup.spans(spec)

    def rollup_histograms(self, spec: ExperimentSpec) -> Columns:
        return self.rollup.histogram_buckets(spec)

    def rollup_segments(self, spec: ExperimentSpec, plan: UnitPlan, dim: str) -> tuple[Columns, list[str], list[str]]:
        return self.rollup.segment_rows(spec, plan, dim)

