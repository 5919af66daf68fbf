"""The model server's in-memory weight path, with the tiny model in-process and the test as the
trainer (rank 0 of the weight group, over gloo on loopback): a broadcast version serves exactly what
the same weights loaded from files serve; a stale version or a manifest that is not the model's is
refused before a byte moves; changed bytes, a trainer that disappears mid-transfer and a group the
server is not in each leave the previous version serving, with the status the contract names."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from corl.transfer import GroupSpec, TransferError, TransferGroup, TransferRefused, dtype_name, shared

AUTH = {"Authorization": "Bearer test-admin-token"}
GREEDY = {"prompts": ["12+34=", "7+8="], "n": 1, "max_tokens": 6, "temperature": 0.0}


class Sender:
    """The trainer's side: hosts the rendezvous, joins as rank 0, broadcasts versions."""

    def __init__(self, timeout_s: float = 20.0) -> None:
        self.timeout_s = timeout_s
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
        self.group: TransferGroup | None = None

    async def join(self, client: httpx.AsyncClient, probe: shared.SharedRef | None = None) -> dict[str, Any]:
        gid = uuid.uuid4().hex
        spec = GroupSpec(gid, "127.0.0.1", self.store.port, 0, 2, "gloo", self.timeout_s)
        body = {
            "group_id": gid,
            "master_address": "127.0.0.1",
            "master_port": self.store.port,
            "rank_offset": 1,
            "world_size": 2,
            "backend": "gloo",
            "timeout_s": self.timeout_s,
        }
        if probe is not None:
            body["shared_probe"] = {"name": probe.name, "token": probe.token}
        self.group, resp = await asyncio.gather(
            asyncio.to_thread(TransferGroup.join, spec, self.store),
            client.post("/v1/weights/transfer", json=body, headers=AUTH),
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def broadcast(
        self,
        client: httpx.AsyncClient,
        version: int,
        tensors: dict[str, torch.Tensor],
        manifest: list[dict[str, Any]] | None = None,
        send: Callable[..., Any] | None = None,
        segment: shared.Segment | None = None,
    ) -> tuple[Any, httpx.Response]:
        """Post the version and send it at once; returns (what the send returned or raised, the answer)."""
        assert self.group is not None
        manifest = manifest or [
            {"name": n, "dtype": dtype_name(t.dtype), "shape": list(t.shape)} for n, t in tensors.items()
        ]
        body: dict[str, Any] = {"version": version, "group_id": self.group.group_id, "tensors": manifest}
        if segment is not None:  # the version is in the segment: the server copies it from there
            body["segment"] = {"name": segment.ref.name, "token": segment.ref.token}
            tensors = segment.views
        local = segment is not None

        async def sent() -> Any:
            try:
                return await asyncio.to_thread(
                    send or partial(self.group.send, local=local), version, list(tensors.values())
                )  # type: ignore[union-attr]
            except Exception as err:  # noqa: BLE001 - the test checks what the sender saw
                return err

        return tuple(await asyncio.gather(sent(), client.post("/v1/weights/broadcast", json=body, headers=AUTH)))  # type: ignore[return-value]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in sorted(load_file(path / "model.safetensors").items())}


async def _greedy(client: httpx.AsyncClient) -> tuple[int, list[list[str]], list[list[float]]]:
    r = await client.post("/v1/generate", json=GREEDY)
    assert r.status_code == 200, r.text
    body = r.json()
    texts = [[s["text"] for s in res["samples"]] for res in body["results"]]
    logprobs = [lp for res in body["results"] for s in res["samples"] for lp in [s["logprobs"]]]
    return body["weight_version"], texts, logprobs


async def test_a_broadcast_version_serves_what_its_files_serve(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    path, sha = make_weights(7)
    sender = Sender()
    joined = await sender.join(client)
    assert joined["ranks"] == [1] and joined["dtype"] == "float32" and joined["weight_version"] == 0
    _, before, _ = await _greedy(client)
    sent, resp = await sender.broadcast(client, 1, _tensors(path))
    assert resp.status_code == 200, resp.text
    assert resp.json()["weight_version"] == 1 and isinstance(sent, int) and sent > 0
    by_broadcast = await _greedy(client)
    assert by_broadcast[0] == 1 and by_broadcast[1] != before, "the broadcast did not change the weights"
    r = await client.post("/v1/weights", json={"version": 2, "uri": str(path), "sha256": sha}, headers=AUTH)
    assert r.status_code == 200, r.text
    by_files = await _greedy(client)
    assert by_files[0] == 2
    assert by_files[1:] == by_broadcast[1:], "the same weights by broadcast and by files must sample the same"
    metrics = (await client.get("/metrics")).text
    assert 'corl_server_weight_transfer_seconds_count{member="tiny"} 1.0' in metrics


@pytest.mark.skipif(not shared.available(), reason="no writable /dev/shm")
async def test_a_replica_on_the_trainers_host_takes_versions_from_shared_memory(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    path, sha = make_weights(7)
    probe = shared.Probe("tiny")
    try:
        unreadable = await Sender().join(client, shared.SharedRef(probe.ref.name, "0" * 32))
        sender = Sender()
        joined = await sender.join(client, probe.ref)
    finally:
        probe.remove()
    assert unreadable["shared_memory"] is False and joined["shared_memory"] is True
    tensors, other = _tensors(path), _tensors(make_weights(8)[0])
    first, second = (shared.Segment.create("tiny", tensors) for _ in range(2))
    try:
        for segment, version, weights in ((first, 1, tensors), (second, 2, other)):
            for name, t in weights.items():
                segment.views[name].copy_(t)
            sent, resp = await sender.broadcast(client, version, weights, segment=segment)
            assert resp.status_code == 200, resp.text
            assert sender.group is not None and sender.group.last_local, "the version went through the sockets"
            if version == 1:
                by_segment = await _greedy(client)
        # The server took both versions' pages as its weights (serving 2, and 1 as its spare): it holds both.
        assert sender.group.last_held == {first.id, second.id}
        # Version 3 by files lands in the spare, which held the first segment's pages: the server writes
        # into memory of its own, and the trainer's pages keep what it wrote.
        r = await client.post("/v1/weights", json={"version": 3, "uri": str(path), "sha256": sha}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert all(torch.equal(first.views[n], t) for n, t in tensors.items())
    finally:
        first.unlink()
        second.unlink()
    by_files = await _greedy(client)
    assert by_segment[0] == 1 and by_files[0] == 3
    assert by_files[1:] == by_segment[1:], "the same weights through shared memory and by files must sample the same"


async def test_a_stale_version_or_a_foreign_manifest_moves_no_byte(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    sender = Sender()
    await sender.join(client)
    good = _tensors(make_weights(7)[0])
    assert (await sender.broadcast(client, 3, good))[1].status_code == 200
    sent, resp = await sender.broadcast(client, 3, good)  # not newer than the serving version
    assert resp.status_code == 409 and resp.json()["error"]["field"] == "version"
    assert isinstance(sent, TransferRefused) and sent.ranks == [1]
    wider = _tensors(make_weights(8, n_embd=32)[0])  # another model's shapes
    sent, resp = await sender.broadcast(client, 4, wider)
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "tensors", resp.text
    assert isinstance(sent, TransferRefused)
    half = {k: v.half() for k, v in good.items()}  # not the serving dtype: nothing casts a broadcast
    sent, resp = await sender.broadcast(client, 4, half)
    assert resp.status_code == 422 and "dtype" in resp.json()["error"]["message"]
    assert (await _greedy(client))[0] == 3
    # The group is still whole: the next good version goes through it.
    assert (await sender.broadcast(client, 4, good))[1].status_code == 200


async def test_changed_bytes_are_refused_and_the_old_version_serves(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    sender = Sender()
    await sender.join(client)
    first, second = _tensors(make_weights(7)[0]), _tensors(make_weights(9)[0])
    assert (await sender.broadcast(client, 1, first))[1].status_code == 200
    served = await _greedy(client)
    assert sender.group is not None
    group = sender.group
    corrupt = {"done": False}

    def send_corrupted(version: int, tensors: list[torch.Tensor]) -> int:
        """The sender's bytes change after their fingerprints are taken (on the wire, as it were)."""
        original = group._broadcast

        def flip(t: torch.Tensor) -> Any:
            if not corrupt["done"] and t.numel() > 1000:
                t = t.clone()
                t.view(torch.uint8)[17] ^= 0x01
                corrupt["done"] = True
            return original(t)

        group._broadcast = flip  # type: ignore[method-assign,assignment]
        try:
            return group.send(version, tensors)
        finally:
            del group._broadcast

    sent, resp = await sender.broadcast(client, 2, second, send=send_corrupted)
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "tensors", resp.text
    assert await _greedy(client) == served, "a refused version must leave the previous one serving"
    assert (await sender.broadcast(client, 2, second))[1].status_code == 200


async def test_a_sender_that_vanishes_mid_transfer_leaves_the_old_version(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    sender = Sender(timeout_s=10)
    await sender.join(client)
    assert sender.group is not None
    group = sender.group
    first = _tensors(make_weights(7)[0])
    assert (await sender.broadcast(client, 1, first))[1].status_code == 200
    served = await _greedy(client)

    def send_half(version: int, tensors: list[torch.Tensor]) -> int:
        group.agree(version, True)
        group._broadcast(tensors[0]).wait()  # one tensor, then the trainer is gone
        group.close()
        raise TransferError("the trainer died")

    sent, resp = await sender.broadcast(client, 2, _tensors(make_weights(9)[0]), send=send_half)
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "unavailable", resp.text
    assert await _greedy(client) == served
    # The server left the broken group: a broadcast naming it is a conflict, a new group works.
    r = await client.post(
        "/v1/weights/broadcast",
        json={"version": 2, "group_id": group.group_id, "tensors": [{"name": "x", "dtype": "float32", "shape": [1]}]},
        headers=AUTH,
    )
    assert r.status_code == 409 and r.json()["error"]["field"] == "group_id"
    fresh = Sender()
    await fresh.join(client)
    assert (await fresh.broadcast(client, 2, first))[1].status_code == 200


async def test_the_weight_routes_need_the_admin_token(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/weights/broadcast",
        json={"version": 1, "group_id": "g", "tensors": [{"name": "x", "dtype": "float32", "shape": [1]}]},
    )
    assert r.status_code == 401
    r = await client.post(
        "/v1/weights/transfer",
        json={
            "group_id": "g",
            "master_address": "127.0.0.1",
            "master_port": 1,
            "rank_offset": 1,
            "world_size": 2,
            "backend": "gloo",
        },
    )
    assert r.status_code == 401


async def test_files_are_checked_by_the_faster_digest_when_given(
    client: httpx.AsyncClient, make_weights: Callable[..., tuple[Path, str]]
) -> None:
    from corl.weights_store import fast_digest

    path, sha = make_weights(7)
    body = {"version": 1, "uri": str(path), "sha256": "0" * 64, "xxh3_128": fast_digest(path)}
    r = await client.post("/v1/weights", json=body, headers=AUTH)  # sha256 is the record; xxh3 is checked
    assert r.status_code == 200, r.text
    body = {"version": 2, "uri": str(path), "sha256": sha, "xxh3_128": "0" * 32}
    r = await client.post("/v1/weights", json=body, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["field"] == "xxh3_128", r.text


async def test_a_group_the_server_cannot_join_is_refused_at_once(client: httpx.AsyncClient) -> None:
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = {
        "group_id": "g",
        "master_address": "127.0.0.1",
        "master_port": port,
        "rank_offset": 1,
        "world_size": 2,
        "backend": "gloo",
        "timeout_s": 30,
    }
    t0 = time.monotonic()
    r = await client.post("/v1/weights/transfer", json=body, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["field"] == "master_address", r.text
    assert time.monotonic() - t0 < 10, "an unreachable rendezvous must be refused, not waited for"
    r = await client.post("/v1/weights/transfer", json={**body, "backend": "nccl"}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["field"] == "backend", r.text  # a CPU server: gloo only
