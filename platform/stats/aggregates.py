"""From per-(variant, unit) aggregate rows to per-variant sufficient statistics.

Input is what ``GROUP BY experiment, variant, unit_id`` returns (columns in
:mod:`.metrics`), as a pandas DataFrame or a dict of numpy arrays. Everything is
vectorized with ``np.bincount`` over variant codes, so a million units take
milliseconds. Pure: arrays in, dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
from numpy.typing import NDArray

from ablab.platform import fields

from .custom_metric import CustomMetric, custom_columns
from .metrics import HISTOGRAM_SOURCES, METRICS, UNIT_COLUMNS
from .sufficient import CupedStats, HistogramStats, RatioStats, SampleStats

Array = NDArray[np.float64]

# Σ of squared request values (a quantile's design effect): a store may not write them
OPTIONAL_COLUMNS = frozenset(fields.unit_column(f, "sq") for f in fields.HISTOGRAM_FIELDS)


@dataclass(frozen=True, eq=False)
class VariantStats:
    """Everything the engine reads about one variant."""

    units: float
    ratios: Mapping[str, RatioStats]  # metric (and "coverage") → x/y over units
    cuped: Mapping[str, CupedStats] = field(default_factory=dict)
    histograms: Mapping[str, HistogramStats] = field(default_factory=dict)  # latency → histogram
    request_sumsq: Mapping[str, float] = field(default_factory=dict)  # latency → Σ request²
    duration_s: float | None = None
    # custom unit_mean / unit_sum metrics: one value per unit (the unit's mean or total)
    samples: Mapping[str, SampleStats] = field(default_factory=dict)

    def __add__(self, other: VariantStats) -> VariantStats:
        """Pools two disjoint sets of units (windows, strata, shards). Both must carry the
        same statistics: a key on one side only would silently count half the units."""
        if not isinstance(other, VariantStats):
            raise TypeError(f"cannot add {type(other).__name__} to VariantStats")

        def merge(part: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
            if a.keys() != b.keys():
                raise ValueError(f"VariantStats.{part}: keys differ ({sorted(set(a) ^ set(b))} on one side only)")
            return {k: a[k] + b[k] for k in a}

        duration = None if self.duration_s is None or other.duration_s is None else self.duration_s + other.duration_s
        return VariantStats(
            self.units + other.units,
            merge("ratios", self.ratios, other.ratios),
            merge("cuped", self.cuped, other.cuped),
            merge("histograms", self.histograms, other.histograms),
            merge("request_sumsq", self.request_sumsq, other.request_sumsq),
            duration,
            merge("samples", self.samples, other.samples),
        )

    def design_effect(self, latency: str) -> float:
        """Clustered / naive variance of the request-level mean (≥ 1); 1 when unknown."""
        r = self.ratios.get(latency)
        sumsq = self.request_sumsq.get(latency)
        if r is None or sumsq is None or r.sum_y < 2:
            return 1.0
        naive = (sumsq - r.sum_x**2 / r.sum_y) / (r.sum_y - 1) / r.sum_y
        clustered = r.mean_variance
        if not (naive > 0 and math.isfinite(clustered)):
            return 1.0
        return max(1.0, clustered / naive)


def _column(units: Any, name: str) -> Array:
    try:
        col = units[name]
    except KeyError:
        raise ValueError(f"per-unit aggregates lack column {name!r}") from None
    return np.asarray(col, dtype=float)


def _has(units: Any, name: str) -> bool:
    return name in (units.columns if hasattr(units, "columns") else units)


def variant_stats_from_units(
    units: Any,
    *,
    histograms: Mapping[str, Mapping[str, HistogramStats]] | None = None,
    durations: Mapping[str, float] | None = None,
    cuped: bool = True,
    custom: Sequence[CustomMetric] = (),
) -> dict[str, VariantStats]:
    """Per-variant sufficient statistics from per-unit rows (``variant`` column + UNIT_COLUMNS).

    ``custom``: the experiment's own metrics (``spec.custom``); each reads the per-unit
    columns :func:`custom_columns` names. Histograms of a custom quantile are keyed by the
    metric's name in ``histograms[variant]``.
    """
    labels, codes = np.unique(_labels(units["variant"]), return_inverse=True)
    groups = _group_stats(units, codes, labels.size, cuped=cuped, custom=custom)
    return {
        str(label): VariantStats(
            **groups[i],
            histograms=dict((histograms or {}).get(str(label), {})),
            duration_s=(durations or {}).get(str(label)),
        )
        for i, label in enumerate(labels)
    }


def segment_stats_from_units(
    rows: Any,
    *,
    column: str = "segment",
    names: Sequence[str] | None = None,
    variants: Sequence[str] | None = None,
    cuped: bool = True,
    custom: Sequence[CustomMetric] = (),
) -> dict[str, dict[str, VariantStats]]:
    """Segment value → variant → statistics, from per-(variant, unit, value) rows, in one
    pass over the rows (each (value, variant) pair is one ``bincount`` group).

    ``rows[column]`` holds the value (or, with ``names``, its index into ``names``);
    ``rows["variant"]`` the variant (or, with ``variants``, its index). Integer codes from
    the store skip sorting strings. Pairs without rows are left out.
    """
    seg_codes, seg_labels = _codes(rows[column], names)
    var_codes, var_labels = _codes(rows["variant"], variants)
    k = var_labels.size
    groups = _group_stats(rows, seg_codes * k + var_codes, seg_labels.size * k, cuped=cuped, custom=custom)
    out: dict[str, dict[str, VariantStats]] = {}
    for g, parts in enumerate(groups):
        if parts["units"] > 0:
            out.setdefault(str(seg_labels[g // k]), {})[str(var_labels[g % k])] = VariantStats(**parts)
    return out


def _labels(values: Any) -> NDArray[Any]:
    arr: NDArray[Any] = np.asarray(values)
    return arr.astype(str) if arr.dtype == object else arr


def _codes(values: Any, names: Sequence[str] | None) -> tuple[NDArray[np.intp], NDArray[Any]]:
    """(code per row, label per code): ``values`` are indices into ``names`` when given."""
    if names is not None:
        return np.asarray(values, dtype=np.intp), np.asarray(list(names), dtype=object)
    labels, codes = np.unique(_labels(values), return_inverse=True)
    return codes, labels


class _GroupParts(TypedDict):
    """The VariantStats fields that come from unit rows."""

    units: float
    ratios: dict[str, RatioStats]
    cuped: dict[str, CupedStats]
    request_sumsq: dict[str, float]
    samples: dict[str, SampleStats]


def _cuped_sums(mat: Array, s: Callable[[Array], Array]) -> tuple[Array, Array]:
    """Per group: Σ of each of x, y, px, py (rows of ``mat``) and the 4×4 Σ(a·b), as
    (4 × k, 4 × 4 × k) arrays."""
    first = np.vstack([s(row) for row in mat])
    cross = np.stack([[s(a * b) for b in mat] for a in mat])
    return first, cross


def _group_stats(units: Any, codes: NDArray[np.intp], k: int, *, cuped: bool, custom: Sequence[CustomMetric]) -> list[_GroupParts]:
    """Per group (``codes`` in ``range(k)``): the VariantStats fields that come from unit rows."""
    count = np.bincount(codes, minlength=k).astype(float)
    cols = {c: _column(units, c) for c in UNIT_COLUMNS if c not in OPTIONAL_COLUMNS or _has(units, c)}

    def s(v: Array) -> Array:
        # bincount with weights sums in float64 (the stubs say int)
        return np.asarray(np.bincount(codes, weights=v, minlength=k), dtype=np.float64)

    pairs = {m.name: (m.numerator, m.denominator) for m in METRICS.values() if m.kind != "quantile"}
    pairs["coverage"] = ("labeled", "requests")
    sums: dict[str, tuple[Array, ...]] = {}
    for name, (xn, yn) in pairs.items():
        x, y = cols[xn], cols[yn]
        sums[name] = (s(x), s(x * x), s(y), s(y * y), s(x * y))

    # metric → (units per group, per-group sums, per-group cross-products)
    cuped_sums: dict[str, tuple[Array, Array, Array]] = {}
    if cuped:
        for name, (xn, yn) in pairs.items():
            if name != "coverage" and _has(units, f"pre_{xn}") and _has(units, f"pre_{yn}"):
                m = np.vstack([cols[xn], cols[yn], _column(units, f"pre_{xn}"), _column(units, f"pre_{yn}")])
                # a group without pre-period denominator has no covariate: left out
                cuped_sums[name] = (count, *_cuped_sums(m, s))

    sumsq = {lat: s(cols[f"{lat}_sq"]) for lat in HISTOGRAM_SOURCES if f"{lat}_sq" in cols}
    samples: dict[str, tuple[Array, ...]] = {}
    for cm in custom:
        cc = custom_columns(cm)
        x, y = _column(units, cc["x"]), _column(units, cc["y"])
        sums[cm.name] = (s(x), s(x * x), s(y), s(y * y), s(x * y))
        if "sq" in cc:
            sumsq[cm.name] = s(_column(units, cc["sq"]))
        pre = ("pre_x", "pre_y") if "pre_x" in cc else ("cov_x", "cov_y") if "cov_x" in cc else None
        px = py = None
        if pre and cuped:
            px, py = _column(units, cc[pre[0]]), _column(units, cc[pre[1]])
        if cm.aggregation == "request":
            if px is not None and py is not None:
                cuped_sums[cm.name] = (count, *_cuped_sums(np.vstack([x, y, px, py]), s))
            continue
        # one value per unit: its mean over requests with a value (units without one drop
        # out), or its total (every unit counts, zero when it has none)
        keep = (y > 0).astype(float) if cm.aggregation == "unit_mean" else np.ones_like(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(y > 0, x / y, 0.0) if cm.aggregation == "unit_mean" else x
        samples[cm.name] = (s(keep), s(v * keep), s(v * v * keep))
        if px is not None and py is not None:
            # the covariate on the same scale; a unit without pre-period/covariate data gets 0
            with np.errstate(divide="ignore", invalid="ignore"):
                c = np.where(py > 0, px / py, 0.0) if cm.aggregation == "unit_mean" else px
            cuped_sums[cm.name] = (s(keep), *_cuped_sums(np.vstack([v, keep, c, keep]) * keep, s))
    out: list[_GroupParts] = []
    for i in range(k):
        out.append({
            "units": float(count[i]),
            "ratios": {name: RatioStats(count[i], *(float(a[i]) for a in arrs)) for name, arrs in sums.items()},
            "cuped": {
                name: CupedStats.from_moments(float(n[i]), first[:, i], cross[:, :, i])
                for name, (n, first, cross) in cuped_sums.items()
                if n[i] > 0 and first[3, i] > 0
            },
            "request_sumsq": {lat: float(v[i]) for lat, v in sumsq.items()},
            "samples": {name: SampleStats(*(float(a[i]) for a in arrs)) for name, arrs in samples.items()},
        })
    return out
