-- Events the Flink job saw behind its watermark (their window had already been emitted).
-- They are not in window_stats / rum_window_stats; they are kept here, one row per
-- event_id, so raw = windowed + late reconciles exactly (see queries.reconciliation).
CREATE TABLE IF NOT EXISTS late_events
(
    event_id      String,
    type          LowCardinality(String),
    ts            DateTime64(3, 'UTC'),
    trace_id      String,
    experiment    LowCardinality(String),
    variant       LowCardinality(String),
    window_start  DateTime64(3, 'UTC'),
    watermark     DateTime64(3, 'UTC'),
    e2e_ms        Nullable(Float64),
    loaded_at     DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
PARTITION BY toYYYYMM(ts)
ORDER BY (type, event_id)
