"""Serving: the inference service (strategy → engines), events and sinks, the HTTP worker."""
