"""Domain errors shared by every service, each with its one HTTP status and error type.

Nothing here knows about HTTP frameworks: serving layers and backends raise these, and
``services.http.install_error_handlers`` turns them into ``corl.proto.ErrorResponse`` bodies.
"""

from __future__ import annotations

from typing import ClassVar

from corl.proto import ErrorType

# The error type each HTTP status answers with (the one table: errors raised here and errors the framework
# raises, a 404 of an unknown route or a 405, share it); any other status is "internal".
STATUS_TYPES: dict[int, ErrorType] = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


class ServiceError(Exception):
    """A request that cannot be served; ``field`` names the request field at fault, when there is one.
    A subclass sets its ``status``; its error ``type`` follows from ``STATUS_TYPES``."""

    status: ClassVar[int] = 500
    type: ClassVar[ErrorType] = "internal"
    default_field: ClassVar[str | None] = None

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.type = STATUS_TYPES.get(cls.status, "internal")

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field if field is not None else self.default_field


class InvalidInputError(ServiceError):
    """A field is out of bounds or unusable (422)."""

    status = 422


class UnauthorizedError(ServiceError):
    """No token, or a wrong one (401)."""

    status = 401


class ForbiddenError(ServiceError):
    """Authenticated, but not allowed (403)."""

    status = 403


class NotFoundError(ServiceError):
    status = 404


class ConflictError(ServiceError):
    """A stale or duplicate version, a name taken, a source that does not take posts (409)."""

    status = 409


class RateLimitedError(ServiceError):
    """Too many requests (429); ``retry_after_s``, when known, becomes the ``Retry-After`` header."""

    status = 429

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(ServiceError):
    """Not ready, timed out, or an engine failed: the server's problem, not the caller's (503)."""

    status = 503
