"""Paired analysis of shadow requests (issue 34): each shadow compared with its own primary.

A shadow request mirrors a live (primary) request to a candidate strategy; its answer is
never returned. Its own inference event names the primary (``shadow_of``), so every shadow
gives one *pair* — the same request served twice — and the comparison is within pairs:
per-request differences d = shadow − primary, which take the request's own difficulty out
of the variance.

Per (variant of the primary, metric):

- the paired t-test on d (``scipy.stats.ttest_rel``): mean difference, its interval and
  two-sided p-value, fixed-horizon;
- for latencies, whose differences are skewed, two rank tests beside it: the sign test
  (``scipy.stats.binomtest`` on the number of positive differences, p = ½) and the
  Wilcoxon signed-rank test (``scipy.stats.wilcoxon`` with its defaults: zero differences
  dropped, exact null distribution for at most 50 pairs without ties or zeros, the exact
  sign-flip permutation distribution for at most 13 pairs with ties or zeros, else the
  normal approximation with the tie correction and no continuity correction);
- coverage: the variant's requests, how many were chosen for a shadow, sent, dropped (the
  shadow cap was full), how many got a shadow event, how many of those failed, and shadow
  events whose primary is not (yet) among the variant's requests.

Which pairs a metric reads: both sides must have a value of its source. For sources that
measure the request (latencies, tokens, cost, device seconds, ``measures.*``) a pair where
either side failed (``error`` set) is left out: a failed request's latency measures the
failure, which ``error_rate`` and the coverage's ``failed`` count report. Labels
(``accuracy``, ``score``) need both sides graded; ``error_rate`` and ``goodput`` read every
pair.

Pure: arrays in, numbers out; the two data paths (the store's SQL and ``ablab analyze``'s
numpy) build the same :class:`ShadowPairs`, so the JSON is the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ablab.platform import fields

from . import _dist
from .corrections import adjust
from .custom_metric import CUSTOM_METRIC_TYPES
from .metrics import MEASURE_PREFIX

NAN = math.nan
RANK_TEST_METRICS: tuple[str, ...] = fields.RANK_TESTED
# sources that measure the request itself: compared only where both sides succeeded
MEASURED_SOURCES = frozenset(fields.INFERENCE_FIELDS)
EXACT_MAX_PAIRS = 50  # scipy.stats.wilcoxon(method="auto"): exact up to 50 pairs without ties or zeros
PERMUTATION_MAX_PAIRS = 13  # … and the exact sign-flip permutation test up to 13 pairs with them
COVERAGE_KEYS = ("requests", "chosen", "sent", "dropped", "shadowed", "failed", "orphaned")
REQUEST_COUNTS = ("requests", "chosen", "sent", "dropped")


# ---------------------------------------------------------------- the tests


@dataclass(frozen=True, slots=True)
class PairedT:
    n: int
    mean: float
    sd: float
    ci: tuple[float, float]
    p_value: float


def paired_t(d: NDArray[Any], *, alpha: float = 0.05) -> PairedT:
    """The paired t-test on differences ``d`` (``scipy.stats.ttest_rel(shadow, primary)`` and
    its ``confidence_interval(1 - alpha)``). Fewer than two pairs: no p-value nor interval.
    Differences without variance: the interval is the difference itself, p = 0 when it is
    not zero (every pair moved by the same amount, as scipy says) and none when it is."""
    d = np.asarray(d, dtype=float)
    n = int(d.size)
    if n == 0:
        return PairedT(0, NAN, NAN, (NAN, NAN), NAN)
    mean = float(np.mean(d))
    if n < 2:
        return PairedT(n, mean, NAN, (NAN, NAN), NAN)
    sd = float(np.std(d, ddof=1))
    se = sd / math.sqrt(n)
    if not se > 0:
        return PairedT(n, mean, sd, (mean, mean), 0.0 if mean != 0 else NAN)
    t = mean / se
    p = float(2 * _dist.t_sf(abs(t), n - 1))
    half = float(_dist.t_ppf(1 - alpha / 2, n - 1)) * se
    return PairedT(n, mean, sd, (mean - half, mean + half), min(p, 1.0))


def sign_test(d: NDArray[Any]) -> float:
    """Two-sided sign test: zero differences dropped, the positive ones ~ Binomial(n, ½)
    (``scipy.stats.binomtest(k, n).pvalue``). NaN without a non-zero difference."""
    d = np.asarray(d, dtype=float)
    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    n = pos + neg
    if n == 0:
        return NAN
    k = min(pos, neg)
    if 2 * k == n:
        return 1.0
    return min(1.0, 2 * _dist.binom_cdf(k, n, 0.5))


def _average_ranks(a: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
    """Ranks 1..n of ``a`` with ties given their average rank; and the tie group sizes."""
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts).astype(float)
    return (ends - (counts - 1) / 2.0)[inverse], counts


def _signed_rank_counts(n: int) -> NDArray[Any]:
    """How many of the 2^n sign patterns give each rank sum W+ = 0..n(n+1)/2 (no ties)."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for k in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[k:] = counts[:-k]
        counts = counts + shifted
    return counts


