"""AppTest of the results page against a real API reading a seeded store (real data)."""

from __future__ import annotations

import io
import uuid

import pandas as pd
import pytest

pytestmark = pytest.mark.integration


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_results_page_shows_the_whole_analysis(seeded_api, open_app):
    with seeded_api.client("viewer") as api:
        result = api.get("/v1/experiments/factorial/results").json()
    at = open_app("results", scope="viewer", exp="factorial")
    assert not at.exception, at.exception
    assert at.title[0].value.startswith("Results:")
    assert "Traffic split is healthy" in _texts(at.success)  # seeded with the configured weights: no SRM

    table = at.dataframe[0].value
    assert {"Latency (mean)", "Latency p95", "TTFT (mean)", "TTFT p95", "Accuracy", "Cost per request",
            "Cost per correct answer"} <= set(table["Metric"])
    # the table shows the API's numbers, formatted: int8 is 20 % faster than control in the seed
    row = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] == "int8")
    shown = table[(table["Metric"] == "Latency (mean)") & (table["Variant"] == "int8")].iloc[0]
    assert shown["Estimate"] == f"{row['estimate']:,.0f} ms"
    significant = row["p_value_adjusted"] < result["alpha"]
    assert shown["Verdict"] == ("🟢 better" if significant and row["abs_diff"] < 0 else "⚪ no difference" if not significant else "🔴 worse")
    assert row["abs_diff"] < 0  # the seed makes int8 faster; the page must show a negative difference
    assert shown["Relative (95% CI)"].startswith("-")
    decisions = {d["variant"]: d["decision"] for d in result["decisions"]}
    assert set(decisions) == {"compressed", "int8", "compressed_int8"}
    shown_text = " ".join(str(m.value) for m in at.markdown)
    assert "Computed at" in shown_text and "windows" in shown_text  # the live strip says when and how much
    assert "🟡 keep running" in shown_text or "🟢 ship" in shown_text or "🔴 don't ship" in shown_text

    guardrails = at.dataframe[1].value
    assert set(guardrails["Metric"]) == {"TTFT p95", "Accuracy"}
    assert guardrails["Status"].str.contains("pass|breach|pending").all()

    charts = at.get("vega_lite_chart")
    titles = " ".join(str(c.proto.spec) for c in charts)
    for title in ("Latency per variant", "running (cumulative), with 95% CI", "Latency distribution", "Pareto", "Shapley"):
        assert title in titles, title
    downloads = at.get("download_button")
    assert downloads, "CSV download missing"

    effects = at.dataframe[-1].value
    assert {"main effect", "2-way interaction"} <= set(effects["Kind"])
    assert any("precision=int8" in t for t in effects["Term"])


def test_results_csv_matches_the_api(seeded_api):
    from ablab.dashboards.client import ApiClient
    from ablab.dashboards.format import results_csv

    client = ApiClient(seeded_api.base_url, seeded_api.tokens["viewer"])
    result = client.results("factorial")
    frame = pd.read_csv(io.StringIO(results_csv(result)))
    assert len(frame) == len(result["metrics"])
    assert set(frame["variant"]) == {"control", "compressed", "int8", "compressed_int8"}


def test_timeseries_metric_switch_and_window_mode(open_app):
    at = open_app("results", exp="factorial", run=False)
    at.run()
    at.toggle(key="res_cumulative").set_value(False)
    at.selectbox(key="res_series_metric").select("accuracy").run()
    assert not at.exception
    spec = " ".join(str(c.proto.spec) for c in at.get("vega_lite_chart"))
    assert "Accuracy, per 10 s window" in spec


def test_results_empty_state_says_what_to_do(seeded_api, open_app):
    key = f"empty-{uuid.uuid4().hex[:6]}"
    with seeded_api.client("admin") as api:
        api.post("/v1/experiments", json={"key": key, "name": "Nothing yet", "traffic": 1, "control": "a",
                                          "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}).raise_for_status()
    at = open_app("results", exp=key)
    assert "No events for this experiment yet" in _texts(at.info)
    assert "Start it" in _texts(at.info)


def test_a_running_experiment_waits_on_its_backend_and_says_which(seeded_api, open_app):
    """Its variants name the gateway backend ``smollm2``, which does not answer (conftest): the page
    names it and its state (building with a percentage, or starting once the wheel is built)."""
    key = f"llm-{uuid.uuid4().hex[:6]}"
    strategy = {"backend": "smollm2"}
    with seeded_api.client("admin") as api:
        api.post("/v1/experiments", json={"key": key, "name": "Waits on SmolLM2", "traffic": 1, "control": "a",
                                          "variants": [{"key": "a", "weight": 1, "strategy": strategy},
                                                       {"key": "b", "weight": 1, "strategy": {**strategy, "params": {"temperature": 1.0}}}]}
                 ).raise_for_status()
        api.post(f"/v1/experiments/{key}/start").raise_for_status()
        rows = api.get("/v1/backends").json()["items"]
    assert [r["name"] for r in rows] == ["smollm2"] and rows[0]["state"] in ("building", "starting", "failed", "not built")
    at = open_app("results", exp=key)
    assert not at.exception, at.exception
    assert "Waiting for the backend to serve" in _texts(at.info)
    lines = " ".join(str(m.value) for m in at.markdown)
    assert "Backend **smollm2** (llama.cpp)" in lines
    assert "No events for this experiment yet. Events appear" not in _texts(at.info)  # not the generic message
    assert rows[0]["detail"] in lines.replace("\\", "")  # e.g. "building llama-cpp-python: 42% (120/280 compile steps)"


def test_unknown_experiment_is_reported(open_app):
    at = open_app("results", exp="does-not-exist")
    assert "Could not load experiment" in _texts(at.error)
