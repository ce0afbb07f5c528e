-- RUM is attributed to its request's window at query time (store/queries.py, by trace_id),
-- as feedback is; the Flink job no longer writes RUM window rows. The table held only rows
-- derived from raw_events, which keeps every RUM event.
DROP TABLE IF EXISTS rum_window_stats
