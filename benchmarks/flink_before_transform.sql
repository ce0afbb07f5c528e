-- The transformation, kept apart from sources and sinks so it runs on bounded input in
-- tests. Window: 10 s TUMBLE on event time. Late-data policy (also in job.py):
--   * an event is LATE when its ts is more than the out-of-orderness bound behind the
--     largest ts read before it from the same Kafka partition. The watermark (min over
--     partitions of max ts - bound) never passes an on-time event's window, so the window
--     never drops an on-time event, and late events go to late_rows, never into a window.
--     The rule depends only on each partition's order, so it is reproducible offline;
--   * duplicates (same event_id, e.g. a producer retry) count once: the first window
--     aggregation groups by event_id, the second aggregates the deduplicated rows;
--   * RUM joins its inference event by trace_id and counts in that event's window/variant;
--   * feedback is never windowed here (labels arrive minutes late): it is attributed to
--     its request's window and variant in ClickHouse by trace_id (store/queries.py).

CREATE TEMPORARY VIEW inference_valid AS
SELECT *,
       MAX(ts) OVER (PARTITION BY kafka_partition ORDER BY arrival
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - INTERVAL '${out_of_orderness_s}' SECOND AS seen_watermark
FROM inference_events
WHERE event_id IS NOT NULL AND ts IS NOT NULL AND trace_id IS NOT NULL
  AND experiment IS NOT NULL AND `variant` IS NOT NULL
  AND ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL AND prompt_tokens IS NOT NULL
  AND output_tokens IS NOT NULL AND cost_usd IS NOT NULL;

CREATE TEMPORARY VIEW rum_valid AS
SELECT *,
       MAX(ts) OVER (PARTITION BY kafka_partition ORDER BY arrival
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - INTERVAL '${out_of_orderness_s}' SECOND AS seen_watermark
FROM rum_events
WHERE event_id IS NOT NULL AND ts IS NOT NULL AND trace_id IS NOT NULL AND e2e_ms IS NOT NULL;

CREATE TEMPORARY VIEW late_rows AS
SELECT 'late' AS kind, 'inference' AS event_type, event_id, trace_id, experiment, `variant`, ts,
       seen_watermark AS `watermark`, e2e_ms
FROM inference_valid
WHERE ts <= seen_watermark
UNION ALL
SELECT 'late' AS kind, 'rum' AS event_type, event_id, trace_id, CAST(NULL AS STRING) AS experiment,
       CAST(NULL AS STRING) AS `variant`, ts, seen_watermark AS `watermark`, e2e_ms
FROM rum_valid
WHERE ts <= seen_watermark;

CREATE TEMPORARY VIEW inference_on_time AS
SELECT * FROM inference_valid WHERE ts > seen_watermark;

CREATE TEMPORARY VIEW rum_on_time AS
SELECT * FROM rum_valid WHERE ts > seen_watermark;

-- One row per event_id and window; window_time (window end - 1 ms) carries event time on.
CREATE TEMPORARY VIEW inference_dedup AS
SELECT window_time AS rt, experiment, `variant`, event_id, trace_id,
       MAX(ttft_ms) AS ttft_ms, MAX(e2e_ms) AS e2e_ms, MAX(tpot_ms) AS tpot_ms,
       MAX(prompt_tokens) AS prompt_tokens, MAX(output_tokens) AS output_tokens,
       MAX(cost_usd) AS cost_usd, MAX(CASE WHEN `error` IS NULL THEN 0 ELSE 1 END) AS is_error
FROM TABLE(TUMBLE(TABLE inference_on_time, DESCRIPTOR(ts), INTERVAL '10' SECOND))
GROUP BY window_start, window_end, window_time, experiment, `variant`, event_id, trace_id;

CREATE TEMPORARY VIEW rum_dedup AS
SELECT window_time AS rt, event_id, trace_id, MAX(e2e_ms) AS e2e_ms
FROM TABLE(TUMBLE(TABLE rum_on_time, DESCRIPTOR(ts), INTERVAL '10' SECOND))
GROUP BY window_start, window_end, window_time, event_id, trace_id;

CREATE TEMPORARY VIEW inference_window_stats AS
SELECT kind, experiment, `variant`, window_start, window_end, n, errors,
       e2e_sum, e2e_sumsq, ttft_sum, ttft_sumsq, tpot_n, tpot_sum, tpot_sumsq,
       cost_sum, cost_sumsq, prompt_tokens_sum, prompt_tokens_sumsq,
       output_tokens_sum, output_tokens_sumsq,
       e2e_q[1] AS e2e_p50, e2e_q[2] AS e2e_p95, e2e_q[3] AS e2e_p99,
       ttft_q[1] AS ttft_p50, ttft_q[2] AS ttft_p95, ttft_q[3] AS ttft_p99,
       emitted_at
FROM (
    SELECT 'inference' AS kind, experiment, `variant`, window_start, window_end,
           COUNT(*) AS n,
           CAST(SUM(is_error) AS BIGINT) AS errors,
           SUM(e2e_ms) AS e2e_sum, SUM(e2e_ms * e2e_ms) AS e2e_sumsq,
           SUM(ttft_ms) AS ttft_sum, SUM(ttft_ms * ttft_ms) AS ttft_sumsq,
           COUNT(tpot_ms) AS tpot_n,
           COALESCE(SUM(tpot_ms), 0.0) AS tpot_sum, COALESCE(SUM(tpot_ms * tpot_ms), 0.0) AS tpot_sumsq,
           SUM(cost_usd) AS cost_sum, SUM(cost_usd * cost_usd) AS cost_sumsq,
           CAST(SUM(prompt_tokens) AS DOUBLE) AS prompt_tokens_sum,
           CAST(SUM(prompt_tokens * prompt_tokens) AS DOUBLE) AS prompt_tokens_sumsq,
           CAST(SUM(output_tokens) AS DOUBLE) AS output_tokens_sum,
           CAST(SUM(output_tokens * output_tokens) AS DOUBLE) AS output_tokens_sumsq,
           PERCENTILE(e2e_ms, ARRAY[0.5, 0.95, 0.99]) AS e2e_q,
           PERCENTILE(ttft_ms, ARRAY[0.5, 0.95, 0.99]) AS ttft_q,
           CURRENT_TIMESTAMP AS emitted_at
    FROM TABLE(TUMBLE(TABLE inference_dedup, DESCRIPTOR(rt), INTERVAL '10' SECOND))
    GROUP BY window_start, window_end, experiment, `variant`
);

-- RUM counted in its inference event's window: the interval join matches deduplicated
-- rows whose window times lie within the RUM horizon of each other.
CREATE TEMPORARY VIEW rum_joined AS
SELECT i.rt AS rt, i.experiment, i.`variant`, r.e2e_ms
FROM rum_dedup r, inference_dedup i
WHERE r.trace_id = i.trace_id
  AND r.rt BETWEEN i.rt - INTERVAL '${rum_horizon_s}' SECOND AND i.rt + INTERVAL '${rum_horizon_s}' SECOND;

CREATE TEMPORARY VIEW rum_window_stats AS
SELECT kind, experiment, `variant`, window_start, window_end, n, e2e_sum, e2e_sumsq,
       q[1] AS e2e_p50, q[2] AS e2e_p95, q[3] AS e2e_p99, emitted_at
FROM (
    SELECT 'rum' AS kind, experiment, `variant`, window_start, window_end,
           COUNT(*) AS n, SUM(e2e_ms) AS e2e_sum, SUM(e2e_ms * e2e_ms) AS e2e_sumsq,
           PERCENTILE(e2e_ms, ARRAY[0.5, 0.95, 0.99]) AS q,
           CURRENT_TIMESTAMP AS emitted_at
    FROM TABLE(TUMBLE(TABLE rum_joined, DESCRIPTOR(rt), INTERVAL '10' SECOND))
    GROUP BY window_start, window_end, experiment, `variant`
);
