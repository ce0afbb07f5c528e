"""The Python SDK: local assignment from ``/v1/sdk/config``, no network on the hot path;
instrumentation (``track``, ``tracked``, ``instrument_openai``) for calls made directly."""

from ablab.platform.sdk.client import AblabClient
from ablab.platform.sdk.instrument import Call, current_call, track, tracked
from ablab.platform.sdk.openai_wrap import instrument_openai
from ablab.platform.sdk.sinks import ExposureSink, HttpEventSink, ListSink, NullSink

__all__ = [
    "AblabClient",
    "Call",
    "ExposureSink",
    "HttpEventSink",
    "ListSink",
    "NullSink",
    "current_call",
    "instrument_openai",
    "track",
    "tracked",
]
