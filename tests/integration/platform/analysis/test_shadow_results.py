"""Shadow requests (issue 34) through the loader into real chDB: ``GET …/results`` (the store's
paired query over ``raw_events FINAL``) equals ``ablab analyze`` on the same event file,
``shadows`` included, by the raw scan and by the per-unit rollup; and a shadow graded by
feedback posted for its own trace id shows as the shadow's accuracy in the paired rows.

Events go through the loader's own steps: :func:`ablab.streaming.loader.rows.route` (the
validation and the row it stores: a shadow as ``type = 'shadow'``) and its insert plus
rollup feed. chDB allows one data directory per process, so the store side runs in a child.
"""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from ablab.platform.analytics.event_files import read_events
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab_testing import run_child_json
from ablab_testing.results import assert_same_results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
CUSTOM = [
    {"name": "tools", "type": "mean", "column": "measures.tool_calls"},
    {"name": "judge", "type": "mean", "column": "score"},
    {"name": "cost_per_1k_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
]
SPEC = {
    "key": "shadowed", "control": "c", "unit": "user",
    "variants": [{"key": "c", "weight": 1}, {"key": "t", "weight": 1}],
    "slos": {"ttft_ms": 150},
    "metrics": {"custom": CUSTOM},
}
# requests before start: CUPED's pre-period; their shadows are compared with nothing
SPEC_STARTED = {**SPEC, "start": (T0 + timedelta(seconds=40)).isoformat()}


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def shadow_events(seed: int = 7) -> list[dict]:
    """Two variants; 40 % of requests chosen for a shadow (a fifth of them dropped: the cap
    was full); shadows slower in t, failing now and then; labels for primaries and for
    shadows (by the shadow's own trace id), a relabel, scores, billing for a shadow; an
    orphan shadow and a redelivered one."""
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    for i in range(700):
        variant = "t" if i % 2 else "c"
        unit = f"u{rng.integers(80)}"
        ts = T0 + timedelta(milliseconds=250 * i)
        e2e = float(rng.lognormal(6.0, 0.5))
        ttft = e2e * float(rng.uniform(0.1, 0.3))
        out_tokens = int(rng.integers(2, 200))
        chosen = rng.random() < 0.4
        shadow = ("sent" if rng.random() < 0.8 else "dropped") if chosen else None
        base = {"v": 1, "type": "inference", "experiment": "shadowed", "variant": variant, "unit_id": unit,
                "price_version": "p1", "strategy": "s"}
        primary = {**base, "event_id": f"p{i}", "trace_id": f"p{i}", "ts": _iso(ts), "ttft_ms": ttft, "e2e_ms": e2e,
                   "tpot_ms": (e2e - ttft) / (out_tokens - 1), "prompt_tokens": int(rng.integers(20, 400)),
                   "output_tokens": out_tokens, "device_s": e2e / 1000, "cost_usd": 1e-5 * out_tokens,
                   "measures": {"tool_calls": float(rng.integers(0, 4))}}
        if shadow:
            primary["shadow"] = shadow
        out.append(primary)
        if rng.random() < 0.7:
            out.append({"v": 1, "type": "feedback", "event_id": f"fp{i}", "trace_id": f"p{i}", "source": "judge",
                        "ts": _iso(ts + timedelta(seconds=30)), "correct": int(rng.random() < 0.6),
                        **({"score": float(rng.uniform(0, 5))} if rng.random() < 0.5 else {})})
        if shadow != "sent":
            continue
        slow = float(rng.lognormal(0.15 if variant == "t" else -0.05, 0.25))
        s_e2e, s_ttft, s_out = e2e * slow, ttft * slow, max(2, out_tokens + int(rng.integers(-30, 30)))
        failed = rng.random() < 0.08
        out.append({**base, "event_id": f"s{i}", "trace_id": f"s{i}", "shadow_of": f"p{i}",
                    "ts": _iso(ts + timedelta(milliseconds=5)), "ttft_ms": s_ttft, "e2e_ms": s_e2e,
                    "tpot_ms": (s_e2e - s_ttft) / (s_out - 1), "prompt_tokens": primary["prompt_tokens"],
                    "output_tokens": s_out, "device_s": s_e2e / 1000, "cost_usd": 1e-5 * s_out,
                    "measures": {"tool_calls": float(rng.integers(0, 5))}, **({"error": "upstream 503"} if failed else {})})
        if rng.random() < 0.75:  # the shadow graded by its own trace id
            out.append({"v": 1, "type": "feedback", "event_id": f"fs{i}", "trace_id": f"s{i}", "source": "judge",
                        "ts": _iso(ts + timedelta(seconds=31)), "correct": int(rng.random() < 0.8),
                        **({"score": float(rng.uniform(1, 5))} if rng.random() < 0.5 else {})})
    shadows = [e for e in out if e.get("shadow_of")]
    # a relabel of a shadow (the latest label wins), billing for another, a redelivery, an orphan
    first = shadows[0]
    out.append({"v": 1, "type": "feedback", "event_id": "relabel", "trace_id": first["trace_id"], "source": "human",
                "ts": _iso(T0 + timedelta(hours=1)), "correct": 0})
    out.append({"v": 1, "type": "cost", "event_id": "bill", "trace_id": shadows[1]["trace_id"], "cost_usd": 0.25,
                "ts": _iso(T0 + timedelta(hours=1))})
    out.append(dict(shadows[2]))
    out.append({**shadows[3], "event_id": "orphan", "trace_id": "orphan", "shadow_of": "never-loaded"})
    return out


CHILD = textwrap.dedent("""
    import json, sys
    from ablab.streaming.store import apply_ddl, make_client, rollup
    from ablab.streaming.store.reads import StoreReads
    from ablab.streaming.loader.rows import Routed, TABLE_COLUMNS, route
    from ablab.platform.analytics import results as res
    from ablab.platform.stats.spec import parse_spec

    store, events_path, specs_path = sys.argv[1:4]
    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    specs = [parse_spec(s) for s in json.load(open(specs_path))]
    for spec in specs:
        rollup.set_slos(client, spec.key, spec.slos)
    # the loader's steps per record and per batch: validate and build the row, insert, feed the rollup
    lines = open(events_path, "rb").read().splitlines()
    routed = [route(topic="ablab.events", value=line, partition=0, offset=i, windows_topic="ablab.windows")
              for i, line in enumerate(lines)]
    refused = [str(r) for r in routed if not isinstance(r, Routed)]
    rows = [r.row for r in routed if isinstance(r, Routed)]
    for i in range(0, len(rows), 400):
        batch = rows[i:i + 400]
        client.insert("raw_events", batch, column_names=list(TABLE_COLUMNS["raw_events"]))
        rollup.feed(client, batch)
    out = {"refused": refused,
           "types": dict(client.query("SELECT type, count() FROM raw_events FINAL GROUP BY type").result_rows)}
    for j, spec in enumerate(specs):
        rollup.sync(client, spec)
        out[f"raw{j}"] = res.results_from_raw(StoreReads(client), spec).model_dump(mode="json")
        out[f"live{j}"] = res.results(StoreReads(client), spec).model_dump(mode="json")
        out[f"source{j}"] = res.aggregates(StoreReads(client), spec).source
    # an experiment without shadow activity has no shadows key
    plain = parse_spec({**json.load(open(specs_path))[0], "key": "quiet"})
    out["quiet"] = res.results(StoreReads(client), plain).model_dump(mode="json")
    print(json.dumps(out))
""")


def test_results_equal_analyze_with_shadows_and_a_graded_shadow(tmp_path):
    records = shadow_events()
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "specs.json").write_text(json.dumps([SPEC, SPEC_STARTED]))
    store = run_child_json(CHILD, str(tmp_path / "chdb"), str(path), str(tmp_path / "specs.json"), timeout=280)
    assert store["refused"] == []
    assert store["types"]["shadow"] == sum(1 for r in records if r.get("shadow_of")) - 1  # the redelivery once

    table = read_events(path)  # what `ablab analyze EVENTS` reads
    for j, data in enumerate((SPEC, SPEC_STARTED)):
        offline, _ = analyze_events(table, parse_spec(data))
        offline = offline.model_dump(mode="json")
        assert offline["shadows"], "the offline analysis found no shadows"
        for side in (f"raw{j}", f"live{j}"):
            assert_same_results(store[side], offline)  # the shadows rows included
    assert store["source0"] == "rollup" and store["source1"] == "raw"  # both paths carry the shadows
    assert "shadows" not in store["quiet"]

    # coverage, by hand from the events
    offline, _ = analyze_events(table, parse_spec(SPEC))
    offline = offline.model_dump(mode="json")
    for variant in ("c", "t"):
        mine = [r for r in records if r["type"] == "inference" and r["variant"] == variant]
        primaries = {r["trace_id"]: r for r in mine if not r.get("shadow_of")}
        shadows = {r["trace_id"]: r for r in mine if r.get("shadow_of")}
        cov = next(r["coverage"] for r in offline["shadows"] if r["variant"] == variant)
        assert cov == {
            "requests": len(primaries),
            "chosen": sum(1 for r in primaries.values() if r.get("shadow")),
            "sent": sum(1 for r in primaries.values() if r.get("shadow") == "sent"),
            "dropped": sum(1 for r in primaries.values() if r.get("shadow") == "dropped"),
            "shadowed": sum(1 for s in shadows.values() if s["shadow_of"] in primaries),
            "failed": sum(1 for s in shadows.values() if s["shadow_of"] in primaries and s.get("error")),
            "orphaned": sum(1 for s in shadows.values() if s["shadow_of"] not in primaries),
        }

    # a shadow graded by its own trace id: the latest label of each shadow is its accuracy
    labels: dict[str, tuple[str, int]] = {}
    for r in records:
        if r["type"] == "feedback" and "correct" in r and r["ts"] >= labels.get(r["trace_id"], ("", 0))[0]:
            labels[r["trace_id"]] = (r["ts"], r["correct"])
    shadows = {r["trace_id"]: r for r in records if r.get("shadow_of") and r["trace_id"] != "orphan"}
    for variant in ("c", "t"):
        graded = [(labels[s["shadow_of"]][1], labels[s["trace_id"]][1]) for s in shadows.values()
                  if s["variant"] == variant and s["shadow_of"] in labels and s["trace_id"] in labels]
        row = next(r for r in store["live0"]["shadows"] if r["variant"] == variant and r["metric"] == "accuracy")
        assert row["n_pairs"] == len(graded) > 20
        assert row["shadow_mean"] == pytest.approx(np.mean([s for _, s in graded]), rel=1e-12)
        assert row["primary_mean"] == pytest.approx(np.mean([p for p, _ in graded]), rel=1e-12)
    t_e2e = next(r for r in store["live0"]["shadows"] if r["variant"] == "t" and r["metric"] == "e2e_ms")
    assert t_e2e["mean_diff"] > 0 and t_e2e["wilcoxon_p_value"] < 0.01 and t_e2e["sign_p_value"] < 0.01
