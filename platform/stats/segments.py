"""Results sliced by a dimension: per-segment comparisons, their correction, heterogeneity.

``segment_breakdown(spec, per_segment)`` runs the engine's own test (:func:`engine.
compare_metric`, so CUPED, sequential inference and the metric's aggregation apply as in the
overall rows) on each value of each dimension.

Multiple testing: one family per (dimension, metric, variant) — the question "in which
segments does this treatment move this metric?" — corrected with ``spec.correction``
(Holm by default, so the chance of any false segment call within a family stays ≤ α).
Families are not pooled across metrics or dimensions: those are different questions,
already corrected at the top level, and pooling them would make a segment call depend on
how many other metrics were reported.

Heterogeneity: Cochran's Q over the per-segment absolute effects d_i with weights
w_i = 1/se_i², Q = Σ w_i (d_i − d̄_w)², compared with χ² on k − 1 degrees of freedom
(k segments with a usable comparison); flagged when p < α. It uses the fixed-horizon
standard errors, the inverse-variance meta-analysis test. Segments overlap when a unit's
requests span values, which makes Q mildly conservative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dist
from .corrections import adjust

if TYPE_CHECKING:  # the engine imports this module
    from .aggregates import VariantStats
    from .spec import ExperimentSpec


def cochran_q(effects: list[float], ses: list[float]) -> tuple[float, int, float]:
    """(Q, df, p) of Cochran's homogeneity test; NaN with fewer than two usable effects."""
    d = np.asarray(effects, dtype=float)
    se = np.asarray(ses, dtype=float)
    ok = np.isfinite(d) & np.isfinite(se) & (se > 0)
    d, se = d[ok], se[ok]
    k = int(d.size)
    if k < 2:
        return math.nan, max(k - 1, 0), math.nan
    w = 1.0 / se**2
    mean = float((w * d).sum() / w.sum())
    q = float((w * (d - mean) ** 2).sum())
    return q, k - 1, float(_dist.chi2_sf(q, k - 1))


def segment_breakdown(
    spec: ExperimentSpec, per_segment: Mapping[str, Mapping[str, Mapping[str, VariantStats]]]
) -> list[dict[str, Any]]:
    from .engine import arm_estimate, compare_metric, empty_variant

    out = []
    for dimension, by_value in per_segment.items():
        rows: list[dict[str, Any]] = []
        families: dict[tuple[str, str], list[dict[str, Any]]] = {}
        effects: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for value, stats in by_value.items():
            stats = {v.key: stats.get(v.key) or empty_variant(spec.custom) for v in spec.variants}
            control = stats[spec.control]
            for name in spec.metrics:
                m = spec.metric_def(name)
                for v in spec.variants:
                    est, _, n, _ = arm_estimate(spec, m, stats[v.key])
                    row = {"value": value, "metric": name, "variant": v.key, "n": n, "estimate": est}
                    if v.key == spec.control:
                        row.update(abs_diff=None, rel_diff=None, rel_ci=[None, None], p_value=None, p_value_adjusted=None, se=None)
                    else:
                        c = compare_metric(spec, m, control, stats[v.key])
                        row.update(abs_diff=c.abs_diff, rel_diff=c.rel_diff, rel_ci=list(c.rel_ci), p_value=c.p_value, se=c.se)
                        families.setdefault((name, v.key), []).append(row)
                        d, s = effects.setdefault((name, v.key), ([], []))
                        d.append(c.abs_diff)
                        s.append(c.se)
                    rows.append(row)
        heterogeneity = []
        for (name, variant), family in families.items():
            for row, p in zip(family, adjust([r["p_value"] for r in family], spec.correction)):
                row["p_value_adjusted"] = p
            q, df, p = cochran_q(*effects[(name, variant)])
            heterogeneity.append({
                "metric": name, "variant": variant, "q": q, "df": df, "p_value": p,
                "flagged": bool(math.isfinite(p) and p < spec.alpha),
            })
        out.append({"dimension": dimension, "rows": rows, "heterogeneity": heterogeneity})
    return out
