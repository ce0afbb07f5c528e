"""Parsing experiment-defined metrics, segments and the MDE: every error names its field."""

import pytest

from ablab.platform.stats.spec import SpecError, parse_spec
from ablab_testing.metrics import CONTRACT_CUSTOM_METRICS

BASE = {"key": "k", "variants": [{"key": "a"}, {"key": "b"}]}
SHAPES_EXAMPLE = {
    **BASE,
    "metrics": {
        "primary": ["judge_score"],
        "custom": [dict(m) for m in CONTRACT_CUSTOM_METRICS],
        "segments": ["dims.domain"],
    },
    "analysis": {"mde": {"judge_score": 0.02}},
}


def test_the_contract_example_parses():
    s = parse_spec(SHAPES_EXAMPLE)
    by = {m.name: m for m in s.custom}
    assert list(by) == ["judge_score", "e2e_per_user", "cost_per_1k_out", "ttft_p90", "tool_calls"]
    assert s.primary == ("judge_score",)
    assert s.metrics[-5:] == tuple(by)  # custom metrics are appended to the reported ones
    assert s.segments == ("dims.domain",)
    assert s.mde_for("judge_score") == 0.02 and s.mde_for("e2e_ms") == 0.05
    assert by["e2e_per_user"].covariate == "pre_period" and by["e2e_per_user"].aggregation == "unit_mean"
    assert by["cost_per_1k_out"].scale == 1000 and by["cost_per_1k_out"].lower_is_better  # cost: natural
    assert by["ttft_p90"].quantile == 0.9 and by["ttft_p90"].lower_is_better
    assert not by["judge_score"].lower_is_better and not by["tool_calls"].lower_is_better
    assert s.metric_def("judge_score") is by["judge_score"]


def test_direction_forms():
    def one(**kw):
        return parse_spec({**BASE, "metrics": {"custom": [{"name": "m", "type": "mean", **kw}]}}).custom[0]

    assert one(column="error").lower_is_better  # errors: lower by nature
    assert not one(column="output_tokens").lower_is_better
    assert one(column="measures.x", direction="lower").lower_is_better
    assert not one(column="e2e_ms", direction="higher").lower_is_better
    with pytest.raises(SpecError, match=r"metrics.custom\[0\].direction: contradicts"):
        one(column="e2e_ms", direction="higher", lower_is_better=True)
    # resolved on the model the engine reads; the stored form is still what its author wrote
    resolved = one(column="e2e_ms", direction="higher")
    assert resolved.lower_is_better is False and resolved.stored() == {"name": "m", "type": "mean", "column": "e2e_ms",
                                                                      "direction": "higher"}


def test_every_type_answers_the_engines_questions_alike():
    """What a type does not have reads as the neutral value, so the engine asks any custom
    metric the same questions; the sources a metric reads include a named covariate."""
    s = parse_spec(SHAPES_EXAMPLE)
    surface = {m.name: (m.kind, m.column, m.numerator, m.denominator, m.scale, m.quantile, m.covariate, m.sources)
               for m in s.custom}
    assert surface["cost_per_1k_out"] == ("ratio", None, "cost_usd", "output_tokens", 1000.0, None, None,
                                          ("cost_usd", "output_tokens"))
    assert surface["ttft_p90"] == ("quantile", "ttft_ms", None, None, 1.0, 0.9, None, ("ttft_ms",))
    assert surface["e2e_per_user"][6:] == ("pre_period", ("e2e_ms",))  # pre_period reads no other source
    named = parse_spec({**BASE, "metrics": {"custom": [
        {"name": "m", "type": "proportion", "column": "error", "cuped": {"covariate": "prompt_tokens"}}]}}).custom[0]
    assert (named.kind, named.numerator, named.quantile, named.covariate) == ("proportion", None, None, "prompt_tokens")
    assert named.sources == ("error", "prompt_tokens")


def test_custom_names_usable_in_guardrails_and_report():
    s = parse_spec({**SHAPES_EXAMPLE, "guardrails": [{"metric": "cost_per_1k_out", "margin": 0.1, "relative": True}],
                    "metrics": {**SHAPES_EXAMPLE["metrics"], "report": ["e2e_ms", "judge_score"]}})
    assert s.guardrails[0].metric == "cost_per_1k_out"
    assert s.metrics[:2] == ("e2e_ms", "judge_score") and "ttft_p90" in s.metrics


