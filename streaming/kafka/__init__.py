"""Kafka side of ablab: topic names, the local broker runner, the emitter and consumers."""
