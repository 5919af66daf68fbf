"""Calls to cohort members through the one shared HTTP client: one interface for both kinds of member.

A member corl serves is reached at its model servers' ``/v1/generate`` and ``/v1/grade``; an outside
endpoint member through its ``EndpointClient`` (``endpoints/``, an ``OutsideMember``), which answers in
the same shapes, so the round driver, the judging fan-out and the reward server never ask which kind a
member is.

For model servers (and push graders): generation and grading are idempotent (no server-side effect),
so transport errors (connect failures, dropped connections; not read timeouts, which would only
double a slow call) and 502/503/504 are retried with exponential backoff and jitter, rotating over a
member's replicas. Anything else (a 4xx, a malformed body) fails at once: retrying would not change
the answer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from corl.config import MemberConfig
from corl.proto import GenerateRequest, GenerateResponse, GradeRequest, GradeResponse, InfoResponse
from corl.services.http import bearer_headers

from .member_contract import MemberError, OutsideMember
from .settings import HttpSettings

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({502, 503, 504})
_JSON = {"content-type": "application/json"}


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.ReadTimeout):
        return False  # a server too slow once will be slow again: leave it out of this round
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in _RETRY_STATUS


@dataclass(frozen=True)
class Verdicts:
    """A member's judge-mode scores: one per item (None: the member gave no readable verdict)."""

    scores: list[float | None]
    weight_version: int


class MemberClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: HttpSettings,
        request_timeout_s: float,
        endpoints: Mapping[str, OutsideMember] | None = None,
        cohort_token: str | None = None,
    ):
        self.http = http
        self.headers = {**_JSON, **bearer_headers(cohort_token)}  # per request: the client is shared with endpoints
        self.settings = settings
        self.timeout = httpx.Timeout(request_timeout_s, connect=settings.connect_timeout_s)
        self.endpoints = dict(endpoints or {})
        self._next_replica: dict[str, itertools.count[int]] = {}

    def _endpoint(self, member: MemberConfig) -> OutsideMember | None:
        if member.endpoint is None:
            return None
        try:
            return self.endpoints[member.name]
        except KeyError:
            raise MemberError(f"endpoint member {member.name}: no client was built for it") from None

    def _retrying(self) -> AsyncRetrying:
        s = self.settings
        return AsyncRetrying(
            stop=stop_after_attempt(s.attempts),
            wait=wait_random_exponential(multiplier=s.backoff_initial_s, max=s.backoff_max_s),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )

    async def _post(self, urls: list[str], path: str, body: str, timeout: httpx.Timeout) -> bytes:
        counter = self._next_replica.setdefault(urls[0], itertools.count())
        async for attempt in self._retrying():
            with attempt:
                url = urls[next(counter) % len(urls)].rstrip("/") + path
                resp = await self.http.post(url, content=body, headers=self.headers, timeout=timeout)
                resp.raise_for_status()
                return resp.content
        raise AssertionError("unreachable: tenacity reraises")

    async def generate(self, member: MemberConfig, req: GenerateRequest) -> GenerateResponse:
        if (endpoint := self._endpoint(member)) is not None:
            return await endpoint.generate(req)
        try:
            raw = await self._post(member.servers, "/v1/generate", req.model_dump_json(), self.timeout)
            resp = GenerateResponse.model_validate_json(raw)
        except (httpx.HTTPError, ValidationError) as err:
            raise MemberError(f"member {member.name}: generate failed: {type(err).__name__}: {err}") from err
        if len(resp.results) != len(req.prompts) or any(len(r.samples) != req.n for r in resp.results):
            raise MemberError(f"member {member.name}: answered the wrong number of prompts or samples")
        return resp

    async def grade(self, urls: list[str], req: GradeRequest, timeout_s: float | None = None) -> GradeResponse:
        timeout = self.timeout if timeout_s is None else httpx.Timeout(timeout_s)
        try:
            raw = await self._post(urls, "/v1/grade", req.model_dump_json(), timeout)
            resp = GradeResponse.model_validate_json(raw)
        except (httpx.HTTPError, ValidationError) as err:
            raise MemberError(f"grader at {urls[0]}: grade failed: {type(err).__name__}: {err}") from err
        if len(resp.scores) != len(req.items):
            raise MemberError(f"grader at {urls[0]}: {len(resp.scores)} scores for {len(req.items)} items")
        return resp

    async def judge(self, member: MemberConfig, req: GradeRequest) -> Verdicts:
        """The member's judge-mode scores of ``req.items`` (its ``/v1/grade``, or its endpoint)."""
        if (endpoint := self._endpoint(member)) is not None:
            return Verdicts(await endpoint.judge(req), 0)
        resp = await self.grade(member.servers, req)
        return Verdicts(list(resp.scores), resp.weight_version)

    async def info(self, member: MemberConfig, timeout_s: float) -> InfoResponse | None:
        """``GET /v1/info`` of the member's first replica, once (a dashboard reading): None on failure
        and for an outside endpoint (it has no weight versions)."""
        if member.endpoint is not None:
            return None
        try:
            resp = await self.http.get(member.servers[0].rstrip("/") + "/v1/info", timeout=timeout_s)
            resp.raise_for_status()
            return InfoResponse.model_validate_json(resp.content)
        except (httpx.HTTPError, ValidationError):
            return None