@pytest.mark.parametrize(
    "metric, message",
    [
        ({"name": "x", "type": "mean", "column": "foo"}, r"metrics.custom\[1\].column: unknown source 'foo'; known: "),
        ({"name": "e2e_ms", "type": "mean", "column": "e2e_ms"}, r"metrics.custom\[1\].name: 'e2e_ms' is a built-in"),
        ({"name": "BadName", "type": "mean", "column": "score"}, r"metrics.custom\[1\].name: 'BadName' is not a snake_case"),
        ({"name": "x" * 65, "type": "mean", "column": "score"}, r"metrics.custom\[1\].name: .* at most 64"),
        ({"name": "x", "type": "median", "column": "score"}, r"metrics.custom\[1\].type: must be one of"),
        ({"name": "x", "type": "mean", "column": "score", "aggregation": "max"}, r"metrics.custom\[1\].aggregation"),
        ({"name": "x", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "aggregation": "unit_mean"},
         r"metrics.custom\[1\].aggregation: a ratio"),
        ({"name": "x", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 0}, r"metrics.custom\[1\].scale"),
        ({"name": "x", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": float("inf")},
         r"metrics.custom\[1\].scale"),
        ({"name": "x", "type": "ratio", "numerator": "cost_usd"}, r"metrics.custom\[1\].denominator: required"),
        ({"name": "x", "type": "quantile", "column": "e2e_ms", "quantile": 1.0}, r"metrics.custom\[1\].quantile: must be in \(0, 1\)"),
        ({"name": "x", "type": "quantile", "column": "e2e_ms"}, r"metrics.custom\[1\].quantile: required"),
        ({"name": "x", "type": "proportion", "column": "e2e_ms"}, r"metrics.custom\[1\].column: a proportion needs a 0/1"),
        ({"name": "x", "type": "mean", "column": "score", "cuped": {"covariate": "nope"}}, r"metrics.custom\[1\].cuped.covariate: unknown source"),
        ({"name": "x", "type": "mean", "column": "score", "cuped": "pre_period"}, r"metrics.custom\[1\].cuped: expected"),
        ({"name": "x", "type": "mean", "column": "score", "lower_is_better": "yes"}, r"metrics.custom\[1\].lower_is_better"),
        ({"name": "x", "type": "mean", "column": "score", "colour": 1}, r"metrics.custom\[1\].colour: unknown field"),
        ({"name": "ok", "type": "mean", "column": "score"}, r"metrics.custom\[1\].name: 'ok' is defined twice"),
    ],
)
def test_bad_custom_metric_names_the_field(metric, message):
    ok = {"name": "ok", "type": "mean", "column": "score"}
    with pytest.raises(SpecError, match=message):
        parse_spec({**BASE, "metrics": {"custom": [ok, metric]}})


def test_limits_and_segments_and_mde():
    many = [{"name": f"m{i}", "type": "mean", "column": "score"} for i in range(33)]
    with pytest.raises(SpecError, match="metrics.custom: at most 32"):
        parse_spec({**BASE, "metrics": {"custom": many}})
    with pytest.raises(SpecError, match=r"metrics.segments: at most 5"):
        parse_spec({**BASE, "metrics": {"segments": [f"dims.d{i}" for i in range(6)]}})
    with pytest.raises(SpecError, match=r"metrics.segments\[0\]: expected dims.<name>"):
        parse_spec({**BASE, "metrics": {"segments": ["domain"]}})
    with pytest.raises(SpecError, match=r"analysis.mde.nope: unknown metric"):
        parse_spec({**BASE, "analysis": {"mde": {"nope": 0.1}}})
    with pytest.raises(SpecError, match=r"analysis.mde.e2e_ms: a relative MDE must be > 0"):
        parse_spec({**BASE, "analysis": {"mde": {"e2e_ms": 0}}})
    with pytest.raises(SpecError, match=r"primary: unknown metric 'nope'"):
        parse_spec({**BASE, "metrics": {"primary": ["nope"]}})
    with pytest.raises(SpecError, match=r"guardrails\[0\].metric: unknown metric"):
        parse_spec({**BASE, "guardrails": [{"metric": "judge", "max": 1}]})
