"""The local stack: start, stop and inspect every ablab process on one machine."""
