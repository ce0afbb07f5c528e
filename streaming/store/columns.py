"""Insert column order of ``raw_events`` (migrations 0001, 0011 and 0014): the loader writes its
rows in this order and the rollup reads them back by position, so it lives with the store. The
measured fields are the field catalogue's (``ablab.platform.fields.EVENT_FIELDS``), in its order."""

from ablab.platform.fields import EVENT_FIELDS

RAW_KEY: tuple[str, ...] = ("event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id")
RAW_REST: tuple[str, ...] = (
    "price_version", "error", "strategy", "correct", "source", "payload",
    "measures", "dims", "kafka_partition", "kafka_offset", "shadow_of", "shadow",
)
RAW_COLUMNS: tuple[str, ...] = (*RAW_KEY, *EVENT_FIELDS, *RAW_REST)
