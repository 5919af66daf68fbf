"""The one place domain errors become HTTP responses, all shaped as ``corl.proto.ErrorResponse``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corl.proto import ErrorDetail, ErrorResponse, ErrorType

from .errors import (
    BackendError,
    InvalidInputError,
    PayloadTooLargeError,
    StaleVersionError,
    UnauthorizedError,
    UnavailableError,
    WeightLoadError,
)

log = logging.getLogger(__name__)

_HTTP_TYPES: dict[int, ErrorType] = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "not_found",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


def error_response(status: int, type_: ErrorType, message: str, field: str | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(type=type_, message=message, field=field))
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _field_of(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = "body" if first.get("type") == "json_invalid" else _field_of(tuple(first.get("loc", ())))
    msg = "; ".join(f"{_field_of(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors[:5])
    return error_response(422, "invalid_request", msg, field)


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInputError | WeightLoadError)
    return error_response(422, "invalid_request", str(exc), exc.field)


async def _conflict(_: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "conflict", str(exc), "version")


async def _unauthorized(_: Request, exc: Exception) -> JSONResponse:
    return error_response(401, "unauthorized", str(exc))


async def _too_large(_: Request, exc: Exception) -> JSONResponse:
    return error_response(413, "payload_too_large", str(exc))


async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "unavailable", str(exc) or type(exc).__name__)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(exc.status_code, _HTTP_TYPES.get(exc.status_code, "internal"), str(exc.detail))


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return error_response(500, "internal", f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(InvalidInputError, _invalid)
    app.add_exception_handler(WeightLoadError, _invalid)
    app.add_exception_handler(StaleVersionError, _conflict)
    app.add_exception_handler(UnauthorizedError, _unauthorized)
    app.add_exception_handler(PayloadTooLargeError, _too_large)
    app.add_exception_handler(UnavailableError, _unavailable)
    app.add_exception_handler(BackendError, _unavailable)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _internal)
