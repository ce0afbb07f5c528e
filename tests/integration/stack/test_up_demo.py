"""`ablab up --demo` on a clean ABLAB_HOME with free ports: windows and attribution appear, `down` leaves nothing.

Real parts throughout: the Maven-jar Kafka broker, the API with embedded chdb and its
loader, the PyFlink mini-cluster job, two torch workers, traffic and labelers, and
SmolLM2 behind llama_cpp.server behind `ablab gateway`, asked graded questions, a share of
them long; demo-llm's router variant chooses a system prompt per request, and off-policy
evaluation of one of its arms from the store's logs is checked against the fixed variant
serving the same strategy.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from ablab_testing import ABLAB, server_ports, wait_for
from ablab_testing.demo_ope import ESTIMATORS, ope_check, policy_events, render

pytestmark = pytest.mark.timeout(900)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _variants_with_windows(ts: object) -> set[str]:
    """Variants that have at least one 10 s window row, whatever nesting the series uses."""
    found: set[str] = set()

    def walk(node: object, variant: str | None = None) -> None:
        if isinstance(node, dict):
            v = node.get("variant", variant)
            if v is not None and any(k in node for k in ("window_start", "ts", "t", "window_end")):
                found.add(str(v))
            for value in node.values():
                walk(value, v)
        elif isinstance(node, list):
            for item in node:
                walk(item, variant)

    walk(ts)
    return found


def test_up_demo_shows_windows_and_attribution_and_down_leaves_nothing(tmp_path: Path) -> None:
    # outside the ephemeral range: these servers start only after migrations and other
    # outgoing connections, any of which could take a bind(0) port first
    base = server_ports(8)
    kafka_port = base  # and its controller on base + 1
    api_port, dash_port, w0, w1, gateway_port, llm_port = base + 2, base + 3, base + 4, base + 5, base + 6, base + 7
    env = {
        **os.environ,
        "ABLAB_HOME": str(tmp_path / "home"),
        "ABLAB_API_PORT": str(api_port),
        "ABLAB_API_URL": f"http://127.0.0.1:{api_port}",
        "ABLAB_DASHBOARD_PORT": str(dash_port),
        "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "ABLAB_DEMO_WORKER_PORTS": json.dumps([w0, w1]),
        "ABLAB_DEMO_GATEWAY_PORT": str(gateway_port),
        "ABLAB_DEMO_LLM_PORT": str(llm_port),
        "ABLAB_DEMO_DURATION_S": "600",
        # the suite runs beside other stacks on 2 cores: a service may take longer to come up
        "ABLAB_START_TIMEOUT_S": "360",
    }
    ports = [kafka_port, api_port, dash_port, w0, w1, gateway_port, llm_port]
    run_dir = tmp_path / "home" / "run"
    try:
        first = subprocess.run([ABLAB, "up", "--demo"], env=env, capture_output=True, text=True, timeout=420, check=False)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "ablab is up" in first.stdout
        second = subprocess.run([ABLAB, "up", "--demo"], env=env, capture_output=True, text=True, timeout=420, check=False)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "reused" in second.stdout + second.stderr, second.stdout  # nothing started twice

        token = json.loads((run_dir / "demo-tokens.json").read_text())["admin"]
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        want = {"baseline", "sparse", "compress", "sparse-compress", "lora"}
        deadline = time.monotonic() + 240
        ts: object = None
        attribution: dict = {}
        while time.monotonic() < deadline:
            r = api.get("/v1/experiments/demo-serving/timeseries", params={"metric": "e2e_ms"})
            if r.status_code == 200:
                ts = r.json()
                if _variants_with_windows(ts) >= want:
                    a = api.get("/v1/experiments/demo-serving/attribution")
                    if a.status_code == 200 and a.json():
                        attribution = a.json()
                        break
            time.sleep(5)  # poll interval: window rows arrive every 10 s
        logs = tmp_path / "home" / "logs"
        tail = {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log") if p.name in ("api.log", "stream.log")}
        assert _variants_with_windows(ts) >= want, f"window rows per variant missing: {json.dumps(ts)[:2000]}\n{tail}"
        results = api.get("/v1/experiments/demo-serving/results").json()
        assert {m["variant"] for m in results["metrics"]} >= want
        assert attribution, "empty attribution"
        assert any(attribution.get(k) for k in ("pareto", "frontier", "factors", "effects", "shapley")), attribution

        # the real LLM: SmolLM2 behind llama.cpp, behind the gateway, graded answers as labels
        # and multi-turn conversations with dialogue_state off and on; demo-llm shadowed
        llm_want = {"helpful-t0", "helpful-t1", "terse-t0", "terse-t1", "router"}
        dialogue_want = {"state-off", "state-on"}
        llm: dict = {}
        dialogue: dict = {}

        def labeled(results: dict) -> set[str]:
            return {m["variant"] for m in results.get("metrics", []) if m["metric"] == "accuracy" and m.get("n")}

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            r = api.get("/v1/experiments/demo-llm/results")
            d = api.get("/v1/experiments/demo-llm-dialogue/results")
            if r.status_code == 200 and d.status_code == 200:
                llm, dialogue = r.json(), d.json()
                if labeled(llm) >= llm_want and labeled(dialogue) >= dialogue_want and llm.get("shadows"):
                    break
            time.sleep(5)  # poll interval: graded labels arrive as the labeler sends them
        tail = {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log") if p.name.startswith(("llm", "gateway"))}
        by_metric = {(m["metric"], m["variant"]): m for m in llm.get("metrics", [])}
        assert all(("accuracy", v) in by_metric for v in llm_want), f"demo-llm has no graded variants: {json.dumps(llm)[:2000]}\n{tail}"
        # a variant's latency is positive wherever it has one (on a box loaded past SmolLM2's pace, a
        # variant's few requests can all time out: graded, but with no latency to average)
        e2e = {v: by_metric[("e2e_ms", v)] for v in llm_want if ("e2e_ms", v) in by_metric}
        assert any(row["n"] for row in e2e.values()), e2e
        assert all(row["estimate"] > 0 for row in e2e.values() if row["n"]), e2e
        assert labeled(dialogue) >= dialogue_want, f"demo-llm-dialogue has no graded variants: {json.dumps(dialogue)[:2000]}\n{tail}"
        tokens = {m["variant"]: m["estimate"] for m in dialogue["metrics"] if m["metric"] == "prompt_tokens"}
        assert tokens["state-on"] < 0.6 * tokens["state-off"], tokens  # the history replaced by three slots
        shadowed = [row for row in llm.get("shadows", []) if row["metric"] == "e2e_ms"]
        assert sum(row["coverage"]["shadowed"] for row in shadowed) > 0, f"no shadow events: {json.dumps(llm)[:2000]}"

        # the router (issue 33): its requests log the choice, and off-policy evaluation of
        # "always router.terse" from the logs agrees with terse-t0, the fixed variant serving
        # the same strategy, measured in the same experiment. Waited for: graded requests on
        # both arms and intervals of positive width on both sides (a width-0 interval, all
        # answers right or all wrong so far, is not an interval estimate yet). Up to 3 minutes:
        # a qa request takes 5-15 s on a loaded box (a helpful prompt and long questions), and a
        # few labels on router.terse are often all right.
        def router_checks() -> dict[str, dict] | None:
            checks = {m: ope_check(api, metric=m) for m in ("accuracy", "e2e_ms")}
            for check in checks.values():
                if check is None or not all(check["router_arms"].get(a) for a in ("router.terse", "router.helpful")):
                    return None
                if not all(side["width"] for side in (check["measured"], *check["ope"].values())):
                    return None
            return checks

        waited = time.monotonic()
        checks = wait_for(router_checks, timeout_s=180, interval_s=5, what="graded requests on both router arms",
                          on_timeout=lambda: json.dumps(ope_check(api))[:2000])
        print(f"router check ready after {time.monotonic() - waited:.0f} s more")
        for metric, check in checks.items():
            print(render(check))  # the numbers a report quotes (pytest -s)
            assert check["measured"]["n"] > 0 and check["candidate_logged"]["n"] > 0, check
            for side in (check["measured"], *(check["ope"][e] for e in ESTIMATORS)):
                assert all(isinstance(x, float) and math.isfinite(x) for x in (side["estimate"], *side["ci"])), check
                assert side["ci"][0] <= side["estimate"] <= side["ci"][1], check
            if metric == "accuracy":  # latency drifts with the box's load between the two arms' requests; printed only
                assert check["overlap"]["dr"], f"{metric}: OPE of always router.terse disagrees with terse-t0\n{render(check)}"
        events = list(policy_events(tmp_path / "home" / "gateway-outbox"))
        assert {e["type"] for e in events} == {"exposure", "inference"}, events[:3]
        for e in events:
            assert e["arm"] in ("terse", "helpful") and isinstance(e["policy_version"], str) and e["policy_version"], e
            # uniform until a model is published (1/2 each), then 0.9 for the cell's choice, 0.1 for the other
            want = {0.5} if e["policy_version"].startswith("uniform:") else {0.1, 0.9}
            assert 0 < e["propensity"] <= 1 and min(abs(e["propensity"] - p) for p in want) < 1e-9, e
        # one strategy, one id: an arm's inference events carry the id of the fixed variant
        # serving the same strategy (the registry stores that one with its defaults spelled out)
        outbox = tmp_path / "home" / "gateway-outbox"
        for arm, fixed in (("terse", "terse-t0"), ("helpful", "helpful-t0")):
            arm_ids = {e["strategy"] for e in events if e["type"] == "inference" and e["arm"] == arm}
            fixed_ids = {e["strategy"] for e in policy_events(outbox, variant=fixed) if e["type"] == "inference"}
            assert len(fixed_ids) == 1 and arm_ids == fixed_ids, (arm, arm_ids, fixed_ids)

        status = subprocess.run([ABLAB, "status"], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert "gateway" in status.stdout and "llm" in status.stdout and "llm-dialogue" in status.stdout, status.stdout
    finally:
        pids = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid")} if run_dir.exists() else {}
        down = subprocess.run([ABLAB, "down"], env=env, capture_output=True, text=True, timeout=180, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert pids, "up wrote no pidfiles"


    def leftovers() -> str:
        left = {name: pid for name, pid in pids.items() if _alive_group(pid)}
        busy = [p for p in ports if not _port_free(p)]
        return f"process groups still alive: {left}; ports still bound: {busy}" if left or busy else ""

    # a process that exited may take a moment to be reaped and to free its port
    wait_for(lambda: not leftovers(), timeout_s=30, what="every process group gone and every port free after down",
             on_timeout=leftovers)
