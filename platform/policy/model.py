"""The versioned model of an ``slo_router``: what it predicts per arm and context, fitted from
logged requests. Pure: arrays in, a JSON-serializable :class:`PolicyModel` out.

**Contexts.** The policy's features are binned once, from the pooled logs: a token count into
up to ``n_bins`` quantile bins (plus one for "absent"), an attribute into its most frequent
values (plus "other or absent"). A context is one cell of the product (:class:`Binning`).

**Predictions** per arm and cell (binned empirical statistics, shrunk toward the arm's pooled
value with ``prior`` pseudo-observations, so a sparse cell borrows from its arm):

- each SLO's latency statistic: the empirical quantile it names (``<latency>_p95``: the 95th
  percentile of the cell's values of that latency) or the mean (``<latency>``);
- the objective: the mean of its per-request value over requests that have one (a label).

**Choice** per cell: the best predicted objective among arms whose every predicted latency
meets its bound; when none does, the arm with the smallest worst ratio of prediction to bound.
The table of choices is part of the model, so a decision is a lookup (:mod:`.evaluate`).

**Version**: the first 16 hex digits of the SHA-256 of the model's canonical JSON (which
holds the policy's content hash), so a logged ``policy_version`` names exactly one model and
the propensity of any logged request can be recomputed from its features.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .spec import SloRouter, is_numeric

MODEL_SCHEMA = 1
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
MAX_CELLS = 512


class NotEnoughData(ValueError):
    """The logs cannot fit a model yet (an arm has too few requests); keep the previous one."""


# --------------------------------------------------------------------------- binning


@dataclass(frozen=True, slots=True)
class Binning:
    """Features → cell index. Numeric feature: bin ``searchsorted(edges, x, 'right')``, the
    last bin for an absent value; attribute: the index of its value among ``values``, the
    last for any other value or an absent one."""

    features: tuple[str, ...]
    edges: tuple[tuple[float, ...] | None, ...]
    values: tuple[tuple[str, ...] | None, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(e) + 2 if e is not None else len(v or ()) + 1 for e, v in zip(self.edges, self.values))

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.sizes, dtype=np.int64)) if self.features else 1

    def strides(self) -> tuple[int, ...]:
        out, step = [], 1
        for size in reversed(self.sizes):
            out.append(step)
            step *= size
        return tuple(reversed(out))

    def cells(self, columns: Mapping[str, Any], n: int) -> Ints:
        """Cell of each of ``n`` requests; ``columns``: feature → array (numbers with NaN for
        absent; attributes as strings with None or "" for absent). A missing column is absent."""
        cell = np.zeros(n, dtype=np.int64)
        for feature, edges, values, stride in zip(self.features, self.edges, self.values, self.strides()):
            raw = columns.get(feature)
            if edges is not None:
                x = np.full(n, np.nan) if raw is None else np.asarray(raw, dtype=float)
                idx = np.searchsorted(np.asarray(edges, dtype=float), x, side="right").astype(np.int64)
                idx[np.isnan(x)] = len(edges) + 1
            else:
                known = values or ()
                lookup = {v: i for i, v in enumerate(known)}
                other = len(known)
                if raw is None:
                    idx = np.full(n, other, dtype=np.int64)
                else:
                    arr = np.asarray(raw, dtype=object)
                    uniq, inv = np.unique(arr.astype(str), return_inverse=True)
                    idx = np.array([lookup.get(str(u), other) for u in uniq], dtype=np.int64)[inv.reshape(-1)]
            cell += idx * stride
        return cell

    def describe(self, cell: int) -> dict[str, str]:
        """A cell as readable ranges (for support warnings)."""
        out = {}
        for feature, edges, values, stride, size in zip(self.features, self.edges, self.values, self.strides(), self.sizes):
            i = (cell // stride) % size
            if edges is not None:
                if i == len(edges) + 1:
                    out[feature] = "absent"
                else:
                    lo = -math.inf if i == 0 else edges[i - 1]
                    hi = math.inf if i == len(edges) else edges[i]
                    out[feature] = f"[{lo:g}, {hi:g})"
            else:
                known = values or ()
                out[feature] = known[i] if i < len(known) else "(other)"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features),
                "edges": [list(e) if e is not None else None for e in self.edges],
                "values": [list(v) if v is not None else None for v in self.values]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Binning:
        return cls(tuple(data["features"]),
                   tuple(tuple(float(x) for x in e) if e is not None else None for e in data["edges"]),
                   tuple(tuple(str(x) for x in v) if v is not None else None for v in data["values"]))

    @classmethod
    def fit(cls, features: Sequence[str], columns: Mapping[str, Any], n: int, *, n_bins: int = 4,
            max_values: int = 8) -> Binning:
        """Quantile edges of each token count and the most frequent values of each attribute,
        from the pooled logs (features only, never outcomes, so any fold may share it)."""
        edges: list[tuple[float, ...] | None] = []
        values: list[tuple[str, ...] | None] = []
        for feature in features:
            raw = columns.get(feature)
            if is_numeric(feature):
                x = np.full(n, np.nan) if raw is None else np.asarray(raw, dtype=float)
                x = x[~np.isnan(x)]
                distinct = np.unique(x)
                if distinct.size <= n_bins:  # few levels: each its own bin
                    qs = distinct[1:]
                else:
                    qs = np.quantile(x, np.linspace(0, 1, n_bins + 1)[1:-1])
                edges.append(tuple(float(q) for q in np.unique(qs)))
                values.append(None)
            else:
                arr = np.asarray([] if raw is None else raw, dtype=object)
                present = arr[[v is not None and v == v and str(v) != "" for v in arr]] if arr.size else arr
                uniq, counts = np.unique(present.astype(str), return_counts=True) if present.size else (np.array([]), np.array([]))
                top = [str(u) for u, _ in sorted(zip(uniq, counts), key=lambda t: (-t[1], t[0]))[:max_values]]
                edges.append(None)
                values.append(tuple(sorted(top)))
        out = cls(tuple(features), tuple(edges), tuple(values))
        while out.n_cells > MAX_CELLS and any(e for e in out.edges if e):  # coarsen token bins first
            widest = max((i for i, e in enumerate(out.edges) if e), key=lambda i: len(out.edges[i] or ()))
            e = out.edges[widest] or ()
            shrunk = tuple(e[1::2]) if len(e) > 1 else ()
            out = cls(out.features, tuple(shrunk if i == widest else x for i, x in enumerate(out.edges)), out.values)
        return out

    def cell_of(self, features: Mapping[str, Any]) -> int:
        """The cell of one request (scalar path of :meth:`cells`, for the per-request decision)."""
        cell = 0
        for feature, edges, values, stride in zip(self.features, self.edges, self.values, self.strides()):
            x = features.get(feature)
            if edges is not None:
                if x is None or isinstance(x, str) or x != x:
                    i = len(edges) + 1
                else:
                    i = bisect.bisect_right(edges, float(x))
            else:
                known = values or ()
                i = known.index(str(x)) if x is not None and str(x) in known else len(known)
            cell += i * stride
        return cell


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class PolicyModel:
    """Per arm and cell: predicted SLO statistics and objective, request counts, and the
    choice per cell. ``latency[s][k][c]``, ``objective[k][c]``, ``counts[k][c]``, ``choice[c]``."""

    policy_hash: str
    arms: tuple[str, ...]
    binning: Binning
    slo_keys: tuple[str, ...]
    slo_bounds: tuple[float, ...]
    lower_is_better: bool
    latency: tuple[tuple[tuple[float, ...], ...], ...]
    objective: tuple[tuple[float, ...], ...]
    counts: tuple[tuple[int, ...], ...]
    choice: tuple[int, ...]
    trained_on: int

    def payload(self) -> dict[str, Any]:
        return {
            "schema": MODEL_SCHEMA, "policy_hash": self.policy_hash, "arms": list(self.arms),
            "binning": self.binning.to_dict(), "slo": dict(zip(self.slo_keys, self.slo_bounds)),
            "lower_is_better": self.lower_is_better,
            "latency": {k: [[_round(v) for v in row] for row in rows] for k, rows in zip(self.slo_keys, self.latency)},
            "objective": [[_round(v) for v in row] for row in self.objective],
            "counts": [list(row) for row in self.counts], "choice": list(self.choice), "trained_on": self.trained_on,
        }

    @property
    def version(self) -> str:
        return hashlib.sha256(_canonical(self.payload()).encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return _canonical({**self.payload(), "version": self.version})

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> PolicyModel:
        data = json.loads(text) if isinstance(text, str) else dict(text)
        if data.get("schema") != MODEL_SCHEMA:
            raise ValueError(f"policy model schema {data.get('schema')!r}; this version reads {MODEL_SCHEMA}")
        slo = dict(data["slo"])
        model = cls(
            policy_hash=str(data["policy_hash"]), arms=tuple(data["arms"]), binning=Binning.from_dict(data["binning"]),
            slo_keys=tuple(slo), slo_bounds=tuple(float(v) for v in slo.values()),
            lower_is_better=bool(data["lower_is_better"]),
            latency=tuple(tuple(tuple(_num(v) for v in row) for row in data["latency"][k]) for k in slo),
            objective=tuple(tuple(_num(v) for v in row) for row in data["objective"]),
            counts=tuple(tuple(int(v) for v in row) for row in data["counts"]),
            choice=tuple(int(c) for c in data["choice"]), trained_on=int(data["trained_on"]),
        )
        if "version" in data and data["version"] != model.version:
            raise ValueError(f"policy model {data['version']!r} does not match its content (version {model.version})")
        return model


def _round(v: float) -> float | None:
    """12 significant digits: the JSON (and so the version) is the same on every platform."""
    return None if not math.isfinite(v) else float(f"{v:.12g}")


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def choose(latency: Floats, objective: Floats, bounds: Floats, lower_is_better: bool) -> Ints:
    """The choice per cell. ``latency``: S × K × C predictions, ``objective``: K × C,
    ``bounds``: S. Ties go to the first arm."""
    ratio = np.max(latency / bounds[:, None, None], axis=0) if latency.size else np.zeros(objective.shape)  # K × C
    feasible = ratio <= 1.0
    score = -objective if lower_is_better else objective.copy()
    score = np.where(feasible & ~np.isnan(score), score, -np.inf)
    best = np.argmax(score, axis=0)
    none_ok = ~np.isfinite(np.max(score, axis=0))
    fallback = np.argmin(np.where(np.isnan(ratio), np.inf, ratio), axis=0)
    return np.where(none_ok, fallback, best).astype(np.int64)


def fit_model(
    policy: SloRouter,
    arm: Ints,
    features: Mapping[str, Any],
    latencies: Mapping[str, Floats],
    objective: Floats,
    *,
    lower_is_better: bool,
    n_bins: int = 4,
    prior: float = 20.0,
    min_arm: int = 30,
    binning: Binning | None = None,
) -> PolicyModel:
    """Fit the router's model from logged requests.

    ``arm``: index into ``policy.arms`` of each request's arm (−1: not one of them, ignored);
    ``features``: feature → array; ``latencies``: latency field → array (NaN: absent);
    ``objective``: the objective's per-request value (NaN: unlabelled). Raises
    :class:`NotEnoughData` when an arm has fewer than ``min_arm`` requests with a latency or
    with an objective value."""
    arm = np.asarray(arm, dtype=np.int64)
    n = arm.size
    names = policy.arm_names
    k = len(names)
    binning = binning or Binning.fit(policy.features, features, n, n_bins=n_bins)
    cell = binning.cells(features, n)
    c = binning.n_cells
    objective = np.asarray(objective, dtype=float)
    slos = policy.slos()
    lat_pred = np.full((len(slos), k, c), np.nan)
    obj_pred = np.full((k, c), np.nan)
    counts = np.zeros((k, c), dtype=np.int64)
    mine = (arm >= 0) & (arm < k)
    for a in range(k):
        rows = mine & (arm == a)
        counts[a] = np.bincount(cell[rows], minlength=c)
        has_obj = rows & ~np.isnan(objective)
        if has_obj.sum() < min_arm:
            raise NotEnoughData(f"arm {names[a]!r} has {int(has_obj.sum())} requests with {policy.objective}; "
                                f"the model needs {min_arm}")
        pooled = float(objective[has_obj].mean())
        s = np.bincount(cell[has_obj], weights=objective[has_obj], minlength=c)
        m = np.bincount(cell[has_obj], minlength=c)
        obj_pred[a] = (s + prior * pooled) / (m + prior)
        for si, slo in enumerate(slos):
            values = np.asarray(latencies.get(slo.latency, np.full(n, np.nan)), dtype=float)
            has = rows & ~np.isnan(values)
            if has.sum() < min_arm:
                raise NotEnoughData(f"arm {names[a]!r} has {int(has.sum())} requests with {slo.latency}; "
                                    f"the model needs {min_arm}")
            lat_pred[si, a] = _cell_stat(values[has], cell[has], c, slo.quantile, prior)
    bounds = np.array([s.max_ms for s in slos], dtype=float)
    choice = choose(lat_pred, obj_pred, bounds, lower_is_better)
    return PolicyModel(
        policy_hash=policy.content_hash, arms=names, binning=binning,
        slo_keys=tuple(s.key for s in slos), slo_bounds=tuple(float(b) for b in bounds),
        lower_is_better=lower_is_better,
        latency=tuple(tuple(tuple(_round_f(v) for v in row) for row in rows) for rows in lat_pred),
        objective=tuple(tuple(_round_f(v) for v in row) for row in obj_pred),
        counts=tuple(tuple(int(v) for v in row) for row in counts),
        choice=tuple(int(x) for x in choice), trained_on=int(mine.sum()),
    )


def _round_f(v: float) -> float:
    r = _round(float(v))
    return math.nan if r is None else r


def _cell_stat(values: Floats, cell: Ints, c: int, quantile: float | None, prior: float) -> Floats:
    """Per cell: the quantile (or mean) of ``values``, shrunk toward the pooled one by
    ``n / (n + prior)``."""
    if quantile is None:
        pooled = float(values.mean())
        s = np.bincount(cell, weights=values, minlength=c)
        m = np.bincount(cell, minlength=c)
        return np.asarray((s + prior * pooled) / (m + prior), dtype=float)
    pooled = float(np.quantile(values, quantile))
    out = np.full(c, pooled)
    order = np.lexsort((values, cell))
    sv, sc = values[order], cell[order]
    starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
    ends = np.r_[starts[1:], sc.size]
    for a, b in zip(starts, ends):
        n = b - a
        q = float(np.quantile(sv[a:b], quantile))
        w = n / (n + prior)
        out[sc[a]] = w * q + (1 - w) * pooled
    return out
