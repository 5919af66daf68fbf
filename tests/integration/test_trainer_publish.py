"""Weights store and replica pushes: atomic versioned folders with their checksum, retries with
backoff on 5xx/connection errors, 409 and 422 handled, a down replica caught up by ``sync``.
Downstream servers are faked with ``httpx.MockTransport``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from corl.proto import InfoResponse, WeightUpdateRequest
from corl.trainer.publish import ReplicaPusher, WeightsStore
from corl.weights_store import digest


@pytest.fixture
def store(tmp_path: Path, tiny_model_dir: Path) -> WeightsStore:
    s = WeightsStore(tmp_path, "a", keep=2)
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    for v in (1, 2, 3):
        s.save(model, tok, v, "full")
    return s


def test_store_keeps_newest_versions_with_checksums(store: WeightsStore) -> None:
    assert store.versions() == [2, 3] and store.latest_version() == 3
    pub = store.get(3, "full")
    assert pub.sha256 == digest(pub.path) and (pub.path / "config.json").exists()
    assert not list(store.dir.glob(".tmp-*"))
    with pytest.raises(FileExistsError):
        store.save(None, None, 3, "full")  # versions are never reused


class FakeReplica:
    """Answers like a model server: 503 for the first ``fail`` pushes, then swaps forward-only."""

    def __init__(self, fail: int = 0, version: int = 0, status: int | None = None):
        self.fail, self.version, self.status = fail, version, status
        self.pushes: list[WeightUpdateRequest] = []
        self.down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/info":
            return httpx.Response(
                200,
                json=InfoResponse(
                    name="a",
                    family="gpt2",
                    parameters=1,
                    backend="fake",
                    weight_version=self.version,
                    chat_template=False,
                ).model_dump(),
            )
        assert request.headers["authorization"] == "Bearer tok"
        req = WeightUpdateRequest.model_validate(json.loads(request.content))
        self.pushes.append(req)
        if self.fail:
            self.fail -= 1
            return httpx.Response(503, json={"error": {"type": "unavailable", "message": "busy"}})
        if self.status:
            return httpx.Response(self.status, json={"error": {"type": "invalid_request", "message": "bad"}})
        if req.version <= self.version:
            return httpx.Response(409, json={"error": {"type": "conflict", "message": "stale"}})
        prev, self.version = self.version, req.version
        return httpx.Response(200, json={"weight_version": req.version, "previous_version": prev, "swap_seconds": 0.0})


def _pusher(replicas: dict[str, FakeReplica]) -> ReplicaPusher:
    def route(request: httpx.Request) -> httpx.Response:
        return replicas[f"{request.url.scheme}://{request.url.host}"](request)

    client = httpx.Client(transport=httpx.MockTransport(route), timeout=5)
    return ReplicaPusher(list(replicas), "tok", client, attempts=3, max_wait_s=0.01)


def test_push_retries_5xx_and_reports_each_replica(store: WeightsStore) -> None:
    flaky, newer, broken = FakeReplica(fail=2), FakeReplica(version=9), FakeReplica(status=422)
    pusher = _pusher({"http://flaky": flaky, "http://newer": newer, "http://broken": broken})
    out = pusher.push(store.get(3, "full"))
    assert out == {"http://flaky": "ok", "http://newer": "already_newer", "http://broken": "rejected"}
    assert len(flaky.pushes) == 3 and flaky.version == 3  # two 503s, then the swap
    assert flaky.pushes[-1].sha256 == digest(store.get(3, "full").path)
    assert len(broken.pushes) == 1  # 422 is not retried
    assert pusher.behind == {"http://broken"}


def test_replica_that_was_down_gets_the_newest_version_when_back(store: WeightsStore) -> None:
    up, down = FakeReplica(), FakeReplica()
    down.down = True
    pusher = _pusher({"http://up": up, "http://down": down})
    assert pusher.push(store.get(2, "full")) == {"http://up": "ok", "http://down": "unreachable"}
    assert pusher.push(store.get(3, "full"))["http://down"] == "unreachable"
    assert pusher.sync(store.get(3, "full")) == {"http://down": "unreachable"}
    down.down = False
    assert pusher.sync(store.get(3, "full")) == {"http://down": "ok"}
    assert (up.version, down.version) == (3, 3) and not pusher.behind
    assert [p.version for p in down.pushes] == [3]  # straight to the newest, not the missed ones
