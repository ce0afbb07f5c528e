-- The rollup in two levels, so that a unit's recompute no longer reads its whole history.
--
-- Before this file a touched unit was recomputed from every request it ever made, so with a
-- fixed set of users each batch read more than the last (276 → 704 ms per 20,000-record
-- batch between 64 and 384 requests per unit, benchmarks/bench_rollup_history.py). Now the
-- loader recomputes the touched units' *hours* from their requests (unit_hour_stats,
-- unit_hour_segment_stats: one row per unit and hour of its requests), then each touched
-- unit's row (unit_stats, unit_segment_stats, unchanged) as the sum of its hours' rows: every
-- per-unit column is a sum, a minimum or a maximum over requests. Results still read one row
-- per unit; a recompute reads one hour of requests and one row per hour the unit was active.
--
-- `hour` is the request's hour since the epoch, rounded down (negative before 1970): in
-- rollup_events and the hour tables the request's own, in rollup_labels the hour of the
-- request a label or bill belongs to. Python's copy of the expression is
-- ablab.streaming.store.rollup.hour_of, checked against this one by the tests.
--
-- Nothing dropped here is primary data: rollup_events is rebuilt from raw_events,
-- rollup_labels from rollup_traces, and the hour tables are computed by the maintenance pass
-- (ensure_fresh), which the marker row below asks for. Each statement drops and rebuilds (or
-- inserts a row that collapses), so a file cut short by a crash is simply run again.

DROP TABLE IF EXISTS rollup_events;

CREATE TABLE rollup_events
(
    experiment    LowCardinality(String),
    unit_id       String,
    hour          Int32 DEFAULT toInt32(floor(toUnixTimestamp64Milli(ts) / 3600000)),
    event_id      String,
    trace_id      String,
    variant       LowCardinality(String),
    ts            DateTime64(3, 'UTC'),
    e2e_ms        Nullable(Float64),
    ttft_ms       Nullable(Float64),
    tpot_ms       Nullable(Float64),
    cost_usd      Nullable(Float64),
    is_error      UInt8,
    prompt_tokens Nullable(Float64),
    output_tokens Nullable(Float64),
    device_s      Nullable(Float64),
    measures      Map(LowCardinality(String), Float64),
    dims          Map(LowCardinality(String), String),
    loaded_at     DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (experiment, unit_id, hour, event_id)
SETTINGS index_granularity = 256;

INSERT INTO rollup_events (experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd, is_error,
                           prompt_tokens, output_tokens, device_s, measures, dims)
SELECT experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd,
       toUInt8(error IS NOT NULL AND error != ''), prompt_tokens, output_tokens, device_s, measures, dims
FROM raw_events FINAL WHERE type = 'inference';

DROP TABLE IF EXISTS rollup_labels;

CREATE TABLE rollup_labels
(
    experiment LowCardinality(String),
    unit_id    String,
    hour       Int32,
    trace_id   String,
    type       LowCardinality(String),
    event_id   String,
    ts         DateTime64(3, 'UTC'),
    correct    Nullable(UInt8),
    cost_usd   Nullable(Float64),
    score      Nullable(Float64),
    loaded_at  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (experiment, unit_id, hour, trace_id, type, event_id)
SETTINGS index_granularity = 256;

INSERT INTO rollup_labels (experiment, unit_id, hour, trace_id, type, event_id, ts, correct, cost_usd, score)
SELECT p.experiment, p.unit_id, p.hour, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.cost_usd, f.score
FROM (SELECT trace_id, type, event_id, ts, correct, cost_usd, score FROM rollup_traces FINAL
      WHERE type IN ('feedback', 'cost')) AS f
INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id, toInt32(floor(toUnixTimestamp64Milli(ts) / 3600000)) AS hour FROM rollup_traces
            WHERE type = 'inference') AS p ON p.trace_id = f.trace_id;

DROP TABLE IF EXISTS unit_hour_stats;

-- One row per (experiment, variant, unit, hour): unit_stats' columns over the unit's requests
-- of that hour. The newest computation wins (computed_at); read with FINAL. 256-row granules,
-- as in 0008: a recompute reads the hours of a few hundred random units.
CREATE TABLE unit_hour_stats
(
    experiment LowCardinality(String),
    variant    LowCardinality(String),
    unit_id    String,
    hour       Int32,
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
    e2e_buckets Array(UInt16), e2e_counts Array(UInt64),
    ttft_buckets Array(UInt16), ttft_counts Array(UInt64),
    min_ts DateTime64(3, 'UTC'), max_ts DateTime64(3, 'UTC'),
    slo_key String,
    rollup_version UInt8 DEFAULT 0,
    computed_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
ORDER BY (experiment, variant, unit_id, hour)
SETTINGS index_granularity = 256;

-- One stale marker row per experiment with loaded requests (no variant, no unit): results read
-- raw_events until the maintenance pass (ensure_fresh) has computed the experiment's hours,
-- recomputed its units from them and removed the marker.
INSERT INTO unit_stats (experiment, variant, unit_id, events, requests, errors, e2e_ms_sum, e2e_ms_n, e2e_ms_sq,
                        ttft_ms_sum, ttft_ms_n, ttft_ms_sq, tpot_ms_sum, tpot_ms_n, cost_usd_sum, labeled, correct,
                        labeled_cost_usd_sum, good, min_ts, max_ts, slo_key, rollup_version, computed_at)
SELECT DISTINCT experiment, '', '', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
       toDateTime64(0, 3, 'UTC'), toDateTime64(0, 3, 'UTC'), '', 0, toDateTime64(0, 6, 'UTC')
FROM rollup_events;

DROP TABLE IF EXISTS unit_hour_segment_stats;

-- unit_segment_stats' columns per (unit, hour, dimension, value) for every dimension the
-- requests of that unit and hour carry; a request of that hour without the dimension counts
-- under "(none)". An hour none of whose requests carry a dimension has no row for it; when the
-- unit carries it in another hour, that hour's requests count under "(none)" in the unit's
-- row (its unit_hour_stats row is added there).
CREATE TABLE unit_hour_segment_stats
(
    experiment LowCardinality(String),
    dim        LowCardinality(String),
    value      String,
    variant    LowCardinality(String),
    unit_id    String,
    hour       Int32,
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
ORDER BY (experiment, dim, variant, unit_id, hour, value)
SETTINGS index_granularity = 256
