"""Hot swap under load on a real uvicorn server on loopback: 8 clients generate continuously while
5 weight updates land (and, as a chaos test, 16 clients while 20 land). Nothing fails, versions only
move forward per client, and every greedy output belongs to exactly one version (a batch never mixes
weights)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from corl.services.model.settings import ServerSettings
from corl.services.model.testing import running_server

AUTH = {"Authorization": "Bearer test-admin-token"}
REQUEST = {"prompts": ["12+34="], "n": 2, "max_tokens": 6, "temperature": 0.0}


async def _client(url: str, stop: asyncio.Event, log: list[tuple[int, str]], failures: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:
        while not stop.is_set():
            try:
                r = await http.post("/v1/generate", json=REQUEST)
            except httpx.HTTPError as err:
                failures.append(repr(err))
                continue
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text}")
                continue
            body = r.json()
            for sample in body["results"][0]["samples"]:
                log.append((body["weight_version"], sample["text"]))


@pytest.mark.parametrize(
    ("clients", "updates"), [(8, 5), pytest.param(16, 20, marks=pytest.mark.chaos, id="chaos-16x20")]
)
async def test_hot_swap_under_load(
    server_settings: ServerSettings,
    make_weights: Callable[..., tuple[Path, str]],
    record_figure: Callable[..., None],
    clients: int,
    updates: int,
) -> None:
    CLIENTS, UPDATES = clients, updates
    published = {0} | set(range(1, UPDATES + 1))
    weights = {v: make_weights(100 + v) for v in range(1, UPDATES + 1)}
    swap_seconds: list[float] = []
    with running_server(server_settings) as url:
        stop = asyncio.Event()
        logs: list[list[tuple[int, str]]] = [[] for _ in range(CLIENTS)]
        failures: list[str] = []
        tasks = [asyncio.create_task(_client(url, stop, logs[i], failures)) for i in range(CLIENTS)]
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as admin:
            for version, (path, sha) in weights.items():
                await asyncio.sleep(0.3)
                body = {"version": version, "uri": str(path), "sha256": sha, "format": "full"}
                t0 = time.perf_counter()
                r = await admin.post("/v1/weights", json=body, headers=AUTH)
                swap_seconds.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks)
            metrics = (await admin.get("/metrics")).text

    served = sum(len(log) for log in logs) // REQUEST["n"]  # type: ignore[operator]
    monotonic = all([v for v, _ in log] == sorted(v for v, _ in log) for log in logs)
    record_figure(
        clients=CLIENTS,
        swaps=UPDATES,
        requests_served=served,
        requests_failed=len(failures),
        versions_monotonic=monotonic,
        max_swap_seconds=round(max(swap_seconds), 3),
    )
    assert failures == []
    by_version: dict[int, set[str]] = defaultdict(set)
    for log in logs:
        versions = [v for v, _ in log]
        assert log, "a client got no response"
        assert set(versions) <= published
        assert versions == sorted(versions), "a client saw the weight version go backwards"
        for v, text in log:
            by_version[v].add(text)
    assert set(by_version) == published, f"versions that served requests: {sorted(by_version)}"
    # Greedy decoding: each version answers one way; so a batch was served by one version only.
    assert all(len(texts) == 1 for v, texts in by_version.items() if v > 0), dict(by_version)
    assert len({next(iter(t)) for v, t in by_version.items() if v > 0}) > 1, "new weights changed nothing"
    assert f"corl_server_weight_version {UPDATES}.0" in metrics
