"""A lean HTTP/1.1 client for the gateway's hop to the members' own servers: keep-alive connections per
origin, each request written in one piece, replies parsed with ``httptools`` (the C parser uvicorn
uses) and handed on as raw bytes while they arrive.

Why not httpx here: measured on loopback, a request through ``httpx.AsyncHTTPTransport`` costs about
0.7 ms of CPU (httpcore, anyio, h11, all pure Python) against 0.09 ms this way, and a proxy pays it on
every request. Outside endpoints (TLS, proxies from the environment, their own quirks) still go through
httpx: their replies take hundreds of milliseconds anyway.

Plain ``http://`` only. A connection that refuses (or a reused one the server closed before answering,
retried once on a fresh one: nothing was read) raises ``ConnectFailed``, so the caller may try another
replica; a reply that stops halfway raises ``RelayError``. Every read and connect has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools


class RelayError(Exception):
    """The upstream's reply could not be read (a broken or truncated reply, a read timeout)."""


class ConnectFailed(RelayError):
    """No connection, or none that took the request: nothing reached the upstream."""


Origin = tuple[str, int]


@dataclass
class _Reply:
    """What the parser has seen of one reply (httptools callbacks)."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    head_done: bool = False
    done: bool = False
    status: int = 0
    keep_alive: bool = False
    parser: httptools.HttpResponseParser | None = None  # read at the head: the parser resets after the reply

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status, self.keep_alive = self.parser.get_status_code(), self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @property
    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class RelayResponse:
    """A reply whose head has arrived; ``aiter_raw`` yields its body as it comes (chunked transfer
    decoded, any content encoding kept), ``aclose`` returns the connection to the pool when the reply
    was read to its end, else closes it."""

    def __init__(self, relay: Relay, origin: Origin, conn: _Connection, parser: httptools.HttpResponseParser,
                 reply: _Reply) -> None:  # fmt: skip
        self._relay, self._origin, self._conn, self._parser, self._reply = relay, origin, conn, parser, reply
        self.status_code = reply.status
        self.headers = reply.headers
        self._closed = False

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        reply = self._reply
        while True:
            if reply.chunks:
                chunks, reply.chunks = reply.chunks, []
                for chunk in chunks:
                    yield chunk
            if reply.done:
                return
            await self._relay._feed(self._conn, self._parser, reply)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reply.done and self._reply.keep_alive:
            self._relay._release(self._origin, self._conn)
        else:
            self._conn.close()


class Relay:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float, max_idle_per_origin: int = 64) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.max_idle = max_idle_per_origin
        self._idle: dict[Origin, list[_Connection]] = {}

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> RelayResponse:
        """POST ``body`` to ``url``; returns once the reply's head has arrived."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the relay speaks plain http:// only, not {url!r}")
        origin = (parts.hostname, parts.port or 80)
        host = parts.netloc
        lines = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        conn = self._take(origin)
        if conn is not None:
            try:
                return await self._exchange(origin, conn, request)
            except ConnectFailed:
                pass  # the server closed the idle connection before reading: a fresh one
        return await self._exchange(origin, await self._connect(origin), request)

    async def _connect(self, origin: Origin) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(*origin, limit=1 << 20)
        except (OSError, TimeoutError) as err:
            raise ConnectFailed(f"cannot connect to {origin[0]}:{origin[1]}: {type(err).__name__}") from None
        return _Connection(reader, writer)

    async def _exchange(self, origin: Origin, conn: _Connection, request: bytes) -> RelayResponse:
        reply = _Reply()
        parser = reply.parser = httptools.HttpResponseParser(reply)
        try:
            conn.writer.write(request)
            await conn.writer.drain()
            while not reply.head_done:
                await self._feed(conn, parser, reply, before_head=True)
        except BaseException:
            conn.close()
            raise
        return RelayResponse(self, origin, conn, parser, reply)

    async def _feed(self, conn: _Connection, parser: httptools.HttpResponseParser, reply: _Reply,
                    before_head: bool = False) -> None:  # fmt: skip
        """Read what the socket has and parse it; raises when the reply cannot go on."""
        try:
            async with asyncio.timeout(self.read_timeout_s):
                data = await conn.reader.read(1 << 16)
        except TimeoutError:
            conn.close()
            raise RelayError(f"no reply byte in {self.read_timeout_s:.0f}s") from None
        except OSError as err:
            conn.close()
            raise (ConnectFailed if before_head else RelayError)(f"connection lost: {type(err).__name__}") from None
        if not data:
            conn.close()
            if before_head:
                raise ConnectFailed("the connection was closed before a reply")
            if reply.head_done and not _framed(reply.headers):
                reply.done = True  # a reply that ends with its connection
                return
            raise RelayError("the reply ended early")
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as err:
            conn.close()
            raise RelayError(f"unreadable reply: {err}") from None

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    def _release(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if conn.usable and len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
                with contextlib.suppress(Exception):
                    await conn.writer.wait_closed()
        self._idle.clear()


def _framed(headers: list[tuple[str, str]]) -> bool:
    """Does the reply say where it ends (a length or chunked transfer), rather than at the connection's end?"""
    names = {k.lower() for k, _ in headers}
    return "content-length" in names or "transfer-encoding" in names
