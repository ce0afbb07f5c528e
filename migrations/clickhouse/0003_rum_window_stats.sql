-- Client-side (RUM) latency joined in Flink to the worker's inference event by trace_id and
-- counted in the window and variant of that inference event.
CREATE TABLE IF NOT EXISTS rum_window_stats
(
    experiment     LowCardinality(String),
    variant        LowCardinality(String),
    window_start   DateTime64(3, 'UTC'),
    window_end     DateTime64(3, 'UTC'),
    n              UInt64,
    e2e_sum        Float64,
    e2e_sumsq      Float64,
    e2e_p50        Float64,
    e2e_p95        Float64,
    e2e_p99        Float64,
    emitted_at     DateTime64(3, 'UTC'),
    loaded_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
PARTITION BY toYYYYMM(window_start)
ORDER BY (experiment, variant, window_start)
