"""AppTest of the results page's views (variants, segments, custom metrics) against a real API
reading a seeded store: every view is an address (``view=…`` and its parameters), shows the
API's numbers, and refuses a parameter that names nothing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def _open(open_app, **params: str):
    at = open_app("results", scope="viewer", exp="factorial", run=False)
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    assert not at.exception, at.exception
    return at


def test_variants_view_lists_them_and_opens_one(seeded_api, open_app):
    at = _open(open_app, view="variants")
    table = at.dataframe[0].value
    assert list(table["Variant"]) == ["control", "compressed", "int8", "compressed_int8"]
    assert set(table["Strategy"]) >= {"baseline", "precision=int8"}

    at = _open(open_app, view="variants", variant="int8")
    assert any("Variant int8" in str(h.value) for h in at.subheader)
    strategy, numbers, comparison = (at.dataframe[i].value for i in range(3))
    assert strategy.to_dict("records") == [{"Factor": "precision", "This variant": "int8", "Control": "fp32"}]
    with seeded_api.client("viewer") as api:
        result = api.get("/v1/experiments/factorial/results").json()
    row = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] == "int8")
    latency = comparison[comparison["Metric"] == "Latency (mean)"].iloc[0]
    assert latency["Difference"] == f"{row['abs_diff']:,.0f} ms"
    assert "tool_calls (custom)" in set(numbers["Metric"])


def test_a_variant_that_does_not_exist_is_refused_as_text(open_app):
    at = _open(open_app, view="variants", variant="[x](javascript:y)")
    assert "no variant" in _texts(at.error) and "\\[x\\]" in _texts(at.error)
    assert list(at.dataframe[0].value["Variant"])  # the list is shown instead


def test_segments_view_flags_the_heterogeneous_effect_and_opens_a_segment(open_app):
    at = _open(open_app, view="segments")
    assert "The effect differs by dims.domain" in _texts(at.warning).replace("\\", "")
    het = at.dataframe[0].value
    flagged = het[het["Effect differs"] == "🚩 yes"]
    assert "int8" in set(flagged[flagged["Metric"] == "Latency (mean)"]["Variant"])  # INT8 is much faster on code
    values = at.dataframe[1].value
    assert {"chat", "code", "math"} <= set(values["Segment"])

    at = _open(open_app, view="segments", dim="dims.domain", value="code")
    detail = at.dataframe[0].value
    assert set(detail["Variant"]) == {"control", "compressed", "int8", "compressed_int8"}
    assert "Latency (mean)" in set(detail["Metric"])
    at = _open(open_app, view="segments", dim="dims.domain", value="nowhere")
    assert "No segment" in _texts(at.error)


def test_custom_metrics_view_shows_each_definition_beside_its_numbers(open_app):
    at = _open(open_app, view="metrics")
    text = " ".join(str(m.value) for m in at.markdown).replace("\\", "")  # shown escaped: literal text
    assert "**tool_calls** - Type: mean\n- Computes: mean of measures.tool_calls" in text
    assert "Direction: higher is better" in text  # as defined (lower_is_better: false)
    assert "Σ cost_usd ÷ Σ output_tokens × 1000" in text
    assert "p90 of ttft_ms" in text
    assert len(at.dataframe) == 3
    assert list(at.dataframe[0].value["Variant"]) == ["control", "compressed", "int8", "compressed_int8"]
