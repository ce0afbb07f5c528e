-- The per-unit rollup serves custom metrics and segment breakdowns (ablab.platform.stats.unit_agg
-- rollup_columns states which). Nothing here names a measure or a dimension: a new measure
-- or dimension is a new map key, never a new column or migration.
--
-- rollup_events keeps every per-request source a custom metric can read (the remaining
-- catalogue fields, measures, dims); rollup_traces/rollup_labels keep the judge score.
ALTER TABLE rollup_events ADD COLUMN IF NOT EXISTS prompt_tokens Nullable(Float64);
ALTER TABLE rollup_events ADD COLUMN IF NOT EXISTS output_tokens Nullable(Float64);
ALTER TABLE rollup_events ADD COLUMN IF NOT EXISTS device_s Nullable(Float64);
ALTER TABLE rollup_events ADD COLUMN IF NOT EXISTS measures Map(LowCardinality(String), Float64);
ALTER TABLE rollup_events ADD COLUMN IF NOT EXISTS dims Map(LowCardinality(String), String);
ALTER TABLE rollup_traces ADD COLUMN IF NOT EXISTS score Nullable(Float64);
ALTER TABLE rollup_labels ADD COLUMN IF NOT EXISTS score Nullable(Float64);

-- Per unit, for every nullable source present on some request (key: the source's name as a
-- custom metric names it — e2e_ms, output_tokens, score, correct, measures.<name>, ...):
-- Σ value, the count of requests with a value, Σ value², and Σ cost_usd over those requests
-- (a ratio of cost to that source). `rollup_version` says which layout computed the row:
-- older rows are recomputed by the maintenance pass (ensure_fresh) before they are read.
ALTER TABLE unit_stats ADD COLUMN IF NOT EXISTS src_sum Map(LowCardinality(String), Float64);
ALTER TABLE unit_stats ADD COLUMN IF NOT EXISTS src_n Map(LowCardinality(String), Float64);
ALTER TABLE unit_stats ADD COLUMN IF NOT EXISTS src_sq Map(LowCardinality(String), Float64);
ALTER TABLE unit_stats ADD COLUMN IF NOT EXISTS src_cost Map(LowCardinality(String), Float64);
ALTER TABLE unit_stats ADD COLUMN IF NOT EXISTS rollup_version UInt8 DEFAULT 0;

-- The same columns per (unit, dimension, value) for every dimension the unit's requests
-- carry; a request of the unit without that dimension counts under "(none)". Recomputed with
-- its unit (the newest computation wins). A unit none of whose requests carry a dimension has
-- no row for it: all its requests are "(none)", its unit_stats row.
CREATE TABLE IF NOT EXISTS unit_segment_stats
(
    experiment LowCardinality(String),
    dim        LowCardinality(String),
    value      String,
    variant    LowCardinality(String),
    unit_id    String,
    events     UInt64,
    requests   Float64,
    errors     Float64,
    e2e_ms_sum Float64, e2e_ms_n Float64, e2e_ms_sq Float64,
    ttft_ms_sum Float64, ttft_ms_n Float64, ttft_ms_sq Float64,
    tpot_ms_sum Float64, tpot_ms_n Float64,
    cost_usd_sum Float64,
    labeled Float64, correct Float64, labeled_cost_usd_sum Float64,
    good Float64,
    src_sum Map(LowCardinality(String), Float64),
    src_n Map(LowCardinality(String), Float64),
    src_sq Map(LowCardinality(String), Float64),
    src_cost Map(LowCardinality(String), Float64),
    slo_key String,
    computed_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
ORDER BY (experiment, dim, variant, unit_id, value)
SETTINGS index_granularity = 1024;

-- Backfill the new source columns of events loaded before this file (the copies are keyed by
-- event_id and the newer load wins); unit_stats rows then recompute as rollup_version 0.
INSERT INTO rollup_events (experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd, is_error,
                           prompt_tokens, output_tokens, device_s, measures, dims)
SELECT experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd,
       toUInt8(error IS NOT NULL AND error != ''), prompt_tokens, output_tokens, device_s, measures, dims
FROM raw_events FINAL
WHERE type = 'inference' AND (prompt_tokens IS NOT NULL OR output_tokens IS NOT NULL OR device_s IS NOT NULL
                              OR length(measures) > 0 OR length(dims) > 0);

INSERT INTO rollup_traces (trace_id, type, event_id, ts, experiment, unit_id, correct, cost_usd, score)
SELECT trace_id, type, event_id, ts, '', '', correct, NULL, score
FROM raw_events FINAL WHERE type = 'feedback' AND trace_id != '' AND score IS NOT NULL;

INSERT INTO rollup_labels (experiment, unit_id, trace_id, type, event_id, ts, correct, cost_usd, score)
SELECT l.experiment, l.unit_id, l.trace_id, l.type, l.event_id, l.ts, l.correct, l.cost_usd, r.score
FROM (SELECT experiment, unit_id, trace_id, type, event_id, ts, correct, cost_usd FROM rollup_labels FINAL WHERE type = 'feedback') AS l
INNER JOIN (SELECT event_id, score FROM raw_events FINAL WHERE type = 'feedback' AND score IS NOT NULL) AS r
    ON r.event_id = l.event_id
