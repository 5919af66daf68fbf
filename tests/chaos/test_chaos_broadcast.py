"""Chaos on the in-memory weight path, with real processes: two ``corl serve model`` replicas of one
member (the tiny model) under steady client load, and the member's trainer side as its own process
(``broadcast_driver.py``: the project's broadcaster, store and pusher). A replica SIGKILLed mid-transfer,
a corrupted tensor, a manifest that is not the servers' model, a trainer SIGKILLed mid-broadcast: in
each, no client request fails but the killed replica's, every client sees versions only move forward,
the trainer is never held longer than the group's timeout, and every replica ends on the newest version.
Each test records its figures (``record_figure``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from chaos_cluster import ENV, Proc, wait_for, wait_ready

from corl.embedded.processes import corl_command
from corl.redis_server import free_port
from corl.transfer import shared

pytestmark = pytest.mark.chaos
Record = Callable[..., None]
DRIVER = Path(__file__).with_name("broadcast_driver.py")
TIMEOUT_S = 10.0  # the weight group's timeout in these tests
REQUEST = {"prompts": ["12+34="], "n": 1, "max_tokens": 4, "temperature": 0.0}


@dataclass
class Load:
    """Two clients per replica, generating until stopped; every answer's version and every failure kept."""

    urls: list[str]
    versions: dict[str, list[list[int]]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for url in self.urls:
            self.versions[url], self.failures[url] = [], []
            for _ in range(2):
                seen: list[int] = []
                self.versions[url].append(seen)
                t = threading.Thread(target=self._client, args=(url, seen), daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def _client(self, url: str, seen: list[int]) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    r = http.post("/v1/generate", json=REQUEST)
                    if r.status_code == 200:
                        seen.append(int(r.json()["weight_version"]))
                    else:
                        self.failures[url].append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as err:
                    self.failures[url].append(repr(err))
                    time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)

    def backwards(self) -> list[str]:
        """Clients that saw a version go back."""
        return [u for u, clients in self.versions.items() for seen in clients if seen != sorted(seen)]


def _server(tmp: Path, model: Path, name: str, port: int | None = None) -> Proc:
    port = port or free_port()
    args = corl_command("serve", "model", "--model", str(model), "--name", "alpha", "--port", str(port))
    return Proc(name, args, tmp / f"{name}.log", f"http://127.0.0.1:{port}").start()


@pytest.fixture
def replicas(tmp_path: Path, tiny_model_dir: Path) -> Iterator[list[Proc]]:
    procs = [_server(tmp_path, tiny_model_dir, f"replica-{i}") for i in range(2)]
    try:
        for p in procs:
            wait_ready(p)
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(params=["shared-memory", "sockets"])
def road(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The road the bytes take (the replicas are on the trainer's host): the driver's extra argument."""
    if request.param == "shared-memory" and not shared.available():
        pytest.skip("no writable /dev/shm")
    return () if request.param == "shared-memory" else ("--sockets",)


def _road(extra: tuple[str, ...]) -> str:
    return "sockets" if extra else "shared-memory"


def _driver(tmp: Path, model: Path, urls: list[str], versions: str, *extra: str) -> subprocess.Popen[bytes]:
    (tmp / "control").mkdir(exist_ok=True)
    args = [sys.executable, str(DRIVER), "--servers", ",".join(urls), "--model", str(model)]
    args += ["--store", str(tmp / "weights"), "--versions", versions, "--control", str(tmp / "control")]
    args += ["--timeout", str(TIMEOUT_S), *extra]
    with (tmp / "driver.log").open("ab") as err:
        return subprocess.Popen(args, env={**ENV, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=err)


def _lines(proc: subprocess.Popen[bytes], timeout_s: float = 120) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"the driver failed ({proc.returncode}); see driver.log"
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


def _served(url: str) -> int:
    return int(httpx.get(f"{url}/v1/info", timeout=10).json()["weight_version"])


def _paused(tmp: Path, proc: subprocess.Popen[bytes]) -> None:
    wait_for("the broadcast paused mid-transfer", lambda: (tmp / "control" / "paused").exists() or proc.poll(), 120)
    assert proc.poll() is None, "the driver ended before it paused"


def test_replica_sigkilled_mid_transfer(
    tmp_path: Path, tiny_model_dir: Path, replicas: list[Proc], road: tuple[str, ...], record_figure: Record
) -> None:
    urls = [p.url for p in replicas if p.url]
    load = Load(urls).start()
    driver = _driver(tmp_path, tiny_model_dir, urls, "1,2", "--pause-at", "5", *road)
    _paused(tmp_path, driver)
    replicas[1].kill9()
    (tmp_path / "control" / "go").write_text("")
    first, second = _lines(driver)
    # Version 1: the broadcast failed at once (a peer gone), replica 0 took it from the files.
    assert first["road"] == _road(road), first
    assert first["broadcast"] == {urls[0]: "unreachable", urls[1]: "unreachable"}, first
    assert first["files"] == {urls[0]: "ok", urls[1]: "unreachable"}
    assert float(first["broadcast_s"]) < TIMEOUT_S, "a dead replica held the trainer up past the timeout"
    # Version 2: the group rebuilt with the replica that answers; the dead one stays behind.
    assert second["broadcast"] == {urls[0]: "ok"} and second["files"] == {urls[1]: "unreachable"}
    # The killed replica comes back on its base weights and catches up from the files.
    replicas[1].start()
    wait_ready(replicas[1])
    driver = _driver(tmp_path, tiny_model_dir, urls, "3", *road)
    [third] = _lines(driver)
    load.stop()
    record_figure(
        broadcast_seconds_with_a_dead_replica=first["broadcast_s"],
        failed_requests_on_the_survivor=len(load.failures[urls[0]]),
        failed_requests_on_the_killed=len(load.failures[urls[1]]),
        third_version=third,
    )
    assert third["broadcast"] == {urls[0]: "ok", urls[1]: "ok"}
    assert [_served(u) for u in urls] == [3, 3]
    assert load.failures[urls[0]] == [] and load.backwards() == []


def test_corrupted_tensor_is_refused_and_the_files_bring_the_version(
    tmp_path: Path, tiny_model_dir: Path, replicas: list[Proc], road: tuple[str, ...], record_figure: Record
) -> None:
    urls = [p.url for p in replicas if p.url]
    load = Load(urls).start()
    first, second = _lines(_driver(tmp_path, tiny_model_dir, urls, "1,2", "--corrupt", *road))
    load.stop()
    record_figure(corrupted=first, after=second, failed_requests=sum(len(f) for f in load.failures.values()))
    assert first["road"] == second["road"] == _road(road), (first, second)
    assert first["broadcast"] == {urls[0]: "rejected", urls[1]: "rejected"}  # 422: fingerprint mismatch
    assert first["files"] == {urls[0]: "ok", urls[1]: "ok"}
    assert second["broadcast"] == {urls[0]: "ok", urls[1]: "ok"}  # the group stayed whole
    assert [_served(u) for u in urls] == [2, 2]
    assert all(f == [] for f in load.failures.values()) and load.backwards() == []
    log = "".join(p.tail(400) for p in replicas)
    assert "fingerprint" in log


def test_manifest_mismatch_moves_no_byte(
    tmp_path: Path,
    tiny_model_dir: Path,
    replicas: list[Proc],
    make_weights: Callable[..., tuple[Path, str]],
    record_figure: Record,
) -> None:
    urls = [p.url for p in replicas if p.url]
    foreign, _ = make_weights(3, n_embd=32)  # another model: other shapes
    load = Load(urls).start()
    first, second = _lines(_driver(tmp_path, tiny_model_dir, urls, "1,2", "--foreign", str(foreign)))
    load.stop()
    record_figure(mismatch=first, after=second, failed_requests=sum(len(f) for f in load.failures.values()))
    assert first["broadcast"] == {urls[0]: "rejected", urls[1]: "rejected"}, first
    assert first["files"] == {urls[0]: "ok", urls[1]: "ok"}  # the right weights, by files
    # A replica that refused the manifest is not this trainer's model as far as broadcasts go: files from then on.
    assert second["broadcast"] == {} and second["files"] == {urls[0]: "ok", urls[1]: "ok"}
    assert [_served(u) for u in urls] == [2, 2]
    assert all(f == [] for f in load.failures.values()) and load.backwards() == []
    assert "tensor shape mismatch" in "".join(p.tail(400) for p in replicas)


def test_trainer_sigkilled_mid_broadcast(
    tmp_path: Path, tiny_model_dir: Path, replicas: list[Proc], road: tuple[str, ...], record_figure: Record
) -> None:
    urls = [p.url for p in replicas if p.url]
    [first] = _lines(_driver(tmp_path, tiny_model_dir, urls, "1", *road))
    assert first["broadcast"] == {urls[0]: "ok", urls[1]: "ok"}
    load = Load(urls).start()
    driver = _driver(tmp_path, tiny_model_dir, urls, "2", "--pause-at", "5", *road)
    _paused(tmp_path, driver)
    t0 = time.monotonic()
    driver.kill()
    driver.wait(30)
    # Both replicas leave the broken group and keep serving version 1 (its files are there too).
    wait_for("the replicas left the group", lambda: all("left" in _group_state(p) for p in replicas), 60)
    left_s = time.monotonic() - t0
    assert [_served(u) for u in urls] == [1, 1]
    # The restarted trainer never reuses a version it may have sent: it publishes 3.
    [third] = _lines(_driver(tmp_path, tiny_model_dir, urls, "3", *road))
    load.stop()
    if not road:  # the killed trainer's segment (never unlinked: no version went through it) is swept
        assert not list(shared.SHARED_DIR.glob(f"corl-weights-alpha-{driver.pid}-*"))
    record_figure(
        seconds_to_leave_the_group=round(left_s, 2), failed_requests=sum(len(f) for f in load.failures.values())
    )
    assert first["road"] == third["road"] == _road(road), (first, third)
    assert third["broadcast"] == {urls[0]: "ok", urls[1]: "ok"}
    assert [_served(u) for u in urls] == [3, 3]
    assert all(f == [] for f in load.failures.values()) and load.backwards() == []


def _group_state(p: Proc) -> str:
    """'left' once the replica's log says its broadcast failed (the group is gone), else ''."""
    return "left" if "weight broadcast 2 failed" in p.tail(400) else ""
