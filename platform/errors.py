"""One error hierarchy; the API turns each into ``application/problem+json``."""

from __future__ import annotations


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
