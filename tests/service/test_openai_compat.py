"""The OpenAI-compatible routes with the official ``openai`` client against a live uvicorn server
serving the tiny model: chat with n, streaming, text completions, errors, and a hot swap while a
stream is being read."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from corl.services.model.settings import ServerSettings
from corl.services.model.testing import running_server

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py ADMIN_TOKEN
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "12+34="}]
RENDERED = "user: 12+34=\nassistant:"  # the tiny model has no chat template: the plain rendering


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[str]:
    """One server for the tests that leave its weights alone (tests/conftest.py's bounds)."""
    settings = ServerSettings(
        _env_file=None,  # type: ignore[call-arg]
        model_dir=str(tiny_model_dir),
        name="tiny",
        num_threads=1,
        max_prompts=8,
        max_n=16,
        max_tokens=32,
    )
    with running_server(settings) as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)


@pytest.fixture(scope="module")
def oai(server: str) -> openai.OpenAI:
    return _client(server)


def _generate(url: str, prompt: str, **kw: object) -> dict:
    body = {"prompts": [prompt], "n": 1, "max_tokens": 8, "temperature": 0.0, **kw}
    r = httpx.post(f"{url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["samples"][0]  # type: ignore[no-any-return]


def test_models_lists_the_member(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["tiny"]


def test_chat_n4_with_logprobs_and_weight_version(oai: openai.OpenAI, server: str) -> None:
    sampling: dict[str, Any] = {"n": 4, "max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 3}
    raw = oai.chat.completions.with_raw_response.create(model="tiny", messages=CHAT, logprobs=True, **sampling)
    assert raw.headers["x-corl-weight-version"] == "0"
    resp = raw.parse()
    assert resp.object == "chat.completion" and resp.model == "tiny" and resp.system_fingerprint == "corl-w0"
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    tokens = 0
    for c in resp.choices:
        assert c.message.role == "assistant" and c.finish_reason in ("stop", "length")
        assert c.logprobs is not None and c.logprobs.content
        assert all(t.logprob <= 0.0 and t.top_logprobs == [] for t in c.logprobs.content)
        tokens += len(c.logprobs.content)
    assert resp.usage is not None and resp.usage.completion_tokens == tokens
    assert resp.usage.prompt_tokens == len(RENDERED)  # char tokenizer: one token per character
    # Greedy chat is exactly /v1/generate on the rendered chat: same rendering, same serving path.
    greedy = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0)
    assert greedy.choices[0].message.content == _generate(server, RENDERED)["text"]


def _batch_stats(url: str) -> tuple[float, float]:
    """(backend calls, requests merged into them) from the server's batching histogram."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    value = {m[0]: float(m[1]) for m in re.findall(r"^corl_server_batch_requests_(count|sum) (\S+)$", text, re.M)}
    return value["count"], value["sum"]


def test_concurrent_chats_share_batches_with_generate(oai: openai.OpenAI, server: str) -> None:
    calls0, merged0 = _batch_stats(server)
    chat: dict[str, Any] = dict(model="tiny", messages=CHAT, n=2, max_tokens=8, temperature=1.0)
    with ThreadPoolExecutor(8) as pool:
        chats = [pool.submit(lambda: oai.chat.completions.create(**chat)) for _ in range(6)]
        gens = [pool.submit(_generate, server, RENDERED, n=2, temperature=1.0) for _ in range(2)]
        assert all(len(f.result(timeout=60).choices) == 2 for f in chats) and all(g.result(timeout=60) for g in gens)
    calls, merged = _batch_stats(server)
    assert merged - merged0 == 8 and calls - calls0 < 8, "OpenAI requests bypassed the batcher"


def test_chat_without_max_tokens_fills_the_context_up_to_the_bound(oai: openai.OpenAI) -> None:
    resp = oai.chat.completions.create(model="tiny", messages=CHAT, n=4, temperature=1.0, seed=1, logprobs=True)
    room = min(32, 64 - len(RENDERED))  # tiny: 64 positions, a server bound of 32 new tokens
    lengths = {len(c.logprobs.content or []) for c in resp.choices if c.logprobs and c.finish_reason == "length"}
    assert lengths == {room}, [(c.finish_reason, c.message.content) for c in resp.choices]


def test_chat_stream_joins_to_the_completion(oai: openai.OpenAI, server: str) -> None:
    kw: dict[str, Any] = dict(model="tiny", messages=CHAT, n=2, max_tokens=12, temperature=0)
    whole = oai.chat.completions.create(**kw)
    texts, finish, fingerprints, usage = ["", ""], [None, None], set(), None
    for chunk in oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk"
        fingerprints.add(chunk.system_fingerprint)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert texts == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert fingerprints == {"corl-w0"}
    assert usage == whole.usage
    # On the wire: server-sent events, every one a data line, the last one OpenAI's end marker.
    r = httpx.post(f"{server}/v1/chat/completions", json={**kw, "stream": True}, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = r.text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


def test_completions_with_prompts_n_logprobs_and_stop(oai: openai.OpenAI, server: str) -> None:
    prompts = ["12+34=", "07+08="]
    penalties_off = {"frequency_penalty": 0, "presence_penalty": 0}  # some clients always send them
    resp = oai.completions.create(
        model="tiny", prompt=prompts, n=2, max_tokens=8, temperature=0, logprobs=0, **penalties_off
    )
    assert resp.object == "text_completion" and resp.system_fingerprint == "corl-w0"
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    for c in resp.choices:
        assert c.text == _generate(server, prompts[c.index // 2])["text"]
        assert c.logprobs is not None and c.logprobs.token_logprobs and c.logprobs.tokens
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)
    # A stop string cuts the text before it, streamed or not (seeded: the same tokens up to the stop).
    sampled: dict[str, Any] = dict(max_tokens=16, temperature=1.0, seed=5)
    full = _generate(server, prompts[0], **sampled)["text"]
    cut = next((i for i in range(1, len(full)) if full[i] not in full[:i]), None)
    assert cut is not None, f"sampled output {full!r} has no fresh character to stop at"
    stopped = oai.completions.create(model="tiny", prompt=prompts[0], stop=full[cut], **sampled)
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == (full[:cut], "stop")
    stream = oai.completions.create(model="tiny", prompt=prompts[0], stop=[full[cut]], stream=True, **sampled)
    assert "".join(c.choices[0].text for c in stream if c.choices) == full[:cut]


@pytest.mark.parametrize(
    ("route", "kw", "error", "field"),
    [
        ("chat", {"top_logprobs": 2, "logprobs": True}, openai.UnprocessableEntityError, "top_logprobs"),
        ("completions", {"logprobs": 3}, openai.UnprocessableEntityError, "logprobs"),
        ("chat", {"model": "gpt-4o"}, openai.NotFoundError, "model"),
        ("chat", {"n": 99}, openai.UnprocessableEntityError, "n"),
        ("chat", {"frequency_penalty": 0.5}, openai.UnprocessableEntityError, "frequency_penalty"),
        (
            "chat",
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            openai.UnprocessableEntityError,
            "tools",
        ),
        ("completions", {"max_tokens": 10_000}, openai.UnprocessableEntityError, "max_tokens"),
        ("completions", {"echo": True}, openai.UnprocessableEntityError, "echo"),
    ],
)
def test_errors_reach_the_client_in_the_shared_shape(
    oai: openai.OpenAI, route: str, kw: dict, error: type[openai.APIStatusError], field: str
) -> None:
    args = {"model": "tiny", "max_tokens": 4, **kw}
    with pytest.raises(error) as info:
        if route == "chat":
            oai.chat.completions.create(messages=CHAT, **args)
        else:
            oai.completions.create(prompt="12+34=", **args)
    body = info.value.body  # the client unwraps {"error": {...}}: OpenAI's message and type are there
    assert isinstance(body, dict) and body["field"] == field and field in body["message"]
    assert body["type"] in ("invalid_request", "not_found")


def _streamed(stream: Iterable[ChatCompletionChunk], n: int) -> tuple[set[str | None], list[str]]:
    fingerprints, texts = set(), ["" for _ in range(n)]
    for chunk in stream:
        fingerprints.add(chunk.system_fingerprint)
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    return fingerprints, texts


def _swap(server: str, version: int, weights: tuple[Path, str]) -> None:
    body = {"version": version, "uri": str(weights[0]), "sha256": weights[1], "format": "full"}
    r = httpx.post(f"{server}/v1/weights", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


def test_hot_swap_during_a_stream_keeps_one_weight_version(
    server_settings: ServerSettings, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    with running_server(server_settings) as server:
        _hot_swap_during_a_stream(_client(server), server, make_weights)


def _hot_swap_during_a_stream(oai: openai.OpenAI, server: str, make_weights: Callable[..., tuple[Path, str]]) -> None:
    # Seeded sampling: each version answers one way per choice, and the four choices differ.
    kw: dict[str, Any] = dict(model="tiny", messages=CHAT, n=4, max_tokens=32, temperature=1.0, seed=11)

    def texts_now() -> tuple[str | None, list[str]]:
        r = oai.chat.completions.create(**kw)
        return r.system_fingerprint, [c.message.content or "" for c in r.choices]

    answers = dict([texts_now()])
    # Weights are made before any stream: the server shares this process's torch RNG with seeded sampling.
    weights = make_weights(7), make_weights(8)
    # 1. The swap lands after the stream's first chunk: the rest still comes from version 0.
    raw = oai.chat.completions.with_raw_response.create(**kw, stream=True)
    assert raw.headers["x-corl-weight-version"] == "0"
    chunks = iter(raw.parse())
    first = next(chunks)
    _swap(server, 1, weights[0])
    fingerprints, texts = _streamed([first, *chunks], 4)
    assert fingerprints == {"corl-w0"} and texts == answers["corl-w0"], "the stream mixed weight versions"
    answers.update([texts_now()])
    assert set(answers) == {"corl-w0", "corl-w1"} and answers["corl-w1"] != texts, "new weights changed nothing"
    # 2. The swap races the stream's generation: whichever version serves it serves all of it.
    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(lambda: _streamed(oai.chat.completions.create(**kw, stream=True), 4))
        _swap(server, 2, weights[1])
        fingerprints, texts = streamed.result(timeout=60)
    answers.update([texts_now()])
    assert len(fingerprints) == 1 and fingerprints <= {"corl-w1", "corl-w2"}, fingerprints
    assert texts == answers[fingerprints.pop()]
