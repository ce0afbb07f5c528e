"""Kafka → ClickHouse loader."""
