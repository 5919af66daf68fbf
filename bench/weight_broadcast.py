"""The in-memory weight path against the file path, with the project's own code: R real model servers
(``corl serve model`` processes on loopback, each serving the model's directory) and this process as
the member's trainer (``WeightBroadcaster``, ``cpu_snapshot``, ``WeightsStore``, ``ReplicaPusher``).
``weight_sync.py --broadcast`` / ``--broadcast-check`` run it.

One version is published each way per repeat, while a light client per replica keeps asking for one
token and notes the version that answered:

- ``floor_s``: one in-memory copy of the version's bytes (in the serving dtype) into memory already
  touched, the least any path from the trainer's weights to a server's must cost (taken just before
  each version, under the same load);
- ``stall_s``: what the trainer's step waits for. broadcast, as the trainer does it (``trainer/publishing.py``):
  a thread takes the CPU snapshot (then broadcasts it and writes the files) beside the next step, a
  forward and backward pass of a short batch, whose optimizer step then waits for the snapshot: the
  stall is that wait. files: the whole publish (write, sha256, xxh3, fsync, rename) and the pushes,
  one replica after another, as the trainer does;
- ``snapshot_s`` (broadcast): the snapshot's own time, beside the step. On shared cores that is CPU
  time the step loses (on a GPU, a device-to-host copy); ``step_alone_s`` / ``step_beside_s``: that
  forward and backward pass with nothing publishing, and beside the publish (on two busy cores the
  step's time varies by more than the snapshot's between repeats, so their difference says little);
- ``visible_s``: from the trainer having the new weights to the first answer tagged with the new
  version from *every* replica (what a round sees);
- ``pause_s``: the longest a client's request took while the version arrived, beyond the median before
  it (the transformers backend swaps a spare copy: serving should never stop);
- broadcast only: ``send_s`` (the broadcast, to every replica's answer) and ``files_after_s`` (the
  durable copy written from the snapshot afterwards, off the step).

Each figure is the best of the repeats. The trainer holds the weights in float32 (as it trains them);
the files path writes them so (today's publish), the broadcast sends the servers' dtype.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-admin-token"
STEP_BATCH = (1, 64)  # the next step's batch beside a publish: far shorter than a real step, the harder case
PROBE = {"prompts": ["1"], "n": 1, "max_tokens": 1, "temperature": 0.0}


@dataclass
class Prober:
    """One replica's client: asks for a token again and again, notes (sent, answered, version)."""

    url: str
    seen: list[tuple[float, float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = http.post("/v1/generate", json=PROBE)
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    self.seen.append((t0, time.perf_counter(), int(r.json()["weight_version"])))
                time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(130)

    def first_seen(self, version: int, after: float, timeout_s: float = 600) -> float:
        """When the first answer tagged ``version`` (or newer) came back."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            for _, done, v in list(self.seen):
                if v >= version and done >= after:
                    return done
            time.sleep(0.002)
        raise TimeoutError(f"{self.url} never answered with version {version}")

    def pause(self, start: float, end: float) -> float:
        """The slowest request in flight during [start, end] beyond the median latency before ``start``."""
        before = [done - sent for sent, done, _ in self.seen if done < start]
        during = [done - sent for sent, done, _ in self.seen if done >= start and sent <= end]
        if not before or not during:
            return 0.0
        return max(0.0, max(during) - statistics.median(before))


@contextmanager
def servers(model_dir: Path, count: int, log_dir: Path) -> Iterator[list[str]]:
    """``count`` model servers of ``model_dir``, ready; one torch thread each."""
    from corl.embedded.processes import corl_command, die_with_parent, terminate
    from corl.health import running, wait_healthy
    from corl.redis_server import free_port

    env = {**os.environ, "CORL_ADMIN_TOKEN": TOKEN, "CORL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    procs, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            cmd = corl_command("serve", "model", "--model", str(model_dir), "--name", "m", "--port", str(port))
            with (log_dir / f"server-{i}.log").open("ab") as out:
                procs.append(
                    subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
                )
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_healthy(f"{url}/readyz", 900, alive=running(proc, lambda: f"see {log_dir}"))
        yield urls
    finally:
        for proc in procs:
            terminate(proc, 30)


def copy_once(source: dict[str, Any], dest: dict[str, Any]) -> float:
    """Seconds to copy every tensor of ``source`` into ``dest`` (the copy floor, once ``dest`` is touched)."""
    t0 = time.perf_counter()
    for n, t in source.items():
        dest[n].copy_(t)
    return time.perf_counter() - t0


class Publish(threading.Thread):
    """The trainer's publish of one version by broadcast: the snapshot (``taken`` once it has read the
    weights), then the broadcast, in a thread beside the next step."""

    def __init__(self, model: Any, broadcaster: Any, version: int, staging: Any, uri: str):
        super().__init__(daemon=True)
        self.model, self.broadcaster, self.version, self.staging, self.uri = model, broadcaster, version, staging, uri
        self.taken = threading.Event()
        self.snapshot: dict[str, Any] = {}
        self.outcomes: dict[str, str] = {}
        self.taken_at = self.sent_at = 0.0

    def run(self) -> None:
        import torch

        from corl.trainer.snapshot import cpu_snapshot

        try:
            with torch.no_grad():
                self.snapshot = cpu_snapshot(self.model.state_dict(), self.broadcaster.dtype, self.staging)
        finally:
            self.taken_at = time.perf_counter()
            self.taken.set()
        self.outcomes = self.broadcaster.send(self.version, self.snapshot, self.uri)
        self.sent_at = time.perf_counter()


def next_step(model: Any, batch: Any) -> float:
    """Seconds of the forward and backward passes of a trainer's step on ``batch`` (its optimizer step,
    which changes the weights, is what waits for a snapshot)."""
    t0 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    model(input_ids=batch, labels=batch).loss.backward()
    return time.perf_counter() - t0


def measure(model_dir: Path, replicas: int, repeats: int, work: Path) -> dict[str, Any]:
    """Both paths for one model and ``replicas`` servers: the figures of the module docstring."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.trainer.broadcast import WeightBroadcaster
    from corl.trainer.metrics import TrainerMetrics
    from corl.trainer.publish import ReplicaPusher, WeightsStore
    from corl.trainer.settings import TrainerSettings
    from corl.trainer.snapshot import cpu_snapshot

    work.mkdir(parents=True, exist_ok=True)
    row: dict[str, Any] = {"replicas": replicas}
    with servers(model_dir, replicas, work) as urls:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # what the trainer holds
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        store = WeightsStore(work / "weights", "m", keep=2)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        http = httpx.Client(timeout=600)
        settings = TrainerSettings(admin_token=TOKEN, transfer_timeout_s=300)  # type: ignore[call-arg]
        broadcaster = WeightBroadcaster("m", urls, http, headers, settings, torch.device("cpu"), TrainerMetrics("m"))
        pusher = ReplicaPusher(urls, TOKEN, http)
        t0 = time.perf_counter()
        assert broadcaster.join() and broadcaster.dtype is not None, "the replicas did not join the weight group"
        row["join_s"] = time.perf_counter() - t0
        probers = [Prober(u) for u in urls]
        for p in probers:
            p.start()
        # A trainer's snapshot buffers exist after its first publish; the floor's destination is touched
        # once. The floor is then taken under the same load as each version (the probes keep running).
        snapshot = cpu_snapshot(model.state_dict(), broadcaster.dtype)
        dest = {n: torch.empty_like(t) for n, t in snapshot.items()}
        batch = torch.randint(0, len(tokenizer), STEP_BATCH, generator=torch.Generator().manual_seed(0))
        next_step(model, batch)  # the gradients' memory, as a trainer's after its first step
        copy_once(snapshot, dest)
        time.sleep(2.0)  # latencies before any update: the pause's baseline
        runs: dict[str, list[dict[str, float]]] = {"broadcast": [], "files": []}
        floors = []
        version = 0
        for _ in range(repeats):
            step_alone = next_step(model, batch)  # nothing publishing
            with torch.no_grad():  # a new version: different bytes, same names and shapes
                next(model.parameters()).add_(1e-3)
            version += 1
            floors.append(copy_once(snapshot, dest))
            publish = Publish(model, broadcaster, version, broadcaster.staging(snapshot), str(store.path(version)))
            t0 = time.perf_counter()  # the trainer has the new weights
            publish.start()
            step_beside = next_step(model, batch)
            waited = time.perf_counter()
            publish.taken.wait()  # the optimizer step's wait
            stall = time.perf_counter() - waited
            publish.join()
            snapshot = publish.snapshot
            assert set(publish.outcomes.values()) == {"ok"}, f"broadcast failed: {publish.outcomes}"
            seen = max(p.first_seen(version, t0) for p in probers)
            store.save(model, tokenizer, version, "full", state_dict=dict(snapshot))
            runs["broadcast"].append(
                {
                    "stall_s": stall,
                    "snapshot_s": publish.taken_at - t0,
                    "send_s": publish.sent_at - publish.taken_at,
                    "visible_s": seen - t0,
                    "pause_s": max(p.pause(t0, seen) for p in probers),
                    "files_after_s": time.perf_counter() - publish.sent_at,
                    "step_alone_s": step_alone,
                    "step_beside_s": step_beside,
                }
            )
            version += 1
            t0 = time.perf_counter()
            pub = store.save(model, tokenizer, version, "full")
            assert set(pusher.push(pub).values()) == {"ok"}, "a replica did not take the files"
            stall = time.perf_counter() - t0
            seen = max(p.first_seen(version, t0) for p in probers)
            runs["files"].append(
                {"stall_s": stall, "visible_s": seen - t0, "pause_s": max(p.pause(t0, seen) for p in probers)}
            )
        for p in probers:
            p.stop()
        broadcaster.close()
        http.close()
        row["bytes"] = sum(t.numel() * t.element_size() for t in snapshot.values())
        row["dtype"] = str(broadcaster.dtype).removeprefix("torch.")
        row["floor_s"] = min(floors)
        row["each_repeat"] = {"floor_s": floors, **runs}  # the first version of a group sets its segment up
        for path, results in runs.items():
            for key in results[0]:
                row[f"{path}_{key}"] = min(r[key] for r in results)
    shutil.rmtree(work / "weights", ignore_errors=True)
    return row
