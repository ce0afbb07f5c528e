"""Registry experiment → stats spec → results, time series and attribution from the store.

After a ship (:func:`ablab.platform.registry.ship.ship_window`) the spec is the comparison
before it: events before the ship, under the split the variants had then
(:func:`ablab.platform.stats.spec.with_ship`); the results say so in ``window``. Callers with a
session pass ``ship=ship_of(session, exp)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ablab.platform.config import Settings, get_settings
from ablab.platform.errors import Invalid
from ablab.platform.registry.schemas import ExperimentRead
from ablab.platform.stats.result_models import Attribution, Results
from ablab.platform.stats.spec import ExperimentSpec, Shipped, SpecError, parse_spec, with_ship

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from ablab.platform.analytics.store_port import AnalyticsReads
    from ablab.platform.registry.ship import ShipWindow

# The store's rollup maintenance for one experiment (units repaired, by cause).
RollupSync = Callable[[ExperimentSpec], Mapping[str, int]]


def is_adaptive(exp: ExperimentRead, settings: Settings | None = None) -> bool:
    """Weights set by the allocator (see :mod:`.allocation`): request-randomized and opted in."""
    settings = settings or get_settings()
    return exp.unit.value == "request" and exp.key in settings.allocator_experiments


def ship_of(session: Session, exp: ExperimentRead) -> ShipWindow | None:
    """The ship that closed ``exp``'s comparison, if any (read from the audit log)."""
    from ablab.platform.registry.ship import ship_window

    return ship_window(session, exp)


def stats_spec(exp: ExperimentRead, *, settings: Settings | None = None, ship: ShipWindow | None = None) -> ExperimentSpec:
    """The engine's spec of ``exp``; with ``ship``, of its comparison before the ship."""
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
        if ship is not None:
            at = ship.record.at.astimezone(UTC).isoformat()
            spec = with_ship(spec, Shipped(ship.record.variant, at, ship.record.phase), ship.weights)
    except SpecError as exc:
        raise Invalid(f"experiment '{exp.key}' cannot be analyzed: {exc}", field=str(exc).split(":")[0]) from exc
    return replace(spec, adaptive=True) if is_adaptive(exp, settings) else spec


def results(store: AnalyticsReads, exp: ExperimentRead, *, settings: Settings | None = None,
            ship: ShipWindow | None = None) -> Results:
    """From the per-unit rollup where it applies, else one raw scan; read only. ``store``: the
    analytics backend (``AnalyticsBackend``, which is :class:`.store_port.AnalyticsReads`)."""
    from ablab.platform.analytics.results import results as from_store

    return from_store(store, stats_spec(exp, settings=settings, ship=ship))


def attribution(store: AnalyticsReads, exp: ExperimentRead, *, settings: Settings | None = None,
                ship: ShipWindow | None = None) -> Attribution:
    from ablab.platform.analytics.results import attribution as from_store

    return from_store(store, stats_spec(exp, settings=settings, ship=ship))


WINDOW_S = 10  # the stream job's window


def windows_end(ship: ShipWindow | None) -> datetime | None:
    """The bound on ``window_start`` (exclusive; naive UTC, as the window query binds it) that
    keeps the 10 s windows ending by the ship: the window holding the ship's moment mixes
    both phases, so it goes with the later ones."""
    if ship is None:
        return None
    end = ship.record.at.timestamp()
    return datetime.fromtimestamp(end // WINDOW_S * WINDOW_S, UTC).replace(tzinfo=None)


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
