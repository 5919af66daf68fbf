"""Domain errors shared by every service, each with its one HTTP status and error type.

Nothing here knows about HTTP frameworks: serving layers and backends raise these, and
``services.http.install_error_handlers`` turns them into ``corl.proto.ErrorResponse`` bodies.
"""

from __future__ import annotations

from typing import ClassVar

from corl.proto import ErrorType


class ServiceError(Exception):
    """A request that cannot be served; ``field`` names the request field at fault, when there is one."""

    status: ClassVar[int] = 500
    type: ClassVar[ErrorType] = "internal"
    default_field: ClassVar[str | None] = None

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field if field is not None else self.default_field


class InvalidInputError(ServiceError):
    """A field is out of bounds or unusable (422)."""

    status, type = 422, "invalid_request"


class UnauthorizedError(ServiceError):
    """No token, or a wrong one (401)."""

    status, type = 401, "unauthorized"


class ForbiddenError(ServiceError):
    """Authenticated, but not allowed (403)."""

    status, type = 403, "forbidden"


class NotFoundError(ServiceError):
    status, type = 404, "not_found"


class ConflictError(ServiceError):
    """A stale or duplicate version, a name taken, a source that does not take posts (409)."""

    status, type = 409, "conflict"


class RateLimitedError(ServiceError):
    """Too many requests (429); ``retry_after_s``, when known, becomes the ``Retry-After`` header."""

    status, type = 429, "rate_limited"

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(ServiceError):
    """Not ready, timed out, or an engine failed: the server's problem, not the caller's (503)."""

    status, type = 503, "unavailable"
