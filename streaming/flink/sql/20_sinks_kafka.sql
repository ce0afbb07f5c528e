-- Window rows and late events go back to Kafka (Flink has no usable ClickHouse sink from
-- Python). With checkpointing on, 'exactly-once' writes each checkpoint's rows in one
-- Kafka transaction committed when the checkpoint completes; the loader reads
-- read_committed, so rows of a crashed attempt are never seen. Both kinds share the
-- windows topic and are told apart by `kind`; each sink has its own transactional ids.
CREATE TEMPORARY TABLE inference_window_sink (
    kind STRING, experiment STRING, `variant` STRING,
    window_start TIMESTAMP_LTZ(3), window_end TIMESTAMP_LTZ(3),
    n BIGINT, errors BIGINT,
    ${window_sink_columns},
    emitted_at TIMESTAMP_LTZ(3)
) WITH (
    'connector' = 'kafka',
    'topic' = '${windows_topic}',
    'properties.bootstrap.servers' = '${bootstrap}',
    'properties.transaction.timeout.ms' = '${transaction_timeout_ms}',
    'sink.delivery-guarantee' = '${delivery_guarantee}',
    'sink.transactional-id-prefix' = '${transactional_id_prefix}-inference',
    'format' = 'json',
    'json.timestamp-format.standard' = 'ISO-8601'
);

-- A late event carries every value its window sums (the catalogue's late fields): the store
-- folds it into that window.
CREATE TEMPORARY TABLE late_sink (
    kind STRING, event_type STRING, event_id STRING, trace_id STRING,
    experiment STRING, `variant` STRING, ts TIMESTAMP_LTZ(3), `watermark` TIMESTAMP_LTZ(3),
    ${late_sink_columns}, is_error INT
) WITH (
    'connector' = 'kafka',
    'topic' = '${windows_topic}',
    'properties.bootstrap.servers' = '${bootstrap}',
    'properties.transaction.timeout.ms' = '${transaction_timeout_ms}',
    'sink.delivery-guarantee' = '${delivery_guarantee}',
    'sink.transactional-id-prefix' = '${transactional_id_prefix}-late',
    'format' = 'json',
    'json.timestamp-format.standard' = 'ISO-8601'
);

-- Records kept out of every window (an event time beyond the watermark bound, a value out
-- of physical bounds): the loader dead-letters them with `field` and `message`.
CREATE TEMPORARY TABLE rejected_sink (
    kind STRING, field STRING, message STRING, event_id STRING, trace_id STRING,
    experiment STRING, `variant` STRING, ts TIMESTAMP_LTZ(3)
) WITH (
    'connector' = 'kafka',
    'topic' = '${windows_topic}',
    'properties.bootstrap.servers' = '${bootstrap}',
    'properties.transaction.timeout.ms' = '${transaction_timeout_ms}',
    'sink.delivery-guarantee' = '${delivery_guarantee}',
    'sink.transactional-id-prefix' = '${transactional_id_prefix}-rejected',
    'format' = 'json',
    'json.timestamp-format.standard' = 'ISO-8601'
);
