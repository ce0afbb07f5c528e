"""The SLA-constrained Thompson allocator on real parts: arms read from chDB, weights written
to a real (SQLite, migrated) registry through the registry service — a new phase under
optimistic locking, an audit entry that says why — from the guardrail monitor's loop.
Runs in a child process (chDB: one owner per data directory)."""

import textwrap

import pytest

from ablab_testing import run_child_json

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import json, sys
    from ablab.platform.analytics.allocation import ACTOR, plan, _apply
    from ablab.platform.analytics.guardian import GuardrailMonitor
    from ablab.platform.analytics import service
    from ablab.platform.assignment.engine import assign
    from ablab.platform.assignment.payload import config_from_payload
    from ablab.platform.config import Settings
    from ablab.platform.registry import service as registry
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import ExperimentCreate, ExperimentUpdate
    from ablab.platform.stats.offline import analyze_events
    from ablab.platform.stats.spec import parse_spec
    from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events
    from ablab.streaming.store import apply_ddl, make_client
    from ablab.streaming.store.reads import StoreReads

    store, db = sys.argv[1:3]
    # traffic after the experiments start (now): events before a start are its pre-period, not analyzed
    from datetime import datetime, timedelta, timezone
    after_start = (datetime.now(timezone.utc) + timedelta(minutes=5)).isoformat()
    # control: the baseline; better: more accurate at the same latency; slow: the most accurate
    # but its p95 TTFT is over the SLA, so the constrained allocator must starve it
    variants = {"control": VariantEffect(weight=1, accuracy=0.70), "better": VariantEffect(weight=1, accuracy=0.85),
                "slow": VariantEffect(weight=1, accuracy=0.95, latency=3.0)}
    ev = synthetic_events(variants=variants, n_requests=6000, n_units=6000, unit="request", seed=9, label_rate=0.5,
                          experiment="bandit", start=after_start)
    offline, _ = analyze_events(ev, parse_spec(spec_dict(variants, key="bandit", unit="request")))
    offline = offline.model_dump(mode="json")
    p95 = {r["variant"]: r["estimate"] for r in offline["metrics"] if r["metric"] == "ttft_ms_p95"}
    sla = (max(p95["control"], p95["better"]) + p95["slow"]) / 2
    users = synthetic_events(n_requests=2000, n_units=200, seed=3, experiment="users", start=after_start)

    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    reads = StoreReads(client)  # results' port on the store
    import pandas as pd
    ev = pd.concat([ev, users], ignore_index=True)
    from ablab_testing import insert_synthetic_raw

    insert_synthetic_raw(client, ev)

    url = f"sqlite:///{db}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    guard = [{"metric": "ttft_ms_p95", "max": sla, "pause": False}]
    with transaction(sessions) as s:
        for key, unit, vs in (("bandit", "request", ["control", "better", "slow"]), ("users", "user", ["control", "compressed"])):
            data = ExperimentCreate(key=key, name=key, unit=unit, traffic=1.0, control="control",
                                    variants=[{"key": v, "weight": 1} for v in vs], guardrails=guard)
            registry.create_experiment(s, data=data, actor="test", bucket_space=10_000)
            registry.transition(s, key=key, action="start", actor="test")
    settings = Settings(allocator_experiments=["bandit", "users"], allocator_interval_s=60, allocator_floor=0.05,
                        allocator_min_change=0.02, allocator_min_trials=50)

    def config():
        with transaction(sessions) as s:
            return config_from_payload(registry.sdk_config(s, bucket_space=10_000))

    def split(cfg, n=20000):
        got = {}
        for i in range(n):
            a = [x for x in assign(cfg, f"req-{i}") if x.experiment == "bandit"]
            got[a[0].variant] = got.get(a[0].variant, 0) + 1
        return {k: v / n for k, v in got.items()}

    before_split = split(config())
    monitor = GuardrailMonitor(sessions, reads, interval_s=3600, settings=settings)  # the loop itself waits an hour
    first = monitor.allocate_if_due(now=0.0)
    not_due = monitor.allocate_if_due(now=30.0)
    second = monitor.allocate_if_due(now=61.0)  # same data: shares barely move, no new phase
    after_split = split(config())

    # optimistic locking: someone edits the experiment between the allocator's read and write
    with transaction(sessions) as s:
        stale = registry.to_read(registry.get_experiment(s, "bandit"))
    step = plan(reads, stale, Settings(**{**settings.model_dump(), "allocator_min_change": 0.0}))
    with transaction(sessions) as s:
        registry.update_experiment(s, key="bandit", data=ExperimentUpdate(name="renamed"),
                                   expected_version=stale.version, actor="someone")
    raced = _apply(sessions, stale, step, settings)
    monitor.close()

    with transaction(sessions) as s:
        exp = registry.to_read(registry.get_experiment(s, "bandit"))
        users_exp = registry.to_read(registry.get_experiment(s, "users"))
        audit = [a.model_dump(mode="json") for a in registry.audit_log(s, key="bandit")]
    result = service.results(reads, exp, settings=settings).model_dump(mode="json")
    print(json.dumps({
        "sla": sla, "p95": p95, "first": first, "not_due": not_due, "second": second, "raced": raced,
        "weights": {v.key: v.weight for v in exp.variants}, "phase": exp.phase, "name": exp.name,
        "users_phase": users_exp.phase, "users_weights": [v.weight for v in users_exp.variants],
        "before_split": before_split, "after_split": after_split,
        "audit": [a for a in audit if a["actor"] == ACTOR], "srm": result["srm"],
    }, default=str))
