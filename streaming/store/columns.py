"""Insert column order of ``raw_events`` (migrations 0001, 0011 and 0014): the loader writes its
rows in this order and the rollup reads them back by position, so it lives with the store."""

RAW_COLUMNS: tuple[str, ...] = (
    "event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id",
    "ttft_ms", "e2e_ms", "tpot_ms", "prompt_tokens", "output_tokens", "device_s", "cost_usd",
    "price_version", "error", "strategy", "correct", "score", "source", "payload",
    "measures", "dims", "kafka_partition", "kafka_offset", "shadow_of", "shadow",
)
