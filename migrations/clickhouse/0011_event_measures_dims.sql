-- Custom measures and segment dimensions of inference events, as maps: a new measure or
-- dimension is a new key, never a new column (no code change, no migration). Bounded at
-- the edge (streaming/events.py: at most MAX_MEASURES / MAX_DIMS keys, short names), so a
-- row's maps stay small. Rows loaded before this change read as empty maps.
ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS measures Map(LowCardinality(String), Float64);
ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS dims Map(LowCardinality(String), String)
