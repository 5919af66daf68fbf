"""The gateway's serving layer: forward an OpenAI request to the member its ``model`` names, pass the
reply back as it arrives, and offer the request to the harvester.

The body goes out as it came in (an endpoint named by its member name gets its own model name, the one
change); the reply's status, body and headers come back unchanged but for hop-by-hop headers, its bytes
passed on undecoded (a compressed reply stays compressed) as they arrive, so a stream is never buffered.
A member's own servers are reached through ``relay.Relay`` (a lean keep-alive HTTP/1.1 client: the hop a
proxy pays on every request), outside endpoints through httpx (TLS, proxies from the environment). A
replica that refuses the connection (nothing was sent) is followed by the member's next one, and
only when none answers does the app get an error of its own (503). Harvesting happens after the
upstream has answered with a success status and costs the request a set lookup, a random draw and a
queue put; the pool write itself is the harvester's workers' (``harvest.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Protocol

import httpx
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from corl.config import CohortConfig
from corl.proto.gateway import ForwardedHead, HarvestRoute, HarvestStats
from corl.proto.openai import WEIGHT_VERSION_HEADER, ModelCard, ModelList
from corl.services.errors import InvalidInputError, UnavailableError

from .harvest import Harvester, harvest_stats
from .metrics import GatewayMetrics
from .relay import ConnectFailed, Relay, RelayError
from .upstreams import Replica, Routes, Upstream

log = logging.getLogger(__name__)

# Headers of one hop, never passed on (RFC 9110 7.6.1), and those the server in front sets itself.
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
     "content-length", "date", "server"}
)  # fmt: skip
_PASSED_REQUEST = ("accept", "accept-encoding", "user-agent", "openai-organization", "openai-project")


def _head(body: bytes) -> ForwardedHead:
    try:
        return ForwardedHead.model_validate_json(body)
    except ValidationError as err:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise InvalidInputError(f"{field}: {first.get('msg')}", field) from None


class Reply(Protocol):
    """An upstream's reply once its head has arrived (``RelayResponse``, or httpx's through ``_HttpxReply``)."""

    status_code: int
    headers: list[tuple[str, str]]

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class _HttpxReply:
    def __init__(self, resp: httpx.Response) -> None:
        self.resp, self.status_code, self.headers = resp, resp.status_code, resp.headers.multi_items()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.resp.aiter_raw()

    async def aclose(self) -> None:
        await self.resp.aclose()


async def _relay(reply: Reply) -> AsyncIterator[bytes]:
    """A stream's bytes as they arrive; the upstream connection is released however the stream ends."""
    try:
        async for chunk in reply.aiter_raw():
            yield chunk
    finally:
        await reply.aclose()


_CONNECT_FAILED = (httpx.ConnectError, httpx.ConnectTimeout, ConnectFailed)


class GatewayServing:
    def __init__(
        self,
        cfg: CohortConfig,
        http: httpx.AsyncClient,
        relay: Relay | None,
        routes: Routes,
        harvester: Harvester,
        metrics: GatewayMetrics,
        attempts: int,
        rng: random.Random | None = None,
    ) -> None:
        """``relay`` None: every upstream through ``http`` (tests that fake the members with a transport)."""
        self.cfg, self.http, self.relay, self.routes, self.harvester = cfg, http, relay, routes, harvester
        self.metrics, self.attempts = metrics, attempts
        self.timeout = http.timeout.as_dict()
        self.redis = harvester.redis
        self.rng = rng or random.Random()
        self.created = int(time.time())

    def models(self) -> ModelList:
        ups = self.routes.upstreams.items()
        return ModelList(data=[ModelCard(id=name, created=self.created, owned_by=u.kind) for name, u in ups])

    async def harvest_stats(self) -> HarvestStats:
        return await harvest_stats(self.redis, self.cfg.run_id)

    async def forward(self, route: HarvestRoute, body: bytes, headers: dict[str, str]) -> Response:
        head = _head(body)
        up = self.routes.resolve(head.model)
        reply = await self._send(up, route, up.body_for(body, head.model), headers)
        status = reply.status_code
        self.metrics.forwarded.labels(up.member, route, str(status)).inc()
        if status < 400:
            self.harvester.offer(route, up.member, body)
        out = [(k, v) for k, v in reply.headers if k.lower() not in _HOP]
        if any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in out):
            return _with_headers(StreamingResponse(_relay(reply), status_code=status), out)
        try:
            content = b"".join([chunk async for chunk in reply.aiter_raw()])
        finally:
            await reply.aclose()
        return _with_headers(Response(content, status_code=status), out)

    async def _post(self, up: Upstream, url: str, body: bytes, headers: dict[str, str]) -> Reply:
        if self.relay is not None and up.kind == "corl" and url.startswith("http://"):
            return await self.relay.post(url, body, headers)
        req = httpx.Request("POST", url, content=body, headers=headers)
        req.extensions["timeout"] = self.timeout
        return _HttpxReply(await self.http.send(req, stream=True))

    async def _send(self, up: Upstream, route: HarvestRoute, body: bytes, headers: dict[str, str]) -> Reply:
        """The first replica that takes the connection, its response head read (the body still streaming).
        A replica that refuses the connection (nothing was sent) is followed by the next, at most ``attempts``."""
        sent = {k: v for k, v in headers.items() if k in _PASSED_REQUEST}
        sent |= {"content-type": "application/json", **up.headers}
        replicas = up.order(self.rng)[: self.attempts]
        t0 = time.perf_counter()
        replica: Replica | None = None
        failure: Exception | None = None
        for replica in replicas:
            try:
                reply = await self._post(up, up.url(replica, route), body, sent)
            except _CONNECT_FAILED as err:
                failure = err
                continue
            except (httpx.HTTPError, RelayError) as err:
                failure = err
                break
            self.metrics.upstream_seconds.labels(up.member).observe(time.perf_counter() - t0)
            version = next((v for k, v in reply.headers if k.lower() == _VERSION), None)
            if version is not None and version.isdigit():
                replica.version = int(version)
            return reply
        self.metrics.upstream_failures.labels(up.member).inc()
        why = type(failure).__name__
        log.warning("member %s: no replica answered (%s)", up.member, why)
        raise UnavailableError(f"member {up.member}: no server answered ({why})")


_VERSION = WEIGHT_VERSION_HEADER.lower()


def _with_headers(resp: Response, headers: list[tuple[str, str]]) -> Response:
    """The upstream's headers on ``resp``, repeated ones kept (Starlette sets the length or chunking)."""
    kept = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    own = [(k, v) for k, v in resp.raw_headers if k == b"content-length"]
    resp.raw_headers = kept + own
    return resp
