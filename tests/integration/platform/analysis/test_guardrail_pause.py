"""Guardrail automation on real parts: a variant whose p95 TTFT breaches its SLA in chDB is
paused in a real (SQLite, migrated) registry, with the reason in the audit log; control and
healthy experiments are left alone. Runs in a child process (chDB: one owner per directory)."""

import textwrap

import pytest

from ablab_testing import run_child_json

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import json, sys
    import pandas as pd
    from ablab.platform.analytics.guardian import ACTOR, enforce_guardrails
    from ablab.platform.registry import service as registry
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import ExperimentCreate
    from ablab.platform.stats.offline import analyze_events
    from ablab.platform.stats.spec import parse_spec
    from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events
    from ablab.streaming.store import apply_ddl, make_client
    from ablab.streaming.store.reads import StoreReads

    store, db = sys.argv[1:3]
    variants = {"control": VariantEffect(weight=0.5), "slow": VariantEffect(weight=0.5, latency=3.0)}
    ev = synthetic_events(variants=variants, n_requests=6000, n_units=600, seed=5)
    # the SLA sits between the two variants' measured p95 TTFT
    offline, _ = analyze_events(ev, parse_spec(spec_dict(variants)))
    offline = offline.model_dump(mode="json")
    p95 = {r["variant"]: r["estimate"] for r in offline["metrics"] if r["metric"] == "ttft_ms_p95"}
    sla = (p95["control"] + p95["slow"]) / 2

    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    reads = StoreReads(client)  # results' port on the store
    from ablab_testing import insert_synthetic_raw

    insert_synthetic_raw(client, ev)

    url = f"sqlite:///{db}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    with transaction(sessions) as s:
        for key, bound in (("exp", sla), ("other", 10 * p95["slow"])):
            data = ExperimentCreate(key=key, name=key, traffic=1.0, control="control",
                                    variants=[{"key": "control", "weight": 0.5}, {"key": "slow", "weight": 0.5}],
                                    guardrails=[{"metric": "ttft_ms_p95", "max": bound}])
            registry.create_experiment(s, data=data, actor="test", bucket_space=10_000)
            exp = registry.transition(s, key=key, action="start", actor="test")
            exp.started_at = ev["ts"].min().to_pydatetime()
    from ablab.streaming.store.rollup import sync

    def maintain(spec):  # what the API's store passes as its rollup maintenance step
        return sync(client, spec)

    first = enforce_guardrails(sessions, reads, sync_rollup=maintain)
    second = enforce_guardrails(sessions, reads, sync_rollup=maintain)  # already paused: nothing new
    with transaction(sessions) as s:
        reads = {k: registry.to_read(registry.get_experiment(s, k)) for k in ("exp", "other")}
        audit = [a.model_dump(mode="json") for a in registry.audit_log(s, key="exp")]
    print(json.dumps({
        "sla": sla, "p95": p95, "first": first, "second": second,
        "paused": {k: {v.key: v.paused for v in r.variants} for k, r in reads.items()},
        "reason": {v.key: v.paused_reason for v in reads["exp"].variants},
        "audit": [a for a in audit if a["actor"] == ACTOR],
    }, default=str))
""")


def test_breached_guardrail_pauses_variant_with_audit(tmp_path):
    got = run_child_json(CHILD, str(tmp_path / "store"), str(tmp_path / "reg.db"), timeout=240)
    assert got["p95"]["slow"] > got["sla"] > got["p95"]["control"]
    assert [(p["experiment"], p["variant"]) for p in got["first"]] == [("exp", "slow")]
    assert got["second"] == []
    assert got["paused"] == {"exp": {"control": False, "slow": True}, "other": {"control": False, "slow": False}}
    assert "ttft_ms_p95" in got["reason"]["slow"]
    assert len(got["audit"]) == 1 and got["audit"][0]["action"] == "pause_variant"
