"""Domain errors of the model server. ``handlers`` maps each to one HTTP status and the
``corl.proto.ErrorResponse`` shape; nothing here knows about HTTP."""

from __future__ import annotations

from .backends.base import BackendError, StaleVersionError, WeightLoadError


class InvalidInputError(ValueError):
    """A request field is out of the server's configured bounds (422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class UnauthorizedError(PermissionError):
    """Missing or wrong admin token (401)."""


class PayloadTooLargeError(ValueError):
    """Request body above ``max_body_bytes`` (413)."""


class UnavailableError(RuntimeError):
    """Not ready, timed out or the backend failed (503)."""


__all__ = [
    "BackendError",
    "InvalidInputError",
    "PayloadTooLargeError",
    "StaleVersionError",
    "UnauthorizedError",
    "UnavailableError",
    "WeightLoadError",
]
