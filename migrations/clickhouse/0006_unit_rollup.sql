-- Per-unit rollup so results read ~one row per unit instead of every raw event.
--
-- Idempotent by construction: the loader copies each batch's events into two narrow
-- tables keyed for lookup (unit_events by unit, trace_facts by trace), then RECOMPUTES the
-- unit_stats row of every unit the batch touched from those tables (FINAL). A replayed
-- batch collapses into the same event rows and rewrites the same unit value; a late
-- label finds its unit through its trace's inference pointer in trace_facts. Nothing is
-- ever added to a running total, so redelivery cannot double-count and a crash between
-- the inserts and the recompute is repaired by the replay.

-- Inference events by (experiment, unit): the input of a unit's recompute.
CREATE TABLE IF NOT EXISTS unit_events
(
    experiment LowCardinality(String),
    unit_id    String,
    event_id   String,
    trace_id   String,
    variant    LowCardinality(String),
    ts         DateTime64(3, 'UTC'),
    e2e_ms     Nullable(Float64),
    ttft_ms    Nullable(Float64),
    tpot_ms    Nullable(Float64),
    cost_usd   Nullable(Float64),
    is_error   UInt8,
    loaded_at  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (experiment, unit_id, event_id);

-- Per trace: an inference pointer (experiment, unit_id), its labels and billing records.
CREATE TABLE IF NOT EXISTS trace_facts
(
    trace_id   String,
    type       LowCardinality(String),
    event_id   String,
    ts         DateTime64(3, 'UTC'),
    experiment LowCardinality(String),
    unit_id    String,
    correct    Nullable(UInt8),
    cost_usd   Nullable(Float64),
    loaded_at  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (trace_id, type, event_id);

-- One row per (experiment, variant, unit): the per-unit columns of ablab.platform.stats.metrics,
-- the unit's latency histograms (bucket → count) and its time span. `good` depends on the
-- experiment's SLOs; `slo_key` says which ones it was computed under (see rollup_slos).
-- The newest computation wins (computed_at); read with FINAL.
CREATE TABLE IF NOT EXISTS unit_stats
(
    experiment LowCardinality(String),
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
    e2e_buckets Array(UInt16), e2e_counts Array(UInt64),
    ttft_buckets Array(UInt16), ttft_counts Array(UInt64),
    min_ts DateTime64(3, 'UTC'), max_ts DateTime64(3, 'UTC'),
    slo_key String,
    computed_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
ORDER BY (experiment, variant, unit_id);

-- The SLOs `good` is computed under, per experiment (written by the results reader from the
-- registry; read by the loader at each recompute).
CREATE TABLE IF NOT EXISTS rollup_slos
(
    experiment LowCardinality(String),
    slo_key    String,
    e2e_ms     Nullable(Float64),
    ttft_ms    Nullable(Float64),
    tpot_ms    Nullable(Float64),
    updated_at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY experiment;

-- Backfill the lookup tables from what is already loaded (unit_stats is then computed by
-- the first results read, which finds those units missing).
INSERT INTO unit_events (experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd, is_error)
SELECT experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd,
       toUInt8(error IS NOT NULL AND error != '')
FROM raw_events FINAL WHERE type = 'inference';

INSERT INTO trace_facts (trace_id, type, event_id, ts, experiment, unit_id, correct, cost_usd)
SELECT trace_id, type, event_id, ts, if(type = 'inference', experiment, ''), if(type = 'inference', unit_id, ''),
       if(type = 'feedback', correct, NULL), if(type = 'cost', cost_usd, NULL)
FROM raw_events FINAL WHERE type IN ('inference', 'feedback', 'cost') AND trace_id != '';
