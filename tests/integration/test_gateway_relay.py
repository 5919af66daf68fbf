"""The gateway's lean HTTP/1.1 client for the members' servers (``services/gateway/relay.py``) against real
sockets: a real uvicorn (``FakeUpstream``) and raw asyncio servers that answer in the ways HTTP allows
(chunked, to the connection's end, a closed keep-alive connection) and the ways it breaks (a refusal, a
truncated reply, silence)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from corl.redis_server import free_port
from corl.services.gateway.relay import ConnectFailed, Relay, RelayError
from corl.services.gateway.testing import FakeUpstream
from corl.services.model.testing import serve_app

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


async def collect(relay: Relay, url: str) -> tuple[int, bytes]:
    resp = await relay.post(url, BODY, {"content-type": "application/json"})
    body = b"".join([c async for c in resp.aiter_raw()])
    await resp.aclose()
    return resp.status_code, body


async def test_whole_and_streamed_replies_from_uvicorn_reuse_one_connection() -> None:
    fake = FakeUpstream("m", version=7)
    with serve_app(fake.asgi()) as url:
        relay = Relay(connect_timeout_s=5, read_timeout_s=5)
        statuses, bodies = [], []
        for stream in (False, True, False, True):
            body = json.dumps({"model": "m", "messages": [], "stream": stream}).encode()
            resp = await relay.post(f"{url}/v1/chat/completions", body, {"authorization": "Bearer t"})
            statuses.append(resp.status_code)
            bodies.append(b"".join([c async for c in resp.aiter_raw()]))
            assert dict(resp.headers)["x-corl-weight-version"] == "7"
            await resp.aclose()
        idle = sum(len(v) for v in relay._idle.values())  # noqa: SLF001
        await relay.aclose()
    assert statuses == [200] * 4
    assert json.loads(bodies[0])["choices"][0]["message"]["content"] == "m says hi"
    assert bodies[1].startswith(b"data: ") and bodies[1].endswith(b"data: [DONE]\n\n")  # chunked, decoded
    assert idle == 1  # keep-alive: the four requests shared one connection
    assert [s.headers["authorization"] for s in fake.seen] == ["Bearer t"] * 4


async def test_a_reply_read_to_the_connections_end_and_one_refused() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{"a": ')
        await writer.drain()
        writer.write(b"1}")
        writer.close()

    relay = Relay(connect_timeout_s=2, read_timeout_s=2)
    async with raw_server(until_close) as url:
        assert await collect(relay, url + "/v1/chat/completions") == (200, b'{"a": 1}')
    with pytest.raises(ConnectFailed):
        await relay.post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", BODY, {})


async def test_a_keep_alive_connection_the_server_closed_is_replaced() -> None:
    served = 0

    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # an idle timeout on the server's side, the client still holding the connection

    relay = Relay(connect_timeout_s=2, read_timeout_s=2)
    async with raw_server(one_then_close) as url:
        assert await collect(relay, url + "/x") == (200, b"ok")
        await asyncio.sleep(0.2)
        assert await collect(relay, url + "/x") == (200, b"ok")
    assert served == 2


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", RelayError),  # truncated
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", RelayError),  # no last chunk
        (b"not http at all\r\n\r\n", RelayError),
        (b"", ConnectFailed),  # closed before a reply: nothing read, another replica may try
    ],
)
async def test_broken_replies_raise(reply: bytes, error: type[Exception]) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        writer.close()

    relay = Relay(connect_timeout_s=2, read_timeout_s=2)
    async with raw_server(broken) as url:
        with pytest.raises(error):
            await collect(relay, url + "/x")


async def test_silence_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    relay = Relay(connect_timeout_s=2, read_timeout_s=0.3)
    async with raw_server(silent) as url:
        with pytest.raises(RelayError, match="no reply byte"):
            await collect(relay, url + "/x")
