"""Fake cohort members for tests and the benchmark: an ``httpx.MockTransport`` handler that answers
``/v1/generate``, ``/v1/grade`` and ``/v1/info`` per the contract, for members addressed as ``http://<name>.fake``.

Each fake member answers the addition task correctly with probability ``accuracy`` (else a random
number or junk), and always correctly at temperature 0 (its greedy answer is right); members can be
down (connection refused), flaky (503 every other call) or slow.
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from dataclasses import dataclass, field

import httpx

from corl.proto import GenerateRequest, GradeRequest


def _sum(prompt: str) -> int | None:
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
    calls: int = 0
    grade_calls: int = 0
    generated: list[tuple[float, int]] = field(default_factory=list)  # (temperature, n) of each generate call


@dataclass
class FakeCohort:
    members: dict[str, FakeMember] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    flaky: set[str] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)  # name -> seconds before answering

    @classmethod
    def of(cls, *names: str, accuracy: float = 0.8) -> FakeCohort:
        return cls({n: FakeMember(n, accuracy=accuracy) for n in names})

    @staticmethod
    def url(name: str) -> str:
        return f"http://{name}.fake"

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        name = request.url.host.removesuffix(".fake")
        if name in self.slow:
            await asyncio.sleep(self.slow[name])
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
            req = GradeRequest.model_validate_json(request.content)
            rng = random.Random(m.grade_calls)
            scores = []
            for it in req.items:
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
                if truth is not None and (req.temperature == 0.0 or rng.random() < m.accuracy):
                    text = str(truth)
                else:
                    text = str(rng.randrange(0, 199)) if rng.random() < 0.9 else "x?"
                ids = [ord(c) % 64 for c in text] + [0]
                samples.append({"text": text, "token_ids": ids, "logprobs": [-0.5] * len(ids), "finish_reason": "stop"})
            results.append({"prompt": prompt, "prompt_token_ids": [ord(c) % 64 for c in prompt], "samples": samples})
        return json.dumps({"model": m.name, "weight_version": m.weight_version, "results": results}).encode()
