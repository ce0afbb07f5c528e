"""The demo's live off-policy check (issue #33's must-show): what OPE estimates for "always
serve one arm of demo-llm's router", from the logged events, beside the measured value of the
fixed variant that serves the same strategy in the same experiment.

``test_up_demo.py`` asserts on :func:`ope_check`'s document and ``benchmarks/demo_ope_check.py``
prints it, so the numbers a report quotes are the ones the test holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

EXPERIMENT = "demo-llm"
ROUTER = "router"
CANDIDATE = "router.terse"  # the router's terse arm: terse-t0's strategy
FIXED = "terse-t0"
ESTIMATORS = ("ips", "snips", "dr")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def overlap(a: list[Any], b: list[Any]) -> bool:
    """Two closed intervals share a point (False when either bound is missing)."""
    if not all(_finite(x) for x in (*a, *b)):
        return False
    return max(a[0], b[0]) <= min(a[1], b[1])


def _side(estimate: Any, ci: list[Any], n: Any, units: Any = None) -> dict[str, Any]:
    width = ci[1] - ci[0] if all(_finite(x) for x in ci) else None
    return {"estimate": estimate, "ci": ci, "width": width, "n": n, "units": units}


def ope_check(api: httpx.Client, *, metric: str = "accuracy", experiment: str = EXPERIMENT,
              candidate: str = CANDIDATE, fixed: str = FIXED) -> dict[str, Any] | None:
    """OPE of ``{kind: fixed, arm: candidate}`` on ``metric`` beside ``fixed``'s measured row of
    the experiment's results. None while the candidate arm or the fixed variant has no
    request with a value yet (the route's 422, or no results row)."""
    r = api.post(f"/v1/experiments/{experiment}/ope", json={"policy": {"kind": "fixed", "arm": candidate}, "metric": metric})
    if r.status_code == 422:
        return None
    r.raise_for_status()
    ope = r.json()
    res = api.get(f"/v1/experiments/{experiment}/results")
    res.raise_for_status()
    row = next((m for m in res.json().get("metrics", []) if m["metric"] == metric and m["variant"] == fixed), None)
    logged = {a["arm"]: a for a in ope["logged"]}
    mine = logged.get(candidate)
    if row is None or not row.get("n") or mine is None or not mine["n"]:
        return None
    router_arms = {arm: a["n"] for arm, a in logged.items() if arm.startswith(f"{candidate.split('.')[0]}.")}
    return {
        "experiment": experiment, "metric": metric, "candidate": candidate, "fixed": fixed,
        "ope": {e: _side(ope[e]["estimate"], ope[e]["ci"], ope["n"], ope["units"]) for e in ESTIMATORS},
        "ess": ope["ess"], "mean_weight": ope.get("mean_weight"),
        "candidate_logged": _side(mine["estimate"], mine["ci"], mine["n"], mine["units"]),
        "router_arms": router_arms,
        "measured": _side(row["estimate"], row["ci"], row["n"], row.get("units")),
        "overlap": {e: overlap(ope[e]["ci"], row["ci"]) for e in ESTIMATORS},
        "support": ope["support"].get("unsupported_share"), "notes": ope["notes"],
    }


def router_choices(api: httpx.Client, *, experiment: str = EXPERIMENT, variant: str = ROUTER) -> dict[str, Any] | None:
    """The router's newest kept model as one row per ``prompt_tokens`` bin: its range, the arm
    it serves (with probability 1 − explore), and per arm the predicted TTFT p95, accuracy and
    the requests it was fitted on. None while the router has no model (uniform exploration)."""
    r = api.get(f"/v1/experiments/{experiment}/policy-models", params={"variant": variant})
    r.raise_for_status()
    items = r.json()["items"]
    if not items:
        return None
    version = items[0]["version"]
    r = api.get(f"/v1/experiments/{experiment}/policy-models", params={"variant": variant, "version": version})
    r.raise_for_status()
    model = r.json()["items"][0]["model"]
    arms = list(model["arms"])
    edges = model["binning"]["edges"][0] or []
    latency = next(iter(model["latency"].values()))  # the one SLO's predictions: arm × cell
    bins = []
    for cell, chosen in enumerate(model["choice"]):
        if cell > len(edges):
            rng = "absent"  # the request had no prompt_tokens
        else:
            lo = "-inf" if cell == 0 else f"{edges[cell - 1]:g}"
            hi = "inf" if cell == len(edges) else f"{edges[cell]:g}"
            rng = f"[{lo}, {hi})"
        bins.append({"prompt_tokens": rng, "choice": arms[chosen],
                     "ttft_p95": {a: latency[i][cell] for i, a in enumerate(arms)},
                     "accuracy": {a: model["objective"][i][cell] for i, a in enumerate(arms)},
                     "n": {a: model["counts"][i][cell] for i, a in enumerate(arms)}})
    return {"version": version, "trained_on": model.get("trained_on"), "bound_ms": next(iter(model["slo"].values())),
            "bins": bins}


def render_choices(choices: dict[str, Any]) -> str:
    lines = [f"router model {choices['version']} (trained on {choices['trained_on']} requests), "
             f"TTFT p95 bound {choices['bound_ms']:g} ms"]
    for b in choices["bins"]:
        if not sum(b["n"].values()):
            continue  # an empty bin (the absent one): the arm's pooled values, no evidence
        per_arm = ", ".join(f"{a}: p95 {b['ttft_p95'][a]:.0f} ms, acc {b['accuracy'][a]:.2f}, n {b['n'][a]}"
                            for a in b["n"])
        lines.append(f"  prompt_tokens {b['prompt_tokens']:<14} -> {b['choice']:<8} ({per_arm})")
    return "\n".join(lines)


def render(check: dict[str, Any]) -> str:
    """The check as a few lines of text: each estimator beside the measured fixed variant."""
    def fmt(side: dict[str, Any]) -> str:
        lo, hi = side["ci"]
        width = "?" if side["width"] is None else f"{side['width']:.4g}"
        return f"{side['estimate']:.4g} [{lo:.4g}, {hi:.4g}] (width {width}, n {side['n']})"

    lines = [f"{check['experiment']} {check['metric']}: OPE of always {check['candidate']} vs measured {check['fixed']}",
             f"  measured {check['fixed']:<8} {fmt(check['measured'])}",
             f"  logged   {check['candidate']:<8} {fmt(check['candidate_logged'])}  (its own requests, unweighted)"]
    for e in ESTIMATORS:
        lines.append(f"  OPE {e:<5}        {fmt(check['ope'][e])}  overlaps: {'yes' if check['overlap'][e] else 'NO'}")
    lines.append(f"  ess {check['ess']:.1f}, mean weight {check['mean_weight']}, router arms {check['router_arms']}, "
                 f"unsupported share {check['support']}")
    lines.extend(f"  note: {n}" for n in check["notes"])
    return "\n".join(lines)


def policy_events(outbox: Path, *, experiment: str = EXPERIMENT, variant: str = ROUTER) -> Iterator[dict[str, Any]]:
    """The policy variant's exposure and inference events in a gateway's outbox files; not its
    requests' shadows (``shadow_of``), which serve the shadow strategy, not an arm."""
    for path in sorted(outbox.rglob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            if event.get("experiment") == experiment and event.get("variant") == variant \
                    and event.get("type") in ("exposure", "inference") and not event.get("shadow_of"):
                yield event
