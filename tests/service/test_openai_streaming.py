"""Streaming for real: with the official ``openai`` client against a live server of the tiny model
whose decode steps are slowed and timed, the first chunk arrives while the model is still decoding,
a weight swap that lands mid-stream changes neither the tokens nor the version the chunks report,
a failure after the first chunk ends the stream with an error event, and a client that leaves
stops the decoding."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from corl.models import sampling
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import running_server

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py ADMIN_TOKEN
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "12+34="}]
STEP_S = 0.05  # each forward pass of the decode loop takes at least this long
# Seeded sampling from the tiny random model: 24 tokens, no end token (checked where it matters).
SAMPLED: dict[str, Any] = dict(model="tiny", max_tokens=24, temperature=1.0, seed=4)


class Forwards:
    """The server's decode loop, slowed to ``STEP_S`` a forward pass, with the time each one ended
    (the prefill's gives the first token, each later one the next); ``fail_at``: the forward pass
    (1-based) that raises instead."""

    def __init__(self) -> None:
        self.done: list[float] = []
        self.fail_at: int | None = None

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        def slow(*args: Any, **kwargs: Any) -> Any:
            if self.fail_at is not None and len(self.done) + 1 >= self.fail_at:
                raise RuntimeError("CUDA error: device lost")
            time.sleep(STEP_S)
            out = forward(*args, **kwargs)
            self.done.append(time.perf_counter())
            return out

        return slow

    def settle(self) -> int:
        """Forward passes run once the decode loop has stopped."""
        count = -1
        while count != len(self.done):
            count = len(self.done)
            time.sleep(4 * STEP_S)
        return count


@pytest.fixture
def forwards(monkeypatch: pytest.MonkeyPatch) -> Forwards:
    f = Forwards()
    monkeypatch.setattr(sampling, "_forward", f.wrap(sampling._forward))
    return f


@pytest.fixture
def server(server_settings: ServerSettings) -> Iterator[str]:
    with running_server(server_settings) as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_the_first_chunk_arrives_while_the_model_is_still_decoding(server: str, forwards: Forwards, route: str) -> None:
    oai = _client(server)
    kw: dict[str, Any] = dict(SAMPLED, n=2, stream=True, stream_options={"include_usage": True})
    stream = (
        oai.chat.completions.create(messages=CHAT, **kw)
        if route == "chat"
        else oai.completions.create(prompt="12+34=", **kw)
    )
    chunks, first_at, decoded_then = [], None, None
    for chunk in stream:
        if first_at is None and any((c.delta.content if route == "chat" else c.text) for c in chunk.choices):  # type: ignore[union-attr]
            first_at, decoded_then = time.perf_counter(), len(forwards.done)
        chunks.append(chunk)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 2 * 24, "the test needs two whole-length choices"
    assert first_at is not None and decoded_then is not None
    # 24 tokens are 24 forward passes (a prefill, then one per token after the first): the first text
    # arrived (within a few steps, however loaded the machine) well before the last one ended.
    assert len(forwards.done) == 24
    assert decoded_then <= 12, f"first chunk after {decoded_then} of 24 decode steps"
    assert first_at < forwards.done[-1] - 10 * STEP_S


def test_streamed_tokens_and_log_probs_are_those_of_the_same_request_not_streamed(
    server: str, forwards: Forwards
) -> None:
    oai = _client(server)
    kw: dict[str, Any] = dict(SAMPLED, prompt=["12+34=", "07+08="], n=2, logprobs=0, stop=["5"])
    whole = oai.completions.create(**kw)
    texts, finish = [""] * 4, [None] * 4
    tokens: list[list[str]] = [[] for _ in range(4)]
    logprobs: list[list[float]] = [[] for _ in range(4)]
    for chunk in oai.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            finish[c.index] = c.finish_reason or finish[c.index]
            if c.logprobs is not None:
                tokens[c.index] += c.logprobs.tokens or []
                logprobs[c.index] += c.logprobs.token_logprobs or []
    assert texts == [c.text for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert "stop" in finish, "the test needs a choice that ends at its stop string"
    for c in whole.choices:
        assert c.logprobs is not None
        assert tokens[c.index] == c.logprobs.tokens and logprobs[c.index] == c.logprobs.token_logprobs


def _swap(server: str, version: int, weights: tuple[Path, str]) -> float:
    body = {"version": version, "uri": str(weights[0]), "sha256": weights[1], "format": "full"}
    r = httpx.post(f"{server}/v1/weights", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return time.perf_counter()


def test_a_swap_that_lands_mid_stream_changes_neither_tokens_nor_version(
    server: str, forwards: Forwards, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    oai = _client(server)
    kw: dict[str, Any] = dict(SAMPLED, messages=CHAT)
    before = oai.chat.completions.create(**kw).choices[0].message.content
    weights = make_weights(7)  # made first: the server shares this process's torch RNG with seeded sampling
    start = len(forwards.done)
    raw = oai.chat.completions.with_raw_response.create(**kw, stream=True)
    assert raw.headers["x-corl-weight-version"] == "0"
    chunks = iter(raw.parse())
    first = next(chunks)
    swapped_at = _swap(server, 1, weights)
    decoded_by_swap = len(forwards.done) - start
    rest = list(chunks)
    assert decoded_by_swap < 24 and swapped_at < forwards.done[-1], "the swap did not land mid-stream"
    assert {c.system_fingerprint for c in [first, *rest]} == {"corl-w0"}
    assert "".join(c.delta.content or "" for ch in [first, *rest] for c in ch.choices) == before
    after = oai.chat.completions.create(**kw)
    assert after.system_fingerprint == "corl-w1" and after.choices[0].message.content != before


def test_a_failure_after_the_first_chunk_ends_the_stream_with_an_error_event(server: str, forwards: Forwards) -> None:
    oai = _client(server)
    forwards.fail_at = 6
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in oai.chat.completions.create(messages=CHAT, **SAMPLED, stream=True):
            received.append(chunk)
    assert any(c.delta.content for ch in received for c in ch.choices), "no token arrived before the failure"
    assert info.value.body == {"type": "unavailable", "message": info.value.message}  # the shared error shape
    assert "device lost" in info.value.message
    forwards.fail_at = None
    assert oai.chat.completions.create(messages=CHAT, **SAMPLED).choices[0].message.content


def test_a_failure_before_the_first_token_is_an_http_error(server: str, forwards: Forwards) -> None:
    forwards.fail_at = 1
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": CHAT, **SAMPLED, "stream": True}, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable"


def test_a_client_that_leaves_stops_the_decoding(server: str, forwards: Forwards) -> None:
    oai = _client(server)
    kw: dict[str, Any] = dict(SAMPLED, max_tokens=32)
    stream = oai.chat.completions.create(messages=CHAT, **kw, stream=True)
    next(iter(stream))
    stream.close()
    assert forwards.settle() < 16, "the server decoded on for a client that had left"
    assert oai.chat.completions.create(messages=CHAT, **SAMPLED).choices[0].message.content
