"""A policy variant's results and attribution (issue 33) through the loader into real chDB:
``GET …/results``'s ``policies`` (by the raw scan and by the per-unit rollup) and
``GET …/attribution``'s ``policies`` equal ``ablab analyze`` and the credit of the same event
file, to the bit; the policy variant is compared with the control like any variant; an
experiment without a policy variant has no ``policies`` key.

Events go through the loader's own steps (:func:`ablab.streaming.loader.rows.route`: the
event's ``arm``, ``propensity`` and ``policy_version`` land in the stored JSON, where the
store's ``logged_events`` finds them) and its insert plus rollup feed. chDB allows one data
directory per process, so the store side runs in a child.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from ablab.platform.analytics.event_files import read_events
from ablab.platform.analytics.offline import analyze_file_events as analyze_events
from ablab.platform.policy.credit import policy_credits_from_events
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy
from ablab.platform.stats.spec import parse_spec
from ablab_testing import run_child_json
from ablab_testing.results import assert_same_results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHILD = textwrap.dedent("""
    import json, sys
    from ablab.streaming.store import apply_ddl, make_client, rollup
    from ablab.streaming.store.reads import StoreReads
    from ablab.streaming.loader.rows import Routed, TABLE_COLUMNS, route
    from ablab.platform.analytics import results as res
    from ablab.platform.stats.spec import parse_spec

    store, events_path, spec_path = sys.argv[1:4]
    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    data = json.load(open(spec_path))
    spec = parse_spec(data)
    rollup.set_slos(client, spec.key, spec.slos)
    lines = open(events_path, "rb").read().splitlines()
    routed = [route(topic="ablab.events", value=line, partition=0, offset=i, windows_topic="ablab.windows")
              for i, line in enumerate(lines)]
    rows = [r.row for r in routed if isinstance(r, Routed)]
    for i in range(0, len(rows), 500):
        batch = rows[i:i + 500]
        client.insert("raw_events", batch, column_names=list(TABLE_COLUMNS["raw_events"]))
        rollup.feed(client, batch)
    rollup.sync(client, spec)
    reads = StoreReads(client)
    out = {"refused": [str(r) for r in routed if not isinstance(r, Routed)],
           "raw": res.results_from_raw(reads, spec).model_dump(mode="json"),
           "live": res.results(reads, spec).model_dump(mode="json"),
           "source": res.aggregates(reads, spec).source,
           "attribution": res.attribution(reads, spec).model_dump(mode="json")}
    plain = parse_spec({**data, "key": "quiet", "variants": [{"key": "control", "weight": 1},
                                                              {"key": "router", "weight": 1}]})
    out["quiet"] = res.results(reads, plain).model_dump(mode="json")
    out["quiet_attribution"] = res.attribution(reads, plain).model_dump(mode="json")
    print(json.dumps(out))
""")


def _events() -> tuple[list[dict], dict]:
    """A control and a router over 3,000 requests; the router's events carry the prompt
    length its decision saw (``measures.policy_prompt_tokens``) beside the backend's count."""
    env = Environment()
    router = router_policy(env, explore=0.1)
    events, spec = experiment_events(env, Decider(router, fit_after_exploring(router, env)), np.random.default_rng(9),
                                     key="routed", n=3000, n_units=300)
    for e in events:
        if e["type"] == "inference" and e["variant"] == "router":
            e["measures"] = {"policy_prompt_tokens": float(e["prompt_tokens"])}
            e["prompt_tokens"] += 7  # the backend counted its template too
    spec["metrics"] = {"primary": ["accuracy"]}
    spec["slos"] = {"ttft_ms": 400}
    return events, spec


def test_policy_results_and_attribution_equal_the_event_file(tmp_path):
    events, spec_body = _events()
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "spec.json").write_text(json.dumps(spec_body))
    store = run_child_json(CHILD, str(tmp_path / "chdb"), str(path), str(tmp_path / "spec.json"), timeout=280)
    assert store["refused"] == []

    spec = parse_spec(spec_body)
    table = read_events(path)  # what `ablab analyze EVENTS` reads
    offline = analyze_events(table, spec)[0].model_dump(mode="json")
    (policy,) = offline["policies"]
    assert policy["variant"] == "router" and policy["requests"] == sum(
        1 for e in events if e["type"] == "inference" and e["variant"] == "router")
    assert all(m["n"] > 0 for a in policy["arms"] for m in a["metrics"])  # every arm labelled and measured
    for side in ("raw", "live"):
        assert store[side]["policies"] == offline["policies"], side  # the same reading: equal to the bit
        assert_same_results(store[side], offline)  # the router compared with the control like any variant
    assert store["source"] == "rollup"  # the live read took the rollup for the metrics, the logs for the policy

    credit = [c.model_dump(mode="json") for c in policy_credits_from_events(table, spec) or []]
    assert store["attribution"]["policies"] == credit
    (c,) = credit
    assert c["gain"]["estimate"] is not None and [f["feature"] for f in c["features"]] == ["prompt_tokens", "attr.plan"]
    assert sum(a["contribution"] for a in c["arms"]) == pytest.approx(c["gain"]["estimate"], abs=1e-12)

    assert "policies" not in store["quiet"] and "policies" not in store["quiet_attribution"]
