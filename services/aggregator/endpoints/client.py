"""One outside endpoint member: its samples and verdicts through the OpenAI API, in corl's shapes.

A round asks for G samples of each prompt: one request with ``n = G`` where the server takes it, else
G requests of one sample each (their seeds differ). Unless the config says, the first request finds
out: a 400/422 to ``n > 1``, or a reply with one choice, switches this endpoint to one request per
sample for good. Requests share a concurrency bound and a timeout (the endpoint's config) and are
retried as ``retry.py`` says; one that still fails fails the whole call, and the round goes on without
the member (its quorum rule), asking it again next round. A reply that cannot be read, a missing
choice or a choice without text is a sample with no answer; a call where no reply could be read fails.

Samples carry text only: no token ids, no log-probs, ``weight_version`` 0 (the member never trains),
and the reply's token ``usage``. The key is read from the environment once and only ever sent in the
``Authorization`` header; no message here contains a URL, a header or a reply body.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx

from corl.config import CohortConfig, MemberConfig
from corl.proto import EndpointStats, GenerateRequest, GenerateResponse, GradeRequest, PromptResult, Sample, Usage
from corl.tasks import get_task

from ..member_contract import MemberError
from ..metrics import AggregatorMetrics
from ..settings import HttpSettings
from .bodies import judge_body, sample_body
from .replies import Choice, Reply, read_reply, verdict
from .retry import retrying
from .usage import EndpointUsage

log = logging.getLogger(__name__)

T = TypeVar("T")
_REFUSED = frozenset({400, 422})  # how servers refuse a parameter they do not take
MAX_REPLY_BYTES = 16 << 20  # an outside reply larger than this is no answer (n=16 with logprobs stays far below)


class _Capability:
    """A request feature a server may refuse (``n > 1``, ``logprobs``): unknown until the first request
    that uses it; concurrent requests wait for that first answer instead of all probing at once."""

    def __init__(self, known: bool | None) -> None:
        self.known = known
        self.lock = asyncio.Lock()


@dataclass(frozen=True)
class _Sampled:
    choices: list[Choice | None]  # n per prompt
    replies: list[Reply | None]  # every reply this took (None: unreadable)


async def _all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Every result, or the first error with the others cancelled (one failed request fails the call)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _refused(err: httpx.HTTPStatusError) -> bool:
    return err.response.status_code in _REFUSED


def _describe(err: BaseException) -> str:
    if isinstance(err, httpx.HTTPStatusError):
        return f"HTTP {err.response.status_code}"
    return type(err).__name__


class _Unreadable(Exception):
    """No reply of a call could be read."""


class EndpointClient:
    def __init__(
        self,
        member: MemberConfig,
        http: httpx.AsyncClient,
        settings: HttpSettings,
        metrics: AggregatorMetrics,
        default_timeout_s: float,
    ) -> None:
        if member.endpoint is None:
            raise ValueError(f"member {member.name!r} is not an outside endpoint")
        ep = member.endpoint
        self.name, self.endpoint, self.http, self.settings = member.name, ep, http, settings
        self._key = ep.api_key()  # KeyError naming the variable when it is not set: refuse to start
        path = "/chat/completions" if ep.api == "openai-chat" else "/completions"
        self._url = ep.base_url.rstrip("/") + path
        self._timeout = httpx.Timeout(ep.timeout_s or default_timeout_s, connect=settings.connect_timeout_s)
        self._slots = asyncio.Semaphore(ep.max_concurrency)
        self._n = _Capability({"auto": None, "yes": True, "no": False}[ep.n])
        self._logprobs = _Capability(None)
        self.usage = EndpointUsage(member.name, ep, metrics)
        self.usage.n_per_request = self._n.known

    # --- one request ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._key is not None:
            headers["authorization"] = f"Bearer {self._key.get_secret_value()}"
        return headers

    async def _post_once(self, body: bytes) -> bytes:
        """The reply's bytes; ``b""`` (an unreadable reply: no answer) when it passes ``MAX_REPLY_BYTES``,
        read no further: an outside server cannot make the aggregator hold an unbounded reply."""
        async with self._slots:
            t0 = time.perf_counter()
            try:
                async with self.http.stream(
                    "POST", self._url, content=body, headers=self._headers(), timeout=self._timeout
                ) as resp:
                    status = resp.status_code
                    if status >= 400:
                        kind = "rate_limited" if status == 429 else "server_error" if status >= 500 else "client_error"
                        self.usage.request(kind)
                        self.usage.error(f"HTTP {status}")
                        resp.raise_for_status()
                    raw = bytearray()
                    async for chunk in resp.aiter_bytes():
                        raw += chunk
                        if len(raw) > MAX_REPLY_BYTES:
                            self.usage.error(f"reply over {MAX_REPLY_BYTES} bytes")
                            raw = bytearray()
                            break
            except httpx.TransportError as err:
                self.usage.request("timeout" if isinstance(err, httpx.TimeoutException) else "transport_error")
                self.usage.error(_describe(err))
                raise
            seconds = time.perf_counter() - t0
        self.usage.request("ok", seconds)
        return bytes(raw)

    async def _send(self, body: bytes) -> Reply | None:
        """One request, retried as ``retry.py`` says; its reply, or None when the reply is unreadable."""
        s = self.settings
        raw = b""
        async for attempt in retrying(
            self.endpoint.attempts,
            s.backoff_initial_s,
            self.endpoint.max_retry_wait_s,
            before_sleep=lambda _: self.usage.retry(),
        ):
            with attempt:
                raw = await self._post_once(body)
        reply = read_reply(self.endpoint.api, raw)
        if reply is None:
            self.usage.error("unreadable reply")
        else:
            self.usage.tokens(reply.prompt_tokens, reply.completion_tokens)
        return reply

    # --- sampling ------------------------------------------------------------------------------

    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        """``req.n`` samples of every prompt, as a text-only ``GenerateResponse``; ``MemberError`` when a
        request fails after its retries or no reply could be read."""
        try:
            sampled = await _all([self._prompt(i, p, req) for i, p in enumerate(req.prompts)])
            replies = [r for s in sampled for r in s.replies]
            if not any(r is not None for r in replies):
                raise _Unreadable
        except (httpx.HTTPError, _Unreadable) as err:
            self.usage.call_failed()
            why = "no reply could be read" if isinstance(err, _Unreadable) else _describe(err)
            raise MemberError(f"endpoint member {self.name}: sampling failed: {why}") from err
        read = [r for r in replies if r is not None]
        prompt_tokens = sum(r.prompt_tokens for r in read)
        completion_tokens = sum(r.completion_tokens for r in read)
        results = [
            PromptResult(prompt=p, prompt_token_ids=[], samples=[_sample(c) for c in s.choices])
            for p, s in zip(req.prompts, sampled, strict=True)
        ]
        no_answer = sum(1 for s in sampled for c in s.choices if c is None or not c.text)
        self.usage.sampled(len(req.prompts) * req.n, no_answer)
        return GenerateResponse(
            model=self.name,
            weight_version=0,
            results=results,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )

    async def _prompt(self, i: int, prompt: str, req: GenerateRequest) -> _Sampled:
        n, api, model, sampling = req.n, self.endpoint.api, self.endpoint.model, req.sampling()

        def body(k: int, j: int) -> bytes:  # k samples; seeds differ between the requests of one round
            seed = None if req.seed is None else (req.seed + i * n + j) % (1 << 31)
            return sample_body(api, model, prompt, req.format, sampling, k, seed)

        together, each = body(n, 0), [body(1, j) for j in range(n)]
        if n > 1 and self._n.known is None:
            async with self._n.lock:
                if self._n.known is None:
                    return await self._probe_n(n, together, each)
        if n == 1 or self._n.known is False:
            return await self._one_each(each)
        reply = await self._send(together)
        return _Sampled(_take(reply, n), [reply])

    async def _one_each(self, bodies: list[bytes]) -> _Sampled:
        replies = await _all([self._send(b) for b in bodies])
        return _Sampled([_take(r, 1)[0] for r in replies], replies)

    async def _probe_n(self, n: int, together: bytes, each: list[bytes]) -> _Sampled:
        """The first request with ``n > 1``: learn whether this server takes it."""
        try:
            reply = await self._send(together)
        except httpx.HTTPStatusError as err:
            if not _refused(err):
                raise
            sampled = await self._one_each(each)  # raises when these fail too: then n was not the reason
            self._learn_n(False, f"refused n={n} ({_describe(err)})")
            return sampled
        if reply is not None and len(reply.choices) == 1:
            rest = await self._one_each(each[1:])
            self._learn_n(False, f"answered n={n} with one choice")
            return _Sampled([reply.choices[0], *rest.choices], [reply, *rest.replies])
        if reply is not None:
            self._learn_n(True, f"answered n={n} at once")
        return _Sampled(_take(reply, n), [reply])

    def _learn_n(self, ok: bool, why: str) -> None:
        self._n.known = self.usage.n_per_request = ok
        how = "one request per prompt" if ok else "one request per sample"
        log.info("endpoint member %s %s: %s from now on", self.name, why, how)

    # --- judging (peer_judge) --------------------------------------------------------------------

    async def judge(self, req: GradeRequest) -> list[float | None]:
        """A verdict score per item (None: none could be read), from the reply's logprobs where the
        server returns them, else from its text; ``MemberError`` when a request fails."""
        task = get_task(req.task, req.rubric)
        correct, incorrect = task.verdict_tokens
        texts = [task.judge_prompt(it.prompt, it.response) for it in req.items]
        try:
            choices = await _all([self._verdict_choice(t, req) for t in texts])
        except httpx.HTTPError as err:
            self.usage.call_failed()
            raise MemberError(f"endpoint member {self.name}: judging failed: {_describe(err)}") from err
        scores = []
        for choice in choices:
            score, source = verdict(choice, correct, incorrect)
            self.usage.verdict(source)
            scores.append(score)
        return scores

    async def _verdict_choice(self, text: str, req: GradeRequest) -> Choice | None:
        api, model = self.endpoint.api, self.endpoint.model

        async def ask(logprobs: bool) -> Choice | None:
            reply = await self._send(judge_body(api, model, text, req.format.judging(), logprobs))
            return reply.take(1)[0] if reply is not None else None

        if self._logprobs.known is None:
            async with self._logprobs.lock:
                if self._logprobs.known is None:
                    try:
                        choice = await ask(True)
                    except httpx.HTTPStatusError as err:
                        if not _refused(err):
                            raise
                        choice = await ask(False)
                        self._logprobs.known = False
                        log.info("endpoint member %s refused logprobs: verdicts are read from text", self.name)
                        return choice
                    self._logprobs.known = True
                    return choice
        return await ask(bool(self._logprobs.known))

    def stats(self) -> EndpointStats:
        return self.usage.stats()


def _take(reply: Reply | None, n: int) -> list[Choice | None]:
    return reply.take(n) if reply is not None else [None] * n


def _sample(choice: Choice | None) -> Sample:
    if choice is None or not choice.text:
        return Sample(text="", token_ids=[], logprobs=[], finish_reason="stop")  # no answer: it never votes
    return Sample(text=choice.text, token_ids=[], logprobs=[], finish_reason=choice.finish_reason)


def build_endpoint_clients(
    cfg: CohortConfig, http: httpx.AsyncClient, settings: HttpSettings, metrics: AggregatorMetrics
) -> dict[str, EndpointClient]:
    """A client per outside endpoint member (``KeyError`` when an ``api_key_env`` variable is not set)."""
    return {
        m.name: EndpointClient(m, http, settings, metrics, cfg.rounds.request_timeout_s)
        for m in cfg.members
        if m.endpoint is not None
    }
