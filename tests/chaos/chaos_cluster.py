"""A whole run as real processes on loopback, for chaos tests: a private Redis (AOF, fsync always,
so a kill -9 of Redis loses nothing it acknowledged), one ``corl serve model`` per member (the tiny
random model), the aggregator's CLI and ``corl train`` for trained members. Every process can be
killed with SIGKILL and started again on the same port, data and consumer name."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis
import yaml

from corl import redis_keys as keys
from corl.embedded.processes import corl_command, terminate
from corl.proto import GradedBatch, RoundStats
from corl.redis_server import LocalRedis, free_port

TOKEN = "chaos-admin-token"
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "CORL_NUM_THREADS": "1",
    "CORL_LOG_LEVEL": "INFO",
    "CORL_ADMIN_TOKEN": TOKEN,
    "CORL_TRAINER_THREADS": "1",
    "CORL_TRAINER_BLOCK_MS": "200",
    "CORL_TRAINER_SYNC_EVERY_S": "1",
    "CORL_TRAINER_KEEP_ACKED": "1",  # the tests read every batch the aggregator wrote
    "CORL_AGGREGATOR_QUORUM_RETRY_S": "0.2",
    "CORL_AGGREGATOR_HTTP__ATTEMPTS": "1",
}
T = TypeVar("T")


@dataclass
class Proc:
    name: str
    args: list[str]
    log: Path
    url: str | None = None  # answers /readyz when ready
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, env={**ENV, **self.env}, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 20)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


def wait_for(what: str, cond: Callable[[], T], timeout_s: float, procs: list[Proc] = (), poll_s: float = 0.05) -> T:  # type: ignore[assignment]
    """Poll ``cond`` until it returns a truthy value; fail naming ``what`` (and a dead process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = cond()
        except (httpx.HTTPError, redis.RedisError, ValueError):
            value = None  # type: ignore[assignment]
        if value:
            return value
        for p in procs:
            assert p.proc is None or p.alive(), f"{p.name} died while waiting for {what}:\n{p.tail()}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(poll_s)


def start_servers(tmp: Path, model_dir: Path, names: list[str]) -> dict[str, Proc]:
    """One ``corl serve model`` process per name, ready; the caller stops them."""
    servers = {}
    for n in names:
        port = free_port()
        args = corl_command("serve", "model", "--model", str(model_dir), "--name", n, "--port", str(port))
        servers[n] = Proc(f"server-{n}", args, tmp / f"server-{n}.log", f"http://127.0.0.1:{port}").start()
    for p in servers.values():
        wait_ready(p)
    return servers


def wait_ready(p: Proc, timeout_s: float = 180) -> None:
    wait_for(f"{p.name} ready", lambda: httpx.get(f"{p.url}/readyz", timeout=5).status_code == 200, timeout_s, [p])


class Cluster:
    """A run over already started servers: its own Redis, config, aggregator and trainers."""

    def __init__(
        self,
        tmp: Path,
        model_dir: Path,
        servers: dict[str, Proc],
        roles: dict[str, str],
        training: dict[str, Any] | None = None,
        **rounds: Any,
    ):
        """``roles``: member name -> trained | frozen (each name one of ``servers``); ``training`` and
        ``rounds``: overrides of those config sections."""
        self.tmp, self.run = tmp, re.sub(r"[^a-z0-9-]", "-", tmp.name.lower())[-40:].strip("-")
        self.redis = LocalRedis(data_dir=tmp / "redis", appendfsync="always").start()
        self.client = redis.Redis.from_url(self.redis.url, socket_timeout=10)
        self.servers = {n: servers[n] for n in roles}
        self.config = tmp / "cohort.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "run_id": self.run,
                    "redis_url": self.redis.url,
                    "task": "addition",
                    "weights_dir": str(tmp / "weights"),
                    "checkpoints_dir": str(tmp / "checkpoints"),
                    "members": [
                        {"name": n, "model": str(model_dir), "servers": [self.servers[n].url], "role": role}
                        for n, role in roles.items()
                    ],
                    "rounds": {
                        "prompts_per_round": 2,
                        "samples_per_prompt": 4,
                        "max_tokens": 4,
                        "request_timeout_s": 30,
                        **rounds,
                    },
                    "reward": {"mode": "self_vote"},  # the random tiny model gets a signal from its own votes
                    "training": {"publish_every": 1, "checkpoint_every": 2, **(training or {})},
                }
            )
        )
        agg_port = free_port()
        self.aggregator = Proc(
            "aggregator",
            corl_command("serve", "aggregator", "--config", str(self.config), "--port", str(agg_port)),
            tmp / "aggregator.log",
            f"http://127.0.0.1:{agg_port}",
        )
        self.trainers = {
            n: Proc(
                f"trainer-{n}",
                corl_command("train", "--config", str(self.config), "--member", n),
                tmp / f"trainer-{n}.log",
                env={"CORL_TRAINER_CONSUMER": f"{n}-chaos"},
            )
            for n, role in roles.items()
            if role == "trained"
        }

    @property
    def procs(self) -> list[Proc]:
        return [*self.servers.values(), self.aggregator, *self.trainers.values()]

    def start(self, trainers: bool = True) -> None:
        self.aggregator.start()
        for t in self.trainers.values() if trainers else ():
            t.start()
        wait_ready(self.aggregator)

    def close(self) -> None:
        """Stop what this run started (the servers belong to the caller)."""
        for p in [self.aggregator, *self.trainers.values()]:
            p.stop()
        self.client.close()
        self.redis.close()

    # -- what Redis holds -------------------------------------------------------------------------

    def round_state(self) -> tuple[int, int]:
        raw: Any = self.client.hgetall(keys.round_state(self.run))
        return int(raw.get(b"next_round", 0)), int(raw.get(b"cursor", 0))

    def batches(self, member: str) -> list[GradedBatch]:
        entries: Any = self.client.xrange(keys.batches_stream(self.run, member))
        return [GradedBatch.model_validate_json(f[b"batch"]) for _, f in entries]

    def round_stats(self) -> list[RoundStats]:
        entries: Any = self.client.xrange(keys.round_stats(self.run))
        return [RoundStats.model_validate_json(f[b"stats"]) for _, f in entries]

    def applied(self, member: str) -> set[str]:
        return {b.decode() for b in self.client.smembers(keys.trainer_applied(self.run, member))}  # type: ignore[union-attr]

    def dropped(self, member: str) -> set[str]:
        return {b.decode() for b in self.client.smembers(keys.trainer_dropped(self.run, member))}  # type: ignore[union-attr]

    def published(self, member: str) -> int:
        v: Any = self.client.hget(keys.trainer_state(self.run, member), "published_version")
        return int(v) if v else 0

    def served_version(self, member: str) -> int:
        return int(httpx.get(f"{self.servers[member].url}/v1/info", timeout=5).json()["weight_version"])


def lost_and_duplicated(batches: list[GradedBatch], rounds: int) -> tuple[list[int], list[int]]:
    """Rounds in ``range(rounds)`` with no batch, and rounds with more than one."""
    seen = [b.round for b in batches]
    return [r for r in range(rounds) if r not in seen], sorted({r for r in seen if seen.count(r) > 1})
