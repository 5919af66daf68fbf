"""The HTTP edge both services share: the error shape and status map, the body limit, bearer-token
checks and request metrics. Each service's ``app.py`` installs these; nothing else writes an error
body or parses an ``Authorization`` header."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corl.prometheus import MetricSet
from corl.proto import ErrorDetail, ErrorResponse, ErrorType, HealthResponse
from corl.sandbox import SandboxUnavailable

from .errors import STATUS_TYPES, ServiceError, UnauthorizedError

log = logging.getLogger(__name__)


def error_response(
    status: int,
    type_: ErrorType,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(type=type_, message=message, field=field))
    hdrs = dict(headers or {})
    if status == 401:
        hdrs.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=hdrs or None)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: each status it can answer besides 200, in the one error shape."""
    return {code: {"model": ErrorResponse} for code in codes}


def _field_of(loc: tuple[object, ...]) -> str:
    """``("body", "items", 0, "prompt")`` -> ``items.0.prompt``: only the location's first element (where
    the value came from) is dropped, so a field that is itself named ``body`` or ``query`` survives."""
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path", "header", "cookie") else loc
    return ".".join(str(p) for p in parts) or "body"


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    retry = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(retry)} if retry is not None else None
    return error_response(exc.status, exc.type, exc.message, exc.field, headers)


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = "body" if first.get("type") == "json_invalid" else _field_of(tuple(first.get("loc", ())))
    message = "; ".join(f"{_field_of(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors[:5])
    return error_response(422, "invalid_request", message or "invalid request", field)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. bytes that are not UTF-8): bad input
        return error_response(422, "invalid_request", f"unreadable request body: {exc.detail}", "body")
    type_ = STATUS_TYPES.get(exc.status_code, "internal")
    return error_response(exc.status_code, type_, str(exc.detail), headers=exc.headers)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return error_response(500, "internal", f"internal error: {type(exc).__name__}")


async def _sandbox_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "unavailable", str(exc))  # the host cannot isolate code: fail closed, say why


def install_error_handlers(app: FastAPI) -> None:
    """Every error a route can produce leaves in the one shape; never a bare 500 for bad input."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(SandboxUnavailable, _sandbox_unavailable)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _internal)


# --- authentication ----------------------------------------------------------------------------


# Published as OpenAPI security schemes, so clients (and the fuzzer) know which token each route takes.
admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="admin", description="The service's admin token (CORL_ADMIN_TOKEN)."
)
cohort_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="cohort",
    description="The cohort token (CORL_COHORT_TOKEN): generate, grade, the OpenAI routes, the evaluator's readings.",
)
reward_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="reward",
    description="The reward routes' own token (CORL_AGGREGATOR_REWARD_SERVER__TOKEN), when one is set.",
)
grader_bearer = HTTPBearer(
    auto_error=False, scheme_name="grader", description="A grader's token, returned once by POST /v1/graders."
)
Credentials = HTTPAuthorizationCredentials | None


def bearer_token(credentials: Credentials) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 when there is none."""
    token = credentials.credentials.strip() if credentials else ""
    if not token:
        raise UnauthorizedError("missing bearer token")
    return token


def check_token(token: str, expected: str, name: str) -> None:
    """401 unless ``token`` is ``expected`` (compared in constant time); ``name`` says which token."""
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise UnauthorizedError(f"wrong {name} token")


def check_admin(token: str, admin_token: str | None) -> None:
    """401 unless ``token`` is the admin token. A service without an admin token refuses every admin call."""
    if not admin_token:
        raise UnauthorizedError("admin routes are disabled: CORL_ADMIN_TOKEN is not set on this service")
    check_token(token, admin_token, "admin")


async def require_admin(request: Request, credentials: Annotated[Credentials, Depends(admin_bearer)]) -> None:
    """Route dependency: the app's ``state.admin_token`` must be presented."""
    check_admin(bearer_token(credentials), request.app.state.admin_token)


async def require_cohort(request: Request, credentials: Annotated[Credentials, Depends(cohort_bearer)]) -> None:
    """Route dependency: the app's ``state.cohort_token`` must be presented when the service has one
    (``corl run``, compose and Helm always set one; a standalone server without it is open)."""
    expected: str | None = getattr(request.app.state, "cohort_token", None)
    if expected:
        check_token(bearer_token(credentials), expected, "cohort")


