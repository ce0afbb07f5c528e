"""Registry experiment → stats spec → results, time series and attribution from the store."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ablab.platform.config import Settings, get_settings
from ablab.platform.errors import Invalid
from ablab.platform.registry.schemas import ExperimentRead
from ablab.platform.stats.result_models import Attribution, Results
from ablab.platform.stats.spec import ExperimentSpec, SpecError, parse_spec

if TYPE_CHECKING:
    from ablab.platform.analytics.store_port import AnalyticsReads

# The store's rollup maintenance for one experiment (units repaired, by cause).
RollupSync = Callable[[ExperimentSpec], Mapping[str, int]]


def is_adaptive(exp: ExperimentRead, settings: Settings | None = None) -> bool:
    """Weights set by the allocator (see :mod:`.allocation`): request-randomized and opted in."""
    settings = settings or get_settings()
    return exp.unit.value == "request" and exp.key in settings.allocator_experiments


def stats_spec(exp: ExperimentRead, *, settings: Settings | None = None) -> ExperimentSpec:
    metrics = dict(exp.metrics or {})
    mde = metrics.pop("mde", None)  # the registry keeps it with the metrics; the engine reads analysis.mde
    data: dict[str, Any] = {
        "key": exp.key,
        "control": exp.control,
        "unit": exp.unit.value,
        "variants": [{"key": v.key, "weight": v.weight, "strategy": v.strategy} for v in exp.variants],
        "guardrails": exp.guardrails,
        "metrics": {k: v for k, v in metrics.items() if v is not None},
    }
    if mde:
        data["analysis"] = {"mde": mde}
    if exp.started_at is not None:
        data["start"] = exp.started_at.isoformat()
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        raise Invalid(f"experiment '{exp.key}' cannot be analyzed: {exc}", field=str(exc).split(":")[0]) from exc
    return replace(spec, adaptive=True) if is_adaptive(exp, settings) else spec


def results(store: AnalyticsReads, exp: ExperimentRead, *, settings: Settings | None = None) -> Results:
    """From the per-unit rollup where it applies, else one raw scan; read only. ``store``: the
    analytics backend (``AnalyticsBackend``, which is :class:`.store_port.AnalyticsReads`)."""
    from ablab.platform.analytics.results import results as from_store

    return from_store(store, stats_spec(exp, settings=settings))


def attribution(store: AnalyticsReads, exp: ExperimentRead, *, settings: Settings | None = None) -> Attribution:
    from ablab.platform.analytics.results import attribution as from_store

    return from_store(store, stats_spec(exp, settings=settings))


def sync_rollup(sync: RollupSync, exp: ExperimentRead, *, settings: Settings | None = None) -> Mapping[str, int]:
    """Keep the experiment's per-unit rollup current (its SLOs and segment choice written, stale
    units recomputed) through the store's maintenance step ``sync`` (``AnalyticsBackend.sync_rollup``):
    after create/update commits and in the monitor's pass, so results reads write nothing. A
    store failure raises (the backend has counted it); the caller logs it, never swallows it
    silently, and the monitor's next pass retries."""
    try:
        spec = stats_spec(exp, settings=settings)
    except Invalid:
        return {"slo": 0, "missing": 0}  # not analyzable yet; results will say why
    return sync(spec)


def timeseries(windows: Iterable[Mapping[str, Any]], exp: ExperimentRead, *, metric: str) -> dict[str, Any]:
    """``windows``: the experiment's 10 s window rows from the store (``AnalyticsBackend.window_rows``)."""
    from ablab.platform.stats.timeseries import timeseries as shape

    try:
        return shape(windows, experiment=exp.key, metric=metric)
    except ValueError as exc:
        raise Invalid(str(exc), field="metric") from exc
