"""The gateway's serving layer: forward an OpenAI request to the member its ``model`` names, pass the
reply back as it arrives, and offer the request to the harvester.

The body goes out as it came in (an endpoint named by its member name gets its own model name, the one
change); the reply's status, body and headers come back unchanged but for hop-by-hop headers, its bytes
passed on undecoded (a compressed reply stays compressed) as they arrive, so a stream is never buffered.
A replica that refuses the connection (nothing was sent) is followed by the member's next one, and
only when none answers does the app get an error of its own (503). Harvesting happens after the
upstream has answered with a success status and costs the request a set lookup, a random draw and a
queue put; the pool write itself is the harvester's workers' (``harvest.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator

import httpx
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from corl.config import CohortConfig
from corl.proto.gateway import ForwardedHead, HarvestRoute, HarvestStats
from corl.proto.openai import WEIGHT_VERSION_HEADER, ModelCard, ModelList
from corl.services.errors import InvalidInputError, UnavailableError

from .harvest import Harvester, harvest_stats
from .metrics import GatewayMetrics
from .upstreams import Routes, Upstream

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


async def _relay(resp: httpx.Response) -> AsyncIterator[bytes]:
    """A stream's bytes as they arrive; the upstream connection is released however the stream ends."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    finally:
        await resp.aclose()


class GatewayServing:
    def __init__(
        self,
        cfg: CohortConfig,
        transport: httpx.AsyncBaseTransport,
        timeout: httpx.Timeout,
        routes: Routes,
        harvester: Harvester,
        metrics: GatewayMetrics,
        attempts: int,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg, self.transport, self.routes, self.harvester, self.metrics = cfg, transport, routes, harvester, metrics
        self.timeout = timeout.as_dict()
        self.redis = harvester.redis
        self.attempts = attempts
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
        resp = await self._send(up, route, up.body_for(body, head.model), headers)
        status = resp.status_code
        self.metrics.forwarded.labels(up.member, route, str(status)).inc()
        if status < 400:
            self.harvester.offer(route, up.member, body)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(_relay(resp), status_code=status, headers=out)
        try:
            content = b"".join([chunk async for chunk in resp.aiter_raw()])
        finally:
            await resp.aclose()
        return Response(content, status_code=status, headers=out)

    async def _send(self, up: Upstream, route: HarvestRoute, body: bytes, headers: dict[str, str]) -> httpx.Response:
        """The first replica that takes the connection, its response head read (the body still streaming).

        Straight to the transport (its pool, its connect retries): the client's cookie, auth and redirect
        handling are not wanted here and cost a proxy a tenth of a millisecond per request. A replica
        that refuses the connection (nothing was sent) is followed by the next, at most ``attempts``."""
        sent = {k: v for k, v in headers.items() if k in _PASSED_REQUEST}
        sent |= {"content-type": "application/json", **up.headers}
        replicas = up.order(self.rng)[: self.attempts]
        t0 = time.perf_counter()
        for k, replica in enumerate(replicas):
            req = httpx.Request("POST", up.url(replica, route), content=body, headers=sent)
            req.extensions["timeout"] = self.timeout
            try:
                resp = await self.transport.handle_async_request(req)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                if k + 1 < len(replicas):
                    continue
                failure: httpx.HTTPError = err
            except httpx.HTTPError as err:
                failure = err
            self.metrics.upstream_failures.labels(up.member).inc()
            log.warning("member %s: no replica answered (%s)", up.member, type(failure).__name__)
            raise UnavailableError(f"member {up.member}: no server answered ({type(failure).__name__})")
        self.metrics.upstream_seconds.labels(up.member).observe(time.perf_counter() - t0)
        version = resp.headers.get(WEIGHT_VERSION_HEADER)
        if version is not None and version.isdigit():
            replica.version = int(version)
        return resp
