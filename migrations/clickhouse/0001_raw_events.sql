-- Every valid event the loader read, one row per event_id.
-- ReplacingMergeTree on event_id: a redelivered or replayed record collapses into one row
-- (read with FINAL, or GROUP BY event_id, for exact counts before merges run).
CREATE TABLE IF NOT EXISTS raw_events
(
    event_id      String,
    type          LowCardinality(String),
    ts            DateTime64(3, 'UTC'),
    trace_id      String,
    experiment    LowCardinality(String),
    variant       LowCardinality(String),
    unit_id       String,
    ttft_ms       Nullable(Float64),
    e2e_ms        Nullable(Float64),
    tpot_ms       Nullable(Float64),
    prompt_tokens Nullable(UInt32),
    output_tokens Nullable(UInt32),
    device_s      Nullable(Float64),
    cost_usd      Nullable(Float64),
    price_version String,
    error         Nullable(String),
    strategy      String,
    correct       Nullable(UInt8),
    score         Nullable(Float64),
    source        LowCardinality(String),
    payload       String,
    kafka_partition Int32,
    kafka_offset  Int64,
    loaded_at     DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
PARTITION BY toYYYYMM(ts)
ORDER BY (type, event_id)
