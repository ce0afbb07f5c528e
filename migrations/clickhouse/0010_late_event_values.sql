-- A late inference event keeps every value its window sums, so /timeseries folds it into
-- its own 10 s window at query time (store/queries.py window_rows): windows end up exact
-- however late their events were. Rows loaded before this change have NULLs here and are
-- folded with their count and e2e only.
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS ttft_ms Nullable(Float64);
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS tpot_ms Nullable(Float64);
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS cost_usd Nullable(Float64);
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS prompt_tokens Nullable(Float64);
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS output_tokens Nullable(Float64);
ALTER TABLE late_events ADD COLUMN IF NOT EXISTS is_error UInt8 DEFAULT 0
