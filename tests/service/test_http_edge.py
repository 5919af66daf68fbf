"""The HTTP edge as a client sees it: the published schema states the server's own bounds, bad
bodies are 422 naming the field, unknown methods are 405 with ``Allow``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corl.proto._base import WireRequest
from corl.services.http import _field_of, install_error_handlers
from corl.services.model.app import create_app
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend
from corl.tasks import task_names


async def test_the_live_schema_publishes_this_servers_bounds(client: httpx.AsyncClient, server_settings: Any) -> None:
    doc = (await client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    gen, grade = schemas["GenerateRequest"]["properties"], schemas["GradeRequest"]
    assert gen["prompts"]["maxItems"] == grade["properties"]["items"]["maxItems"] == server_settings.max_prompts == 8
    assert gen["n"]["maximum"] == grade["properties"]["n_votes"]["maximum"] == server_settings.max_n == 16
    assert gen["max_tokens"]["maximum"] == schemas["SamplingSettings"]["properties"]["max_tokens"]["maximum"] == 32
    assert grade["properties"]["task"]["enum"] == task_names()
    # The tiny char tokenizer cannot say "Yes"/"No" in one token: math is not judged here, and the schema says so.
    assert grade["if"] == {"properties": {"mode": {"const": "judge"}}, "required": ["mode"]}
    assert "math" not in grade["then"]["properties"]["task"]["enum"]
    assert doc["paths"]["/v1/weights"]["post"]["security"] == [{"admin": []}]
    over = await client.post("/v1/generate", json={"prompts": ["1+1="], "n": 17})
    assert over.status_code == 422 and over.json()["error"]["field"] == "n"
    judge = {"task": "math", "mode": "judge", "items": [{"prompt": "2+2?", "response": "4"}]}
    refused = await client.post("/v1/grade", json=judge)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "task"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompts": ["1+1="], "n": "2"}, "n"),  # strings are not coerced into numbers
        ({"prompts": ["1+1="], "n": True}, "n"),
        ({"prompts": ["1+1="], "format": {"chat": 0}}, "format.chat"),
        ({"prompts": ["1+1="], "temperature": False}, "temperature"),
        ({"prompts": ["1+1="], "format": {"template": "no slot"}}, "format.template"),
        ({"prompts": ["1+1="], "seed": 2**64}, "seed"),
    ],
)
async def test_what_the_schema_calls_invalid_is_refused(client: httpx.AsyncClient, body: dict, field: str) -> None:
    r = await client.post("/v1/generate", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == {"type": "invalid_request", "field": field, "message": r.json()["error"]["message"]}


async def test_integral_numbers_are_integers_as_json_schema_says(client: httpx.AsyncClient) -> None:
    body = b'{"prompts": ["1+1="], "n": 2.0, "max_tokens": 3.0}'
    r = await client.post("/v1/generate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"][0]["samples"]) == 2


async def test_unreadable_bodies_are_422_not_400(client: httpx.AsyncClient) -> None:
    for content in (b"\xff\xfe not utf-8", b"{not json"):
        r = await client.post("/v1/generate", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (content, r.text)
        assert r.json()["error"]["type"] == "invalid_request" and r.json()["error"]["field"] == "body"


@pytest.mark.parametrize(("method", "path", "allow"), [("DELETE", "/v1/generate", "POST"), ("PUT", "/healthz", "GET")])
async def test_unknown_methods_are_405_with_allow(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    r = await client.request(method, path)
    assert r.status_code == 405 and r.headers["Allow"] == allow
    assert r.json()["error"]["type"] == "method_not_allowed"


def test_field_of_drops_only_the_location() -> None:
    assert _field_of(("body", "items", 0, "prompt")) == "items.0.prompt"
    assert _field_of(("body", "body", "query")) == "body.query"  # fields that share a location's name survive
    assert _field_of(("query", "max")) == "max"
    assert _field_of(("body",)) == "body"


class _Nested(WireRequest):
    query: int


class _Body(WireRequest):
    body: _Nested


async def test_a_field_named_like_a_location_is_named_in_full() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/x")
    async def x(b: _Body) -> None:
        return None

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/x", json={"body": {"query": "nope"}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "body.query"


async def test_omitted_fields_fit_a_server_with_bounds_below_the_contract_defaults() -> None:
    """max_tokens defaults to 16 and n_votes to 8; a server bounded at 8 and 4 still serves requests
    that leave them out (with its bound as the default, as its schema says) instead of refusing them."""
    settings = ServerSettings(_env_file=None, model_dir="unused", max_tokens=8, max_n=4)  # type: ignore[call-arg]
    app = create_app(settings, FakeBackend())
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as c:
            schemas = (await c.get("/openapi.json")).json()["components"]["schemas"]
            assert schemas["GenerateRequest"]["properties"]["max_tokens"]["default"] == 8
            assert schemas["SamplingSettings"]["properties"]["max_tokens"]["default"] == 8
            assert schemas["GradeRequest"]["properties"]["n_votes"]["default"] == 4
            assert (await c.post("/v1/generate", json={"prompts": ["1+1="]})).status_code == 200
            grade = {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}]}
            assert (await c.post("/v1/grade", json=grade)).json()["scores"] == [0.0]  # FakeBackend says 46
            given = await c.post("/v1/generate", json={"prompts": ["1+1="], "max_tokens": 9})
            assert given.status_code == 422 and given.json()["error"]["field"] == "max_tokens"


async def test_stop_strings_the_tokenizer_cannot_produce_are_not_a_server_error(client: httpx.AsyncClient) -> None:
    """transformers refuses stop strings no token sequence makes ("\\t" for the char tokenizer); such a
    string can never occur in the output, so it ends nothing and the request is served."""
    for stop in (["\t"], ["é", "\n\n"], ["\t", "+"]):
        r = await client.post("/v1/generate", json={"prompts": ["1+1="], "max_tokens": 6, "stop": stop, "seed": 1})
        assert r.status_code == 200, (stop, r.text)
        assert all(not any(s in x["text"] for s in stop) for x in r.json()["results"][0]["samples"])


async def test_one_client_cannot_hold_every_worker() -> None:
    """Past its own limit of requests in flight a client gets 429 (Retry-After); other clients and the
    probes are served meanwhile, and the client is served again once its requests are answered."""
    import asyncio

    from corl.services.http import ClientConcurrencyMiddleware

    release = asyncio.Event()
    app = FastAPI()

    @app.get("/v1/slow")
    async def slow() -> dict[str, bool]:
        await release.wait()
        return {"ok": True}

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    install_error_handlers(app)
    app.add_middleware(ClientConcurrencyMiddleware, max_in_flight=2)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        greedy = {"Authorization": "Bearer greedy"}
        held = [asyncio.create_task(c.get("/v1/slow", headers=greedy)) for _ in range(2)]
        await asyncio.sleep(0.05)
        refused = await c.get("/v1/slow", headers=greedy)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "rate_limited"
        assert (await c.get("/healthz", headers=greedy)).status_code == 200  # probes are never counted
        other = asyncio.create_task(c.get("/v1/slow", headers={"Authorization": "Bearer other"}))
        await asyncio.sleep(0.05)
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held, other)] == [200, 200, 200]
        assert (await c.get("/v1/slow", headers=greedy)).status_code == 200  # its slots came back
