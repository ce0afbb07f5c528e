"""Results, time series and attribution served from the ClickHouse store, plus guardrail automation."""
