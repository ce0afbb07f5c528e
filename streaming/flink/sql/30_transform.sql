-- The transformation, kept apart from sources and sinks so it runs on bounded input in
-- tests. Window: 10 s TUMBLE on event time. Late-data policy (also in job.py):
--   * records out of bounds (an event time beyond max_future_s, a value out of physical
--     bounds) are rejected first (rejected_rows) and never reach a window or a watermark;
--   * duplicates (same event_id, e.g. a producer retry or a spool replay) count once: the
--     first arrival of each event_id is kept (Flink's deduplication, one flag of state per
--     event_id, kept for table.exec.state.ttl = JobConfig.dedup_ttl_s), before any window;
--   * an event is LATE when its ts is at or more than the out-of-orderness bound behind the
--     largest ts read before it from the same Kafka partition (reproducible offline from each
--     partition's order), OR when its ts is at or behind the current watermark (an event on
--     a partition that was idle and woke up behind the watermark: its window may already be
--     closed). Late events go to late_rows, never into a window; every other event is ahead
--     of the watermark, so its window is still open and counts it. Nothing is dropped;
--   * RUM (client-side latency, seconds late) and feedback (labels, minutes late) are not
--     read here: both are attributed to their request's window and variant in ClickHouse by
--     trace_id (store/queries.py), however late they arrive. An interval join here buffered
--     every request for the RUM horizon and was the job's largest cost (1.5-1.6x,
--     docs/benchmarks/pipeline.md).
-- Performance (docs/benchmarks/pipeline.md): each view below is planned once and shared by
-- every INSERT (sub-plan reuse), so each event crosses each keyed exchange once; mini-batch
-- stays off because it makes the deduplication emit updates (retracting aggregates).

-- Screening: an event time more than max_future_s ahead of the processing clock, a value
-- outside physical bounds, or a first token after the last (what the edge refuses, with the
-- same field named; a producer writing to Kafka directly bypasses it), is rejected here, before the de-duplication and the per-partition
-- maximum of the late rule, so it can neither move a watermark nor poison a window's sums
-- (1.7e308 squared is Infinity, which JSON cannot carry). A record without event_id (a
-- direct producer) gets the id the edge would derive (ablab.platform.events.derive_event_id:
-- the first 128 bits of SHA-256 over 'inference', a unit separator and the trace_id, in hex),
-- so its redeliveries collapse here as they do in raw_events.
CREATE TEMPORARY VIEW inference_screened AS
SELECT COALESCE(event_id, SUBSTRING(SHA256(CONCAT('inference', CHR(31), trace_id)) FROM 1 FOR 32)) AS event_id,
       ts, trace_id, experiment, `variant`, ${fields}, `error`, kafka_partition, received, arrival,
       CASE
           WHEN ts > arrival + INTERVAL '${max_future_interval}' DAY TO SECOND(3) THEN 'ts'
           ${bound_checks}
       END AS rejected_field
FROM inference_events
-- A shadow request (shadow_of set) is compared with its primary in ClickHouse, never
-- counted in a variant's windows. Heartbeats (no trace_id) only move the watermark.
WHERE shadow_of IS NULL AND ts IS NOT NULL AND trace_id IS NOT NULL
  AND experiment IS NOT NULL AND `variant` IS NOT NULL
  AND ${required_fields};

CREATE TEMPORARY VIEW rejected_rows AS
SELECT 'rejected' AS kind, rejected_field AS field,
       CASE
           WHEN rejected_field = 'ts' THEN 'event time more than ${max_future_s} s ahead of the processing clock'
           ${order_messages}
           ELSE 'outside physical bounds (latencies 0..${max_latency_text} ms, cost 0..${max_cost_text}, tokens 0..${max_tokens})'
       END AS message,
       event_id, trace_id, experiment, `variant`, CAST(ts AS TIMESTAMP_LTZ(3)) AS ts
FROM inference_screened
WHERE rejected_field IS NOT NULL;

-- The late rule comes next, straight off the screening: a keyed exchange by kafka_partition
-- is one channel from the subtask that reads the partition, so the rule sees each
-- partition in its Kafka order at any parallelism. (After the exchange by event_id of the
-- de-duplication, a partition's events reach the rule over as many channels as there are
-- subtasks, interleaved by network buffering: at parallelism 2 it called a third of an
-- on-time stream late.) A duplicate carries its original's ts, which the partition has
-- already seen, so it moves no partition's maximum: the flags equal the rule applied
-- after de-duplication, as reference.late_ids computes it.
-- seen_watermark: the partition's largest ts so far minus the bound (a plain timestamp,
-- not an event-time attribute, hence the CAST), each ts counted at most as the moment its
-- record was received (and as the processing clock), as the watermark counts it: one event
-- stamped 120 s ahead (inside max_future_s) would otherwise make every on-time event after
-- it on its partition late until real time caught up. The record timestamp, not the job's
-- clock, is what keeps the rule reproducible offline (reference.late_ids) and the same when
-- the job catches up on a backlog; on events stamped before they were received it is the
-- partition's largest ts.
CREATE TEMPORARY VIEW inference_seen AS
SELECT *,
       ts <= seen_watermark OR ts <= CURRENT_WATERMARK(ts) IS TRUE AS is_late
FROM (
    SELECT event_id, ts, trace_id, experiment, `variant`, ${fields}, CASE WHEN `error` IS NULL THEN 0 ELSE 1 END AS is_error, kafka_partition, received, arrival,
           CAST(MAX(LEAST(ts, received, arrival)) OVER (PARTITION BY kafka_partition ORDER BY arrival
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                - INTERVAL '${out_of_orderness_s}' SECOND AS TIMESTAMP_LTZ(3)) AS seen_watermark
    FROM inference_screened
    WHERE rejected_field IS NULL
);

CREATE TEMPORARY VIEW inference_checked AS
SELECT event_id, ts, trace_id, experiment, `variant`, ${fields}, is_error, kafka_partition, arrival, seen_watermark, is_late
FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY event_id ORDER BY arrival) AS arrival_rank
    FROM inference_seen
)
WHERE arrival_rank = 1;

CREATE TEMPORARY VIEW late_rows AS
SELECT 'late' AS kind, 'inference' AS event_type, event_id, trace_id, experiment, `variant`,
       CAST(ts AS TIMESTAMP_LTZ(3)) AS ts, seen_watermark AS `watermark`, ${late_fields}, is_error
FROM inference_checked
WHERE is_late;

CREATE TEMPORARY VIEW inference_on_time AS
SELECT * FROM inference_checked WHERE NOT is_late;

CREATE TEMPORARY VIEW inference_window_stats AS
SELECT kind, experiment, `variant`, window_start, window_end, n, errors,
       ${window_columns},
       emitted_at
FROM (
    SELECT 'inference' AS kind, experiment, `variant`, window_start, window_end,
           COUNT(*) AS n,
           CAST(SUM(is_error) AS BIGINT) AS errors,
           ${window_aggregates},
           CURRENT_TIMESTAMP AS emitted_at
    FROM TABLE(TUMBLE(TABLE inference_on_time, DESCRIPTOR(ts), INTERVAL '10' SECOND))
    GROUP BY window_start, window_end, experiment, `variant`
);
