"""One error hierarchy; the API turns each into ``application/problem+json``."""

from __future__ import annotations

import re

# A validator that checks several fields together (the stats engine's parser behind
# `metrics` and `guardrails`) names the exact one in its message: "metrics.segments[1]: …".
_NAMED = re.compile(r"^(?:Value error, )?([A-Za-z_]\w*(?:\.\w+|\[\d+\])*): ")


def refine_field(field: str, message: str) -> tuple[str, str]:
    """(field, message) of a validation error, taking the message's own dotted path when it
    lies at or under ``field`` (``""``/``"body"``: the whole body), with that path cut from
    the message. The API's problem responses and the dashboard's forms both use it."""
    named = _NAMED.match(message)
    if not named:
        return field, message.removeprefix("Value error, ")
    path = re.sub(r"\[(\d+)\]", r".\1", named.group(1))
    if field in ("", "body") or path == field or path.startswith(field + "."):
        return path, message[named.end():]
    return field, message.removeprefix("Value error, ")


class AblabError(Exception):
    status_code = 400
    title = "Bad request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(AblabError):
    status_code = 404
    title = "Not found"


class Conflict(AblabError):
    status_code = 409
    title = "Conflict"


class PreconditionFailed(AblabError):
    status_code = 412
    title = "Precondition failed"


class PreconditionRequired(AblabError):
    status_code = 428
    title = "Precondition required"


class Invalid(AblabError):
    status_code = 422
    title = "Validation failed"


class Unauthorized(AblabError):
    status_code = 401
    title = "Unauthorized"


class Forbidden(AblabError):
    status_code = 403
    title = "Forbidden"


class PayloadTooLarge(AblabError):
    status_code = 413
    title = "Payload too large"


class RequestTimeout(AblabError):
    status_code = 408
    title = "Request timeout"


class Unavailable(AblabError):
    status_code = 503
    title = "Service unavailable"


ALL_ERRORS: tuple[type[AblabError], ...] = (
    AblabError,
    NotFound,
    Conflict,
    PreconditionFailed,
    PreconditionRequired,
    Invalid,
    Unauthorized,
    Forbidden,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
)
