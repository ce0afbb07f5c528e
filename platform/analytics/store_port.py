"""What results need from the analytics store, as a protocol: the reads of the per-unit plan
over ``raw_events`` (rendered by :mod:`ablab.platform.stats.unit_agg`, executed by the store)
and the reads of the per-unit rollup, whose tables the store both writes and reads
(``ablab.streaming.store.rollup``). No SQL about the store's tables lives in the control
plane; the store implements this and :class:`ablab.platform.api.ports.AnalyticsBackend`
extends it.

Per-unit rows come back column-wise (:data:`Columns`: column name → numpy array), as the
engine reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from numpy.typing import NDArray

if TYPE_CHECKING:
    import pyarrow as pa

    from ablab.platform.stats.spec import ExperimentSpec
    from ablab.platform.stats.unit_agg import ShadowSQL, StoreSQL, UnitPlan

Columns = dict[str, NDArray[Any]]


class AnalyticsReads(Protocol):
    """Read-only access to the analytics store for results, attribution and the allocator."""

    # -- the raw scan: the per-unit plan rendered as SQL (unit_agg.store_sql / shadow_sql)

    def has_billing(self) -> bool:
        """Whether any billing record was loaded (the plan then joins billed cost per trace)."""
        ...

    def top_values(self, sql: StoreSQL) -> dict[str, list[str]]:
        """Each segment dimension's top values by requests (``sql.top_values``); {} without segments."""
        ...

    def unit_rows(self, sql: StoreSQL) -> Columns:
        """The plan's in-period rows (``sql.main``): per unit, per segment value and per
        histogram bucket, told apart by ``grouping_set``."""
        ...

    def pre_rows(self, sql: StoreSQL) -> Columns | None:
        """The plan's pre-period columns per unit (``sql.pre``); None without a pre-period query or rows."""
        ...

    def exposures(self, experiment: str, *, final: bool = True, end_ms: int | None = None) -> dict[str, int]:
        """Exposed units per variant (variants without exposures left out); with ``end_ms``,
        only exposures before it (epoch milliseconds, exclusive)."""
        ...

    def shadow_activity(self, sql: ShadowSQL) -> bool:
        """Whether the experiment has any shadow activity (one cheap probe)."""
        ...

    def shadow_rows(self, sql: ShadowSQL) -> tuple[Columns, Columns]:
        """(one row per shadow request with its primary, request counts per variant)."""
        ...

    def logged_events(self, experiment: str) -> pa.Table:
        """The experiment's inference events with the labels of their traces, every catalogue
        field plus ``arm``, ``propensity``, ``policy_version`` and ``max_tokens`` (off-policy
        evaluation reads these)."""
        ...

    # -- the per-unit rollup (written by the loader and the maintenance step)

    def rollup_current(self, spec: ExperimentSpec) -> bool:
        """Every rollup row of the experiment is current (SLOs, layout) and no request precedes its start."""
        ...

    def rollup_units(self, spec: ExperimentSpec, plan: UnitPlan) -> Columns:
        """The plan's in-period columns per (variant, unit) from the rollup."""
        ...

    def rollup_spans(self, spec: ExperimentSpec) -> list[tuple[str, int, int]]:
        """(variant, first, last request in epoch ms) per variant with requests."""
        ...

    def rollup_histograms(self, spec: ExperimentSpec) -> Columns:
        """(variant, latency, bucket, count) rows of the built-in latency histograms."""
        ...

    def rollup_segments(self, spec: ExperimentSpec, plan: UnitPlan, dim: str) -> tuple[Columns, list[str], list[str]]:
        """(rows coded by variant and segment value, the value labels, the variants) of one dimension."""
        ...
