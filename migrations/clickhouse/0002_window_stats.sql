-- 10 s window rows of worker-side inference events, written by the Flink job to the
-- windows topic and loaded from there. One row per (experiment, variant, window_start):
-- counts, sums and sums of squares add across windows (means and variances merge), the
-- percentiles are Flink's PERCENTILE (linear interpolation) of that window alone.
-- ReplacingMergeTree on the window key makes a reloaded or re-emitted row idempotent.
CREATE TABLE IF NOT EXISTS window_stats
(
    experiment          LowCardinality(String),
    variant             LowCardinality(String),
    window_start        DateTime64(3, 'UTC'),
    window_end          DateTime64(3, 'UTC'),
    n                   UInt64,
    errors              UInt64,
    e2e_sum             Float64,
    e2e_sumsq           Float64,
    ttft_sum            Float64,
    ttft_sumsq          Float64,
    tpot_n              UInt64,
    tpot_sum            Float64,
    tpot_sumsq          Float64,
    cost_sum            Float64,
    cost_sumsq          Float64,
    prompt_tokens_sum   Float64,
    prompt_tokens_sumsq Float64,
    output_tokens_sum   Float64,
    output_tokens_sumsq Float64,
    e2e_p50             Float64,
    e2e_p95             Float64,
    e2e_p99             Float64,
    ttft_p50            Float64,
    ttft_p95            Float64,
    ttft_p99            Float64,
    emitted_at          DateTime64(3, 'UTC'),
    loaded_at           DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
PARTITION BY toYYYYMM(window_start)
ORDER BY (experiment, variant, window_start)
