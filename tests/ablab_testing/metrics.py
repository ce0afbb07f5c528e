"""The contract's example of experiment-defined metrics (docs/contracts.md, "Analysis
output"), one copy for the spec, engine and API tests."""

CONTRACT_CUSTOM_METRICS: list[dict] = [
    {"name": "judge_score", "type": "mean", "column": "score"},
    {"name": "e2e_per_user", "type": "mean", "column": "e2e_ms", "aggregation": "unit_mean", "cuped": {"covariate": "pre_period"}},
    {"name": "cost_per_1k_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
    {"name": "ttft_p90", "type": "quantile", "column": "ttft_ms", "quantile": 0.9},
    {"name": "tool_calls", "type": "mean", "column": "measures.tool_calls", "lower_is_better": False},
]