def wilcoxon_signed_rank(d: NDArray[Any]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of differences ``d``, as
    ``scipy.stats.wilcoxon(shadow, primary)`` gives it with its defaults (zero differences
    dropped; the method chosen as ``method="auto"`` chooses it). NaN without a non-zero
    difference."""
    d = np.asarray(d, dtype=float)
    total = int(d.size)
    nz = d[d != 0]
    n = int(nz.size)
    if n == 0:
        return NAN
    ranks, ties = _average_ranks(np.abs(nz))
    r_plus = float(ranks[nz > 0].sum())
    tied = bool((ties > 1).any())
    if total <= EXACT_MAX_PAIRS and not tied and n == total:
        counts = _signed_rank_counts(n)
        whole = 2.0 ** n
        sf = counts[int(math.floor(r_plus)):].sum() / whole
        cdf = counts[:int(math.ceil(r_plus)) + 1].sum() / whole
        return float(min(1.0, max(0.0, 2 * min(sf, cdf))))
    if total <= PERMUTATION_MAX_PAIRS:
        # every sign flip of the differences (a zero stays zero and adds nothing), equally likely
        flips = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
        null = flips @ ranks
        gamma = abs(np.finfo(float).eps * 100 * r_plus)
        less = float(np.count_nonzero(null <= r_plus + gamma)) / null.size
        greater = float(np.count_nonzero(null >= r_plus - gamma)) / null.size
        return float(min(1.0, 2 * min(less, greater)))
    mean = n * (n + 1) / 4.0
    var = (n * (n + 1) * (2 * n + 1) - float(np.sum(ties.astype(float) ** 3 - ties)) / 2.0) / 24.0
    if not var > 0:
        return NAN
    z = (r_plus - mean) / math.sqrt(var)
    return float(min(1.0, 2 * _dist.norm_sf(abs(z))))


# ---------------------------------------------------------------- which metrics


@dataclass(frozen=True, slots=True)
class ShadowMetric:
    name: str
    source: str  # the per-request source (unit_agg's sources: a field, measures.<name>, score, correct, error, good)
    kind: str  # mean | proportion
    lower_is_better: bool
    custom: bool = False

    @property
    def rank_tests(self) -> bool:
        return not self.custom and self.name in RANK_TEST_METRICS

    @property
    def success_only(self) -> bool:
        return self.source in MEASURED_SOURCES or self.source.startswith(MEASURE_PREFIX)


BUILTIN_SHADOW_METRICS: tuple[ShadowMetric, ...] = (
    *(ShadowMetric(name, name, "mean", fields.lower_is_better(name)) for name in fields.PAIRED_FIELDS),
    ShadowMetric("accuracy", "correct", "proportion", False),
    ShadowMetric("score", "score", "mean", False),
    ShadowMetric("error_rate", "error", "proportion", True),
    ShadowMetric("goodput", "good", "proportion", False),
)
"""The catalogue's paired fields (in its order), then the label and outcome metrics."""


def shadow_metrics(spec: Any) -> tuple[ShadowMetric, ...]:
    """The built-in per-request metrics, then every custom metric that is one value per
    request (``mean`` or ``proportion`` over a column); a custom metric with a built-in's
    name here replaces it. Ratios and quantiles are not per-request differences."""
    custom = [
        ShadowMetric(m.name, m.column, m.kind, m.prefers_lower, custom=True)
        for m in getattr(spec, "custom", ()) or ()
        if isinstance(m, CUSTOM_METRIC_TYPES) and m.kind in ("mean", "proportion") and m.column
    ]
    taken = {m.name for m in custom}
    return (*(m for m in BUILTIN_SHADOW_METRICS if m.name not in taken), *custom)


def shadow_sources(spec: Any) -> tuple[str, ...]:
    """Every per-request source the paired analysis reads (``error`` always: it filters)."""
    return tuple(dict.fromkeys(["error", *(m.source for m in shadow_metrics(spec))]))


# ---------------------------------------------------------------- the pairs and the rows


@dataclass(eq=False)
class ShadowPairs:
    """One entry per shadow request of the experiment (both data paths build this).

    ``variant``: its primary's variant (the shadow's own where no primary was found);
    ``paired``: its primary was found among the variant's requests; ``primary_key``: an id of
    the primary (counts the primaries that got a shadow); ``primary`` / ``shadow``: per source
    (:func:`shadow_sources`), the two requests' values (NaN: absent, or no primary);
    ``requests``: per variant, :data:`REQUEST_COUNTS` over the variant's requests.
    """

    variant: NDArray[Any]
    paired: NDArray[Any]
    primary_key: NDArray[Any]
    primary: dict[str, NDArray[Any]]
    shadow: dict[str, NDArray[Any]]
    requests: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether the experiment has shadow activity: a shadow event or a primary chosen for one."""
        return bool(self.variant.size) or any(c.get("chosen", 0) for c in self.requests.values())


def coverage(pairs: ShadowPairs, variant: str) -> dict[str, int]:
    mine = pairs.variant == variant
    paired = mine & pairs.paired
    counts = pairs.requests.get(variant, {})
    return {
        **{k: int(counts.get(k, 0)) for k in REQUEST_COUNTS},
        "shadowed": int(np.unique(pairs.primary_key[paired]).size),
        "failed": int(np.count_nonzero(pairs.shadow["error"][paired] > 0)),
        "orphaned": int(np.count_nonzero(mine & ~pairs.paired)),
    }


def _differences(pairs: ShadowPairs, m: ShadowMetric, paired: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
    p, s = pairs.primary[m.source][paired], pairs.shadow[m.source][paired]
    ok = ~np.isnan(p) & ~np.isnan(s)
    if m.success_only:
        ok &= (pairs.primary["error"][paired] == 0) & (pairs.shadow["error"][paired] == 0)
    return p[ok], s[ok]


def metric_row(m: ShadowMetric, primary: NDArray[Any], shadow: NDArray[Any], *, alpha: float) -> dict[str, Any]:
    """One (variant, metric) row from the metric's pairs (equal-length arrays)."""
    d = shadow - primary
    t = paired_t(d, alpha=alpha)
    return {
        "metric": m.name,
        "n_pairs": t.n,
        "primary_mean": float(np.mean(primary)) if t.n else NAN,
        "shadow_mean": float(np.mean(shadow)) if t.n else NAN,
        "mean_diff": t.mean,
        "sd_diff": t.sd,
        "ci": list(t.ci),
        "p_value": t.p_value,
        "p_value_adjusted": NAN,
        "sign_p_value": sign_test(d) if m.rank_tests else None,
        "wilcoxon_p_value": wilcoxon_signed_rank(d) if m.rank_tests else None,
        "method": "paired_t",
        "lower_is_better": m.lower_is_better,
        "custom": m.custom,
        "type": m.kind,
    }


def shadow_rows(spec: Any, pairs: ShadowPairs, *, alpha: float | None = None,
                correction: str | None = None) -> list[dict[str, Any]]:
    """The ``shadows`` rows: per variant with shadow activity (in the experiment's variant
    order) and per metric (:func:`shadow_metrics`), the paired comparison and the variant's
    coverage. ``p_value_adjusted``: the experiment's correction across these rows."""
    alpha = spec.alpha if alpha is None else alpha
    metrics = shadow_metrics(spec)
    rows: list[dict[str, Any]] = []
    for v in [v.key for v in spec.variants]:
        cov = coverage(pairs, v)
        if not (cov["chosen"] or cov["shadowed"] or cov["orphaned"]):
            continue
        paired = (pairs.variant == v) & pairs.paired
        for m in metrics:
            p, s = _differences(pairs, m, paired)
            rows.append({"variant": v, **metric_row(m, p, s, alpha=alpha), "coverage": dict(cov)})
    for r, adjusted in zip(rows, adjust([r["p_value"] for r in rows], correction or spec.correction)):
        r["p_value_adjusted"] = adjusted
    return rows


def empty_pairs(sources: Sequence[str]) -> ShadowPairs:
    zero = np.zeros(0)
    return ShadowPairs(np.array([], dtype=object), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64),
                       {s: zero for s in sources}, {s: zero for s in sources})


def requests_from_rows(rows: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, int]]:
    """Per-variant request counts from column arrays ``variant`` + :data:`REQUEST_COUNTS`."""
    return {str(v): {k: int(rows[k][i]) for k in REQUEST_COUNTS} for i, v in enumerate(rows["variant"])}
