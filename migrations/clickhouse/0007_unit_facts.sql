-- Labels and billing records placed at their unit, so a unit's recompute reads primary-key
-- ranges only (0006 read them from trace_facts by an IN-list of the unit's traces, which on
-- a 10 M-event store touches every granule: ~5 CPU-s per loader batch). The loader writes a
-- row here when a label/billing record and its trace's inference pointer have both been
-- loaded, whichever came first; keyed by event_id, so a replay collapses.
CREATE TABLE IF NOT EXISTS unit_facts
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
ORDER BY (experiment, unit_id, trace_id, type, event_id);

-- Backfill from what 0006 already holds.
INSERT INTO unit_facts (experiment, unit_id, trace_id, type, event_id, ts, correct, cost_usd)
SELECT p.experiment, p.unit_id, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.cost_usd
FROM (SELECT trace_id, type, event_id, ts, correct, cost_usd FROM trace_facts FINAL WHERE type IN ('feedback', 'cost')) AS f
INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id FROM trace_facts WHERE type = 'inference') AS p
    ON p.trace_id = f.trace_id;
