"""The one error shape every service returns: ``{"error": {"type", "message", "field"}}``."""

from typing import Literal

from ._base import WireModel

ErrorType = Literal[
    "invalid_request",  # 422: a field is wrong; ``field`` names it
    "unauthorized",  # 401: no or wrong token
    "forbidden",  # 403: authenticated, but not allowed (e.g. a task leased to another grader)
    "not_found",  # 404
    "method_not_allowed",  # 405: the route exists; ``Allow`` lists its methods
    "conflict",  # 409: stale or duplicate weight version
    "payload_too_large",  # 413
    "rate_limited",  # 429
    "unavailable",  # 503: not ready, or the backend failed
    "internal",  # 500: a bug, never bad input
]


class ErrorDetail(WireModel):
    type: ErrorType
    message: str
    field: str | None = None


class ErrorResponse(WireModel):
    error: ErrorDetail
