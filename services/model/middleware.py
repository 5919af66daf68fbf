"""ASGI middleware: request metrics per route and status, and the request body size bound."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import ServerMetrics


class MetricsMiddleware:
    """Counts and times every HTTP request by route template (bounded label) and status."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

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
            route = getattr(scope.get("route"), "path", "other")
            labels = (route, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.request_duration.labels(*labels).observe(time.perf_counter() - start)


class BodySizeLimitMiddleware:
    """413 for a body above ``max_bytes``: by Content-Length up front, else while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "type": "payload_too_large",
                    "message": f"request body exceeds {self.max_bytes} bytes",
                    "field": None,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): buffer up to the bound, then replay to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(send)
                return
            if not message.get("more_body", False):
                break
        await self.app(
            scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}], receive), send
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
