"""Fake cohort members for tests and the benchmark: an ``httpx.MockTransport`` handler that answers
``/v1/generate``, ``/v1/grade`` and ``/v1/info`` per the contract, for members addressed as ``http://<name>.fake``,
and OpenAI-compatible outside endpoints (``FakeEndpoint``) addressed as ``http://<name>.endpoint/v1``.

Each fake member answers the addition task correctly with probability ``accuracy`` (else a random
number or junk), and always correctly at temperature 0 (its greedy answer is right), or, collapsed,
echoes the prompt's last operand; members can be down (connection refused), flaky (503 every other call) or slow.
A fake endpoint can demand a key, refuse or ignore ``n``, leave out logprobs, and play a script of
failures (statuses with headers, read timeouts, unreadable bodies, short answers) before answering.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from corl.proto import GenerateRequest, GradeRequest


def _sum(prompt: str) -> int | None:
    prompt = prompt.rsplit("\n", 1)[-1]  # a plain template may put text before the task's "ab+cd="
    try:
        a, b = prompt.rstrip("=").split("+")
        return int(a) + int(b)
    except ValueError:
        return None


@dataclass
class FakeMember:
    name: str
    accuracy: float = 0.8
    weight_version: int = 0
    judge: str = "honest"  # honest | noisy (honest with probability judge_accuracy, else random) | always_one | random
    judge_accuracy: float = 0.6
    echo: bool = False  # answers the prompt's last operand (a copy of the question, never the sum)
    calls: int = 0
    grade_calls: int = 0
    generated: list[tuple[float, int]] = field(default_factory=list)  # (temperature, n) of each generate call


@dataclass
class FakeCohort:
    members: dict[str, FakeMember] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    flaky: set[str] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)  # name -> seconds before answering
    endpoints: dict[str, FakeEndpoint] = field(default_factory=dict)

    @classmethod
    def of(cls, *names: str, accuracy: float = 0.8) -> FakeCohort:
        return cls({n: FakeMember(n, accuracy=accuracy) for n in names})

    @staticmethod
    def url(name: str) -> str:
        return f"http://{name}.fake"

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def sync_transport(self) -> httpx.MockTransport:
        """The same members for a synchronous ``httpx.Client`` (a slow member sleeps in the caller's thread)."""
        return httpx.MockTransport(self.handle_sync)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.host.endswith(".endpoint"):
            return await self.endpoints[request.url.host.removesuffix(".endpoint")].handle(request)
        name = request.url.host.removesuffix(".fake")
        if name in self.slow:
            await asyncio.sleep(self.slow[name])
        return self.answer(request)

    def handle_sync(self, request: httpx.Request) -> httpx.Response:
        name = request.url.host.removesuffix(".fake")
        if name in self.slow:
            time.sleep(self.slow[name])
        return self.answer(request)

    def answer(self, request: httpx.Request) -> httpx.Response:
        """A fake member's reply to ``request`` (``/v1/info``, ``/v1/generate``, ``/v1/grade``)."""
        name = request.url.host.removesuffix(".fake")
        m = self.members.get(name)
        if m is None or name in self.down:
            raise httpx.ConnectError(f"{name} is down", request=request)
        if request.url.path == "/v1/info":
            info = {"name": name, "family": "fake", "parameters": 0, "weight_version": m.weight_version}
            return httpx.Response(200, json={**info, "backend": "fake", "chat_template": False})
        if request.url.path == "/v1/generate":
            m.calls += 1
            req = GenerateRequest.model_validate_json(request.content)
            m.generated.append((req.temperature, req.n))
            if name in self.flaky and m.calls % 2 == 1:
                return httpx.Response(503, json={"error": {"type": "unavailable", "message": "busy"}})
            return httpx.Response(200, content=self.generate(m, req))
        if request.url.path == "/v1/grade":
            m.grade_calls += 1
            grade = GradeRequest.model_validate_json(request.content)
            rng = random.Random(m.grade_calls)
            scores = []
            for it in grade.items:
                truth = _sum(it.prompt)
                right = it.response.strip() == str(truth)
                if m.judge == "always_one":
                    scores.append(1.0)
                elif m.judge == "random" or (m.judge == "noisy" and rng.random() >= m.judge_accuracy):
                    scores.append(rng.random())
                else:
                    scores.append(0.9 if right else 0.1)
            return httpx.Response(200, json={"model": name, "weight_version": m.weight_version, "scores": scores})
        return httpx.Response(404, json={"error": {"type": "not_found", "message": request.url.path}})

    def generate(self, m: FakeMember, req: GenerateRequest) -> bytes:
        # Seeded by member and prompts (not by run): two runs over the same prompts sample alike.
        rng = random.Random(zlib.crc32(f"{m.name}:{req.prompts}".encode()))
        results = []
        for prompt in req.prompts:
            truth = _sum(prompt)
            samples = []
            for _ in range(req.n):
                if m.echo:
                    text = prompt.rstrip("=").rsplit("+", 1)[-1]
                elif truth is not None and (req.temperature == 0.0 or rng.random() < m.accuracy):
                    text = str(truth)
                else:
                    text = str(rng.randrange(0, 199)) if rng.random() < 0.9 else "x?"
                ids = [ord(c) % 64 for c in text] + [0]
                samples.append({"text": text, "token_ids": ids, "logprobs": [-0.5] * len(ids), "finish_reason": "stop"})
            results.append({"prompt": prompt, "prompt_token_ids": [ord(c) % 64 for c in prompt], "samples": samples})
        return json.dumps({"model": m.name, "weight_version": m.weight_version, "results": results}).encode()


# --- outside endpoints (OpenAI-compatible) ----------------------------------------------------------

Step = Literal["timeout", "connect_error", "invalid_json", "no_choices", "short", "no_content"] | int
"""One scripted reply: an HTTP status (with ``FakeEndpoint.headers``), a read timeout, a refused
connection, a body that is not JSON, a reply without ``choices``, one choice fewer than asked, or
choices without content."""


@dataclass
class FakeEndpoint:
    """An OpenAI-compatible server (``/chat/completions``, ``/completions``) answering the addition task
    correctly with probability ``accuracy``; judge requests (texts ending in ``?``) get an honest verdict."""

    name: str
    accuracy: float = 0.8
    key: str | None = None  # the Bearer token it demands (401 otherwise)
    n: Literal["accept", "reject", "ignore"] = "accept"  # what it does with n > 1
    logprobs: Literal["return", "omit", "reject"] = "return"
    script: list[Step] = field(default_factory=list)  # consumed one per request, before normal answers
    headers: dict[str, str] = field(default_factory=dict)  # sent with scripted statuses (Retry-After)
    delay_s: float = 0.0
    down: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)  # every request body received
    seen_auth: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError(f"{self.name} is down", request=request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return self._answer(request)
        finally:
            self.in_flight -= 1

    def _answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.seen_auth.append(request.headers.get("authorization"))
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            return httpx.Response(401, json={"error": {"message": "invalid api key", "type": "auth"}})
        chat = request.url.path.endswith("/chat/completions")
        if not chat and not request.url.path.endswith("/completions"):
            return httpx.Response(404, json={"error": {"message": request.url.path}})
        n = int(body.get("n", 1))
        wants_logprobs = bool(body.get("logprobs"))
        if n > 1 and self.n == "reject":
            return httpx.Response(400, json={"error": {"message": "n > 1 is not supported", "type": "invalid"}})
        if wants_logprobs and self.logprobs == "reject":
            return httpx.Response(400, json={"error": {"message": "logprobs are not supported"}})
        step = self.script.pop(0) if self.script else None
        if isinstance(step, int):
            return httpx.Response(step, headers=self.headers, json={"error": {"message": f"scripted {step}"}})
        if step == "timeout":
            raise httpx.ReadTimeout("scripted read timeout", request=request)
        if step == "connect_error":
            raise httpx.ConnectError("scripted refusal", request=request)
        if step == "invalid_json":
            return httpx.Response(200, content=b"<html>upstream error</html>")
        if step == "no_choices":
            return httpx.Response(200, json={"id": "x", "object": "error"})
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        count = 1 if self.n == "ignore" else n
        if step == "short":
            count = max(0, count - 1)
        # n samples of one request are drawn by prompt alone (two runs sample alike); one-sample
        # requests need their seed, or a prompt's G requests would all give the same answer.
        draw = body.get("seed") if n == 1 else None
        rng = random.Random(zlib.crc32(f"{self.name}:{text}:{draw}".encode()))
        if text.endswith("?"):  # a judge text: "ab+cd=<response>?"
            prompt, _, response = text[:-1].partition("=")
            truth = _sum(prompt + "=")
            right = response.strip() == str(truth)
            contents = ["Y" if right else "N"] * count
            tops = {"Y": math.log(0.9 if right else 0.1), "N": math.log(0.1 if right else 0.9)}
        else:
            truth = _sum(text)
            contents = [
                str(truth) if truth is not None and rng.random() < self.accuracy else str(rng.randrange(0, 199))
                for _ in range(count)
            ]
            tops = {}
        with_lp = wants_logprobs and self.logprobs == "return"
        choices: list[dict[str, Any]] = []
        for i, content in enumerate(contents):
            value: str | None = None if step == "no_content" else content
            lp: dict[str, Any] | None = None
            if chat:
                if with_lp:
                    cands = [{"token": t, "logprob": v} for t, v in tops.items()]
                    lp = {"content": [{"token": content, "logprob": -0.1, "top_logprobs": cands}]}
                message = {"role": "assistant", "content": value}
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": "stop"})
            else:
                if with_lp:
                    lp = {"tokens": [content], "token_logprobs": [-0.1], "top_logprobs": [tops], "text_offset": [0]}
                choices.append({"index": i, "text": value, "logprobs": lp, "finish_reason": "length"})
        usage = {"prompt_tokens": 7, "completion_tokens": 2 * len(contents), "total_tokens": 7 + 2 * len(contents)}
        obj = "chat.completion" if chat else "text_completion"
        reply = {"id": "cmpl-1", "object": obj, "model": body["model"], "choices": choices, "usage": usage}
        raw = json.dumps({**reply, "service_tier": None}).encode()
        if step == "huge":  # a valid reply padded past the client's byte bound: read whole, it would count
            from .endpoints.client import MAX_REPLY_BYTES

            raw += b" " * MAX_REPLY_BYTES
        return httpx.Response(200, content=raw, headers={"content-type": "application/json"})
