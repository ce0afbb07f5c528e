-- Kafka source: the inference topic (ablab.streaming.kafka.topics); its measured fields are the
-- catalogue's Flink fields (ablab.platform.fields), rendered by job.py. RUM and feedback are not
-- read here: both are attributed to their request's window in ClickHouse, by trace_id.
-- Event time is `ts`; the watermark trails the largest ts seen by the bounded
-- out-of-orderness, each ts counted at most as the moment its record was `received` (the
-- Kafka record timestamp: the edge stamps when it received the event, and keeps that through
-- its spool) and as the processing clock. So an event stamped by a clock running minutes
-- ahead (within max_future_s, so the edge accepts it) keeps its own window open until real
-- time reaches it, but cannot move the watermark past the events received on time after it,
-- which would close their windows early. A record whose ts is further ahead than max_future_s of the processing
-- clock gives no watermark (NULL: Flink keeps the partition's current one), so a record the
-- edge never saw (a producer writing here directly, ts 9999-12-31) cannot move a
-- partition's watermark at all; 30_transform.sql routes such records to rejected rows. Bad JSON and
-- wrong-typed fields become NULLs (ignore-parse-errors) and are filtered out in
-- 30_transform.sql; the loader dead-letters the same records.
-- Fetches wait for fetch_min_bytes or fetch_max_wait_ms (ablab.streaming.kafka.consumer): a job
-- that keeps up otherwise makes a fetch request per few records, which costs it and the broker.
CREATE TEMPORARY TABLE inference_events (
    event_id      STRING,
    ts            TIMESTAMP_LTZ(3),
    trace_id      STRING,
    experiment    STRING,
    `variant`     STRING,
    ${source_fields},
    `error`       STRING,
    shadow_of     STRING,
    kafka_partition INT METADATA FROM 'partition' VIRTUAL,
    received      TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,
    arrival       AS PROCTIME(),
    WATERMARK FOR ts AS CASE WHEN ts <= CAST(CURRENT_TIMESTAMP AS TIMESTAMP_LTZ(3))
                                          + INTERVAL '${max_future_interval}' DAY TO SECOND(3)
                             THEN LEAST(ts, received, CAST(CURRENT_TIMESTAMP AS TIMESTAMP_LTZ(3)))
                                  - INTERVAL '${out_of_orderness_s}' SECOND END
) WITH (
    'connector' = 'kafka',
    'topic' = '${inference_topic}',
    'properties.bootstrap.servers' = '${bootstrap}',
    'properties.group.id' = '${group_id}',
    'properties.isolation.level' = 'read_committed',
    'properties.fetch.min.bytes' = '${fetch_min_bytes}',
    'properties.fetch.max.wait.ms' = '${fetch_max_wait_ms}',
    'scan.startup.mode' = 'earliest-offset',
    'scan.bounded.mode' = '${bounded_mode}',
    'format' = 'json',
    'json.ignore-parse-errors' = 'true',
    'json.timestamp-format.standard' = 'ISO-8601'
);
