-- Records the loader refused (malformed JSON, wrong types, unknown experiment, oversized),
-- also forwarded to the dead-letter topic. Keyed by their Kafka position: a reload of the
-- same record does not count twice.
CREATE TABLE IF NOT EXISTS dead_letters
(
    topic           LowCardinality(String),
    kafka_partition Int32,
    kafka_offset    Int64,
    field           String,
    message         String,
    raw             String,
    loaded_at       DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (topic, kafka_partition, kafka_offset)
