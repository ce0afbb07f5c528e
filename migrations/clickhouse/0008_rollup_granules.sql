-- The rollup's three lookup tables again, with 256-row granules instead of 8,192.
-- A loader batch recomputes a few hundred random units (and looks up a few thousand random
-- traces); with 8,192-row granules each of those lands in its own granule, so a batch read
-- nearly the whole table (2.8 CPU-s per 2,000-event batch on a 10 M-event store). With
-- 256-row granules it reads about one small granule per unit or trace. index_granularity
-- cannot be changed in place: copy into new tables, then empty the old ones (kept, empty,
-- so that re-running this file after a crash copies nothing twice: the copies are keyed by
-- event_id and collapse anyway).

CREATE TABLE IF NOT EXISTS rollup_events
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
ORDER BY (experiment, unit_id, event_id)
SETTINGS index_granularity = 256;

CREATE TABLE IF NOT EXISTS rollup_traces
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
ORDER BY (trace_id, type, event_id)
SETTINGS index_granularity = 256;

CREATE TABLE IF NOT EXISTS rollup_labels
(
    experiment LowCardinality(String),
    unit_id    String,
    trace_id   String,
    type       LowCardinality(String),
    event_id   String,
    ts         DateTime64(3, 'UTC'),
    correct    Nullable(UInt8),
    cost_usd   Nullable(Float64),
    loaded_at  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (experiment, unit_id, trace_id, type, event_id)
SETTINGS index_granularity = 256;

INSERT INTO rollup_events SELECT * FROM unit_events;

INSERT INTO rollup_traces SELECT * FROM trace_facts;

INSERT INTO rollup_labels SELECT * FROM unit_facts;

TRUNCATE TABLE IF EXISTS unit_events;

TRUNCATE TABLE IF EXISTS trace_facts;

TRUNCATE TABLE IF EXISTS unit_facts;
