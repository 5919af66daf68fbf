"""A server with a weights store (``weights_root``) loads only weight directories inside it: a path
outside, or a link in the store that points outside, is refused (403) and the old weights serve on."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py ADMIN_TOKEN


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    return root


@pytest.fixture
def server_settings(server_settings: Any, store: Path) -> Any:
    return server_settings.model_copy(update={"weights_root": store})


def _update(version: int, uri: Path | str, sha256: str) -> dict[str, Any]:
    return {"version": version, "uri": str(uri), "sha256": sha256}


async def _version(client: httpx.AsyncClient) -> int:
    return int((await client.get("/v1/info")).json()["weight_version"])


async def test_weights_outside_the_store_are_refused(client: httpx.AsyncClient, make_weights: Any, store: Path) -> None:
    outside, sha = make_weights(1)
    (store / "link").symlink_to(outside, target_is_directory=True)
    for uri in (outside, store / "link", store / ".." / outside.name, f"{store}/../{outside.name}"):
        r = await client.post("/v1/weights", json=_update(1, uri, sha), headers=AUTH)
        assert r.status_code == 403, (uri, r.text)
        err = r.json()["error"]
        assert err["type"] == "forbidden" and err["field"] == "uri" and "outside" in err["message"]
    assert await _version(client) == 0
    inside = store / "m" / "v000001"
    shutil.copytree(outside, inside)
    r = await client.post("/v1/weights", json=_update(1, inside, sha), headers=AUTH)
    assert r.status_code == 200, r.text
    assert await _version(client) == 1


async def test_an_unusable_path_is_422_not_a_server_error(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/weights", json=_update(1, "bad\x00path", "0" * 64), headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["field"] == "uri"


async def test_the_store_check_needs_the_admin_token_first(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/weights", json=_update(1, "/etc", "0" * 64))
    assert r.status_code == 401  # no hint about the store to a caller without the token
