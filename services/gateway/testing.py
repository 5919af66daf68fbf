"""A fake OpenAI-compatible upstream for the gateway's tests and benchmark: it answers chat and text
completions (whole, or streamed as server-sent events in ``chunks`` pieces), ``GET /v1/info`` with its
``version``, and records every request it was sent (path, body bytes, headers).

    fake = FakeUpstream("a")
    httpx.AsyncClient(transport=fake.transport())      # in-process (httpx.MockTransport)
    serve_app(fake.asgi())                              # a real server (corl.services.model.testing)

Replies are scripted: ``status`` (with ``headers``) answers every request with that status instead;
``gate`` (a ``threading.Event``), when set, holds a stream after its first chunk until it is set;
``delay_s`` stands for generation time (a stream spreads it over its pieces).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from corl.proto.openai import WEIGHT_VERSION_HEADER


class _Streamed(httpx.AsyncByteStream):
    """A reply body sent as a stream, as a real server's is (the gateway reads every reply raw)."""

    def __init__(self, content: bytes | AsyncIterator[bytes]) -> None:
        self.content = content

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if isinstance(self.content, bytes):
            yield self.content
        else:
            async for chunk in self.content:
                yield chunk

    async def aclose(self) -> None:  # the reader closed the reply: a generating stream stops
        if not isinstance(self.content, bytes):
            await self.content.aclose()  # type: ignore[attr-defined]


@dataclass
class Seen:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass
class FakeUpstream:
    name: str
    version: int = 0
    chunks: int = 4  # pieces of a streamed reply
    delay_s: float = 0.0  # time "generating" before a reply (a stream's pieces are spread over it)
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    gate: threading.Event | None = None
    abandoned: int = 0  # streams closed by their reader before their end
    record: bool = True  # keep every request in ``seen`` (a benchmark does not)
    seen: list[Seen] = field(default_factory=list)
    weights: list[dict[str, Any]] = field(default_factory=list)  # POST /v1/weights bodies

    def _reply(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        """(status, headers, bytes or an async iterator of bytes)."""
        if path.endswith("/v1/info"):
            info = {"name": self.name, "family": "fake", "parameters": 1, "weight_version": self.version}
            info |= {"backend": "fake", "chat_template": False, "max_context": None}
            return 200, {"content-type": "application/json"}, json.dumps(info).encode()
        if self.record:
            self.seen.append(Seen(path, body, headers))
        if path.endswith("/v1/weights"):
            req = json.loads(body)
            self.weights.append(req)
            self.version = int(req["version"])
            reply = {"weight_version": self.version, "previous_version": 0, "swap_seconds": 0.0}
            return 200, {"content-type": "application/json"}, json.dumps(reply).encode()
        if self.status is not None:
            return self.status, self.headers, json.dumps({"error": {"message": "scripted", "type": "x"}}).encode()
        req = json.loads(body)
        chat = path.endswith("/chat/completions")
        text = f"{self.name} says hi"
        common = {
            "id": "cmpl-1",
            "created": 1,
            "model": req.get("model"),
            "system_fingerprint": f"corl-w{self.version}",
        }
        version = {WEIGHT_VERSION_HEADER: str(self.version)}
        if not req.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
            obj = "chat.completion" if chat else "text_completion"
            answer = {**common, "object": obj, "choices": [choice], "usage": usage}
            return 200, {"content-type": "application/json", **version}, json.dumps(answer).encode()
        return 200, {"content-type": "text/event-stream", **version}, self._events(common, chat, text)

    async def _events(self, common: dict[str, Any], chat: bool, text: str) -> AsyncIterator[bytes]:
        try:
            async for event in self._pieces(common, chat, text):
                yield event
        except (GeneratorExit, asyncio.CancelledError):  # closed between pieces, or cancelled within one
            self.abandoned += 1
            raise

    async def _pieces(self, common: dict[str, Any], chat: bool, text: str) -> AsyncIterator[bytes]:
        pause = self.delay_s / self.chunks
        words = [text[len(text) * i // self.chunks : len(text) * (i + 1) // self.chunks] for i in range(self.chunks)]
        for i, piece in enumerate(words):
            last = i == len(words) - 1
            if chat:
                delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": "stop" if last else None}
                event = {**common, "object": "chat.completion.chunk", "choices": [choice]}
            else:
                choice = {"index": 0, "text": piece, "finish_reason": "stop" if last else None}
                event = {**common, "object": "text_completion", "choices": [choice]}
            if pause:
                await asyncio.sleep(pause)
            yield f"data: {json.dumps(event)}\n\n".encode()
            if i == 0 and self.gate is not None:
                while not self.gate.is_set():
                    await asyncio.sleep(0.005)
        yield b"data: [DONE]\n\n"

    # --- as an httpx.MockTransport ------------------------------------------------------------------

    async def _generating(self, path: str) -> None:
        if self.delay_s and path.endswith("completions"):
            await asyncio.sleep(self.delay_s)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        status, headers, content = self._reply(request.url.path, request.content, dict(request.headers))
        if isinstance(content, bytes):
            await self._generating(request.url.path)
        return httpx.Response(status, headers=headers, stream=_Streamed(content))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    # --- as an ASGI app -----------------------------------------------------------------------------

    def asgi(self) -> ASGIApp:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                while True:
                    kind = (await receive())["type"]
                    await send({"type": f"{kind}.complete"})
                    if kind == "lifespan.shutdown":
                        return
            request = Request(scope, receive)
            if request.url.path in ("/readyz", "/healthz"):
                await Response(b"{}", media_type="application/json")(scope, receive, send)
                return
            body = await request.body()
            status, headers, content = self._reply(request.url.path, body, dict(request.headers))
            if isinstance(content, bytes):
                await self._generating(request.url.path)
            resp: Response = (
                Response(content, status, headers)
                if isinstance(content, bytes)
                else StreamingResponse(content, status, headers)
            )
            await resp(scope, receive, send)

        return app


class Router:
    """One MockTransport over several fakes, each found by the URL's host (``http://<host>/...``)."""

    def __init__(self, **fakes: FakeUpstream) -> None:
        self.fakes = fakes
        self.refused: set[str] = set()  # hosts that refuse the connection

    async def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.refused:
            raise httpx.ConnectError(f"{host} refused the connection", request=request)
        return await self.fakes[host].handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)