""")


def test_allocator_reweights_request_experiment_through_the_registry(tmp_path):
    got = run_child_json(CHILD, str(tmp_path / "store"), str(tmp_path / "reg.db"), timeout=300)
    assert got["p95"]["slow"] > got["sla"] > got["p95"]["better"]

    # first pass: the request-randomized experiment is re-weighted, the user one refused
    by_exp = {r["experiment"]: r for r in got["first"]}
    assert "unit is user" in by_exp["users"]["skipped"]
    assert got["users_phase"] == 1 and got["users_weights"] == [1, 1]
    w = got["weights"]
    assert w["better"] > 0.6 and w["better"] > w["control"]          # the best feasible arm gets the traffic
    assert w["slow"] == pytest.approx(0.05, abs=0.01)                # over the SLA: held at the floor
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-5)
    # the assignment engine serves the new split (the new phase rehashes requests, harmless for unit=request)
    assert got["before_split"]["better"] == pytest.approx(1 / 3, abs=0.02)
    assert got["after_split"]["better"] == pytest.approx(w["better"], abs=0.02)

    # the pacing: not due 30 s later; 61 s later a pass runs but the shares barely move: no new phase
    assert got["not_due"] == []
    assert "largest share change" in {r["experiment"]: r for r in got["second"]}["bandit"]["skipped"]
    assert got["phase"] == 2

    # optimistic locking: a concurrent edit wins, the allocator writes nothing
    assert got["raced"]["skipped"].startswith("changed concurrently")
    assert got["name"] == "renamed" and got["weights"] == w

    # one audit entry that says why (plus the registry's own update+new_phase entry)
    actions = sorted(a["action"] for a in got["audit"])
    assert actions == ["reweight", "update+new_phase"]
    why = next(a for a in got["audit"] if a["action"] == "reweight")["after"]
    assert "Thompson sampling on accuracy subject to ttft_ms_p95" in why["reason"] and why["phase"] == 2
    assert why["arms"]["slow"]["ttft_ms_p95"] > got["sla"]

    # results of the re-weighted experiment do not test the split against the current weights
    assert got["srm"]["flagged"] is False and "adaptive" in got["srm"]["skipped"]
