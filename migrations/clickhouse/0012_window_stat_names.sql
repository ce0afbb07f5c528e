-- One naming scheme for statistics: <field>_<stat> with the field's full name, as the per-unit
-- rollup (e2e_ms_sum), the timeseries metrics (e2e_ms_p95) and the field catalogue
-- (ablab.platform.fields.window_column) name them. window_stats used short names (e2e_sum,
-- tpot_n, cost_sumsq). A rename is metadata only (no data is rewritten); IF EXISTS makes a
-- re-run after a crash a no-op. The loader still reads window records a job started before
-- this wrote under the old names (fields.LEGACY_WINDOW_NAMES).
ALTER TABLE window_stats RENAME COLUMN IF EXISTS e2e_sum TO e2e_ms_sum;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS e2e_sumsq TO e2e_ms_sumsq;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS e2e_p50 TO e2e_ms_p50;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS e2e_p95 TO e2e_ms_p95;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS e2e_p99 TO e2e_ms_p99;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS ttft_sum TO ttft_ms_sum;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS ttft_sumsq TO ttft_ms_sumsq;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS ttft_p50 TO ttft_ms_p50;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS ttft_p95 TO ttft_ms_p95;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS ttft_p99 TO ttft_ms_p99;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS tpot_n TO tpot_ms_n;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS tpot_sum TO tpot_ms_sum;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS tpot_sumsq TO tpot_ms_sumsq;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS cost_sum TO cost_usd_sum;
ALTER TABLE window_stats RENAME COLUMN IF EXISTS cost_sumsq TO cost_usd_sumsq
