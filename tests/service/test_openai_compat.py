"""The OpenAI-compatible routes with the official ``openai`` client against a live uvicorn server
serving the tiny model: chat with n, streaming, text completions, errors, and a hot swap while a
stream is being read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from corl.services.model.settings import ServerSettings
from corl.services.model.testing import running_server

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py ADMIN_TOKEN
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "12+34="}]
RENDERED = "user: 12+34=\nassistant:"  # the tiny model has no chat template: the plain rendering


@pytest.fixture
def server(server_settings: ServerSettings) -> Iterator[str]:
    with running_server(server_settings) as url:
        yield url


@pytest.fixture
def oai(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60.0)


def _generate(url: str, prompt: str, **kw: object) -> dict:
    body = {"prompts": [prompt], "n": 1, "max_tokens": 8, "temperature": 0.0, **kw}
    r = httpx.post(f"{url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["samples"][0]  # type: ignore[no-any-return]


def test_models_lists_the_member(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["tiny"]


def test_chat_n4_with_logprobs_and_weight_version(oai: openai.OpenAI, server: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny",
        messages=CHAT,
        n=4,
        max_tokens=8,
        temperature=1.0,
        top_p=0.9,
        seed=3,
        logprobs=True,
    )
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


def test_chat_without_max_tokens_fills_the_context_up_to_the_bound(oai: openai.OpenAI) -> None:
    resp = oai.chat.completions.create(model="tiny", messages=CHAT, n=4, temperature=1.0, seed=1, logprobs=True)
    room = min(32, 64 - len(RENDERED))  # tiny: 64 positions, a server bound of 32 new tokens
    lengths = {len(c.logprobs.content or []) for c in resp.choices if c.logprobs and c.finish_reason == "length"}
    assert lengths == {room}, [(c.finish_reason, c.message.content) for c in resp.choices]


def test_chat_stream_joins_to_the_completion(oai: openai.OpenAI) -> None:
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


def test_completions_with_prompts_n_logprobs_and_stop(oai: openai.OpenAI, server: str) -> None:
    prompts = ["12+34=", "07+08="]
    resp = oai.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=8, temperature=0, logprobs=0)
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
        ("completions", {"max_tokens": 10_000}, openai.UnprocessableEntityError, "max_tokens"),
        ("chat", {"stop": "\n"}, openai.UnprocessableEntityError, "stop"),  # no newline token: unmatchable
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


def test_hot_swap_during_a_stream_keeps_one_weight_version(
    oai: openai.OpenAI, server: str, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    path, sha = make_weights(7)
    kw: dict[str, Any] = dict(model="tiny", messages=CHAT, n=4, max_tokens=24, temperature=0)
    before = oai.chat.completions.create(**kw)
    raw = oai.chat.completions.with_raw_response.create(**kw, stream=True)
    assert raw.headers["x-corl-weight-version"] == "0"
    chunks = iter(raw.parse())
    first = next(chunks)
    swap = httpx.post(
        f"{server}/v1/weights",
        json={"version": 1, "uri": str(path), "sha256": sha, "format": "full"},
        headers=AUTH,
        timeout=60,
    )
    assert swap.status_code == 200, swap.text
    rest = list(chunks)
    assert {c.system_fingerprint for c in [first, *rest]} == {"corl-w0"}
    texts = ["" for _ in range(4)]
    for chunk in [first, *rest]:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in before.choices], "the stream mixed weight versions"
    after = oai.chat.completions.create(**kw)
    assert after.system_fingerprint == "corl-w1"
    assert [c.message.content for c in after.choices] != texts, "new weights changed nothing"