def bearer_headers(token: str | None) -> dict[str, str]:
    """``Authorization`` for a corl client that talks to a service guarded by ``token`` (none: no header)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- operational routes ------------------------------------------------------------------------


def operational_routes(get_serving: Callable[[Request], Awaitable[Any]]) -> APIRouter:
    """``/healthz`` (the process answers), ``/readyz`` (503 until ``get_serving`` finds the serving layer
    built) and ``/metrics`` (that layer's ``metrics.registry``), for a service whose readiness is its
    serving layer (the aggregator, the evaluator)."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> HealthResponse:
        return HealthResponse()

    @router.get("/readyz", responses=error_responses(503), dependencies=[Depends(get_serving)])
    async def readyz() -> HealthResponse:
        return HealthResponse()

    @router.get("/metrics", response_class=Response, responses=error_responses(503))
    async def metrics(serving: Any = Depends(get_serving)) -> Response:
        return Response(generate_latest(serving.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


# --- middleware --------------------------------------------------------------------------------

# Requests one client may have in flight at once, where a service's settings do not say.
MAX_CLIENT_CONCURRENCY = 64


class BodyLimitMiddleware:
    """413 for a body above ``max_bytes``, before the app reads it: by ``Content-Length`` up front,
    and for a chunked body as soon as the bytes received pass the bound (the rest is not read)."""

    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int] | None = None) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.path_limits = dict(path_limits or {})  # exact path -> its own bound (e.g. batch reward routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > limit:
                await self._reject(limit, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:  # chunked: buffer up to the bound, then replay to the app
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await self._reject(limit, scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _reject(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        resp = error_response(413, "payload_too_large", f"request body exceeds {limit} bytes")
        await resp(scope, receive, send)


def _replay(messages: list[Message], then: Receive) -> Receive:
    async def receive() -> Message:
        return messages.pop(0) if messages else await then()

    return receive


class ClientConcurrencyMiddleware:
    """429 for a client's request beyond ``max_in_flight`` of its own still being served: one client (a
    bearer token, or an address when it sends none) cannot hold every worker. Probes and /metrics are
    never counted."""

    EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, app: ASGIApp, max_in_flight: int) -> None:
        self.app, self.max_in_flight = app, max_in_flight
        self.in_flight: dict[str, int] = {}

    @staticmethod
    def client_of(scope: Scope) -> str:
        auth = dict(scope.get("headers") or []).get(b"authorization")
        if auth:
            return "token:" + hashlib.sha256(auth).hexdigest()[:16]
        client = scope.get("client")
        return f"addr:{client[0] if client else '?'}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.EXEMPT:
            await self.app(scope, receive, send)
            return
        key = self.client_of(scope)
        if self.in_flight.get(key, 0) >= self.max_in_flight:
            message = f"more than {self.max_in_flight} requests of this client in flight: retry when one is answered"
            await error_response(429, "rate_limited", message, headers={"Retry-After": "1"})(scope, receive, send)
            return
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight.pop(key) - 1
            if left:
                self.in_flight[key] = left


class HttpMetrics:
    """``<prefix>_requests_total`` and ``<prefix>_request_duration_seconds`` by route template and status;
    ``<prefix>_auth_failures_total`` by route: every 401 (no token, a wrong one, or admin routes off)."""

    def __init__(self, metrics: MetricSet) -> None:
        self.requests = metrics.counter("requests", "HTTP requests by route and status.", "route", "status")
        self.duration = metrics.histogram(
            "request_duration_seconds", "HTTP request latency by route and status.", "route", "status"
        )
        self.auth_failures = metrics.counter(
            "auth_failures", "Requests refused for want of a valid token (401), by route.", "route"
        )


class ServiceMetricSet(MetricSet):
    """A service's metrics, ``<prefix>_<name>`` on its app's own registry: the HTTP edge's (``http``),
    and those its subclass defines in ``__init__`` with ``self.counter``, ``self.gauge`` and
    ``self.histogram``."""

    def __init__(self, prefix: str, registry: CollectorRegistry | None = None) -> None:
        super().__init__(prefix, registry)
        self.http = HttpMetrics(self)


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by route template (a bounded label) and status."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            labels = (getattr(scope.get("route"), "path", "other"), str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.duration.labels(*labels).observe(time.perf_counter() - start)
            if status == 401:
                self.metrics.auth_failures.labels(labels[0]).inc()


class EdgeLimits(Protocol):
    """A service's bounds at the edge (its settings, or ``EdgeBounds``)."""

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def max_client_concurrency(self) -> int: ...


@dataclass(frozen=True)
class EdgeBounds:
    """Edge bounds of a service whose settings do not carry them."""

    max_body_bytes: int
    max_client_concurrency: int = MAX_CLIENT_CONCURRENCY


def install_edge(
    app: FastAPI, *, metrics: HttpMetrics, limits: EdgeLimits, path_limits: Mapping[str, int] | None = None
) -> None:
    """Error handlers, the body limit (``path_limits``: exact paths with their own bound), the
    per-client concurrency limit and request metrics, in that order of wrapping."""
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes, path_limits=path_limits)
    app.add_middleware(ClientConcurrencyMiddleware, max_in_flight=limits.max_client_concurrency)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
