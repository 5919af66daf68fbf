"""Domain errors of the aggregator and their one HTTP shape (``corl.proto.ErrorResponse``)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corl.proto import ErrorDetail, ErrorResponse, ErrorType


class AggregatorError(Exception):
    status = 500
    type: ErrorType = "internal"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class Unauthorized(AggregatorError):
    status, type = 401, "unauthorized"


class Forbidden(AggregatorError):
    status, type = 403, "forbidden"


class NotFound(AggregatorError):
    status, type = 404, "not_found"


class Conflict(AggregatorError):
    status, type = 409, "conflict"


class PayloadTooLarge(AggregatorError):
    status, type = 413, "payload_too_large"


class RateLimited(AggregatorError):
    status, type = 429, "rate_limited"


class Unavailable(AggregatorError):
    status, type = 503, "unavailable"


_STATUS_TYPES: dict[int, ErrorType] = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AggregatorError)
    async def _domain(_: Request, exc: AggregatorError) -> JSONResponse:
        return error_response(exc.status, exc.type, exc.message, exc.field)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errs) or "invalid request"
        return error_response(422, "invalid_request", message, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _STATUS_TYPES.get(exc.status_code, "internal"), str(exc.detail))
