"""The Python SDK: local assignment from ``/v1/sdk/config``, no network on the hot path."""

from ablab.platform.sdk.client import AblabClient
from ablab.platform.sdk.sinks import ExposureSink, HttpEventSink, ListSink, NullSink

__all__ = ["AblabClient", "ExposureSink", "HttpEventSink", "ListSink", "NullSink"]
