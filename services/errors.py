"""Domain errors shared by every service, each with its one HTTP status and error type.

Nothing here knows about HTTP frameworks: serving layers and backends raise these, and
``services.http.install_error_handlers`` turns them into ``corl.proto.ErrorResponse`` bodies.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    A subclass names its ``status`` in its header (``class X(ServiceError, status=409)``; its own subclasses
    keep it); its error ``type`` follows from ``STATUS_TYPES``."""

    status: ClassVar[int] = 500
    type: ClassVar[ErrorType] = "internal"
    default_field: ClassVar[str | None] = None

    def __init_subclass__(cls, status: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        cls.type = STATUS_TYPES.get(cls.status, "internal")

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field if field is not None else self.default_field


class InvalidInputError(ServiceError, status=422):
    """A field is out of bounds or unusable."""


class UnauthorizedError(ServiceError, status=401):
    """No token, or a wrong one."""


class ForbiddenError(ServiceError, status=403):
    """Authenticated, but not allowed."""


class NotFoundError(ServiceError, status=404):
    """What the request names is not here (a run, a model, an asset), or its route is off."""


class ConflictError(ServiceError, status=409):
    """A stale or duplicate version, a name taken, a source that does not take posts."""


class RateLimitedError(ServiceError, status=429):
    """Too many requests; ``retry_after_s``, when known, becomes the ``Retry-After`` header."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(ServiceError, status=503):
    """Not ready, timed out, or an engine failed: the server's problem, not the caller's."""
