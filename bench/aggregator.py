"""Benchmark: graded samples per second through the aggregator's round logic.

Instant fake model servers (``httpx.MockTransport`` returning a pre-built response per member) and
a real Redis; N = 2, 4, 8, 16 members, G = 8, B = 16 prompts per round, ``peer_label`` rewards.
Measures samples/s end to end per round (back-pressure check, generation fan-out and parsing,
answer extraction, rewards, diagnostics, batch building, the atomic commit) and Redis round trips
per round (counted at the connection) plus commands per round (``INFO commandstats`` delta).

    python bench/aggregator.py [--rounds 40]

``samples/s`` is wall-clock; ``samples/cpu-s`` divides by this process's CPU time (the one-core
figure when the machine is shared; Redis runs in its own process). Last line:
``RESULT samples_per_s_n4=... scaling_n16_over_n2=...`` (scaling: wall-clock per-sample throughput
at N=16 over N=2; about 1.0 or more means cost linear in N*G).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

import httpx
import redis
import redis.asyncio as aioredis

from corl.config import parse_config
from corl.proto import GenerateRequest
from corl.redis_server import LocalRedis
from corl.services.aggregator.members import MemberClient
from corl.services.aggregator.metrics import AggregatorMetrics
from corl.services.aggregator.prompts import build_prompt_source
from corl.services.aggregator.rounds import RoundDriver
from corl.services.aggregator.settings import AggregatorSettings
from corl.services.aggregator.state import LearntState
from corl.services.aggregator.store import RoundStore
from corl.services.aggregator.testing import FakeCohort

G, B = 8, 16


class CountingConnection(aioredis.Connection):
    """Counts round trips: one per packed send (a pipeline or a script call is one)."""

    sends = 0

    async def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        CountingConnection.sends += 1
        return await super().send_packed_command(command, check_health)


def _commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for k, v in r.info("commandstats").items() if k != "cmdstat_info")


async def bench_n(url: str, n: int, rounds: int) -> tuple[float, float, float, float]:
    names = [f"m{i}" for i in range(n)]
    cfg = parse_config(
        {
            "run_id": f"bench-n{n}",
            "members": [{"name": m, "model": "unused", "servers": [FakeCohort.url(m)]} for m in names],
            "rounds": {"prompts_per_round": B, "samples_per_prompt": G, "max_pending_batches": 1_000_000},
            "reward": {"mode": "peer_label"},
        }
    )
    settings = AggregatorSettings(config=Path("unused"), stream_maxlen=1000)
    cohort = FakeCohort.of(*names, accuracy=0.6)
    # Instant servers: each member's response is built once and replayed.
    source = build_prompt_source(cfg, None)  # type: ignore[arg-type]
    prompts = [e.prompt for e in await source.take(0, B)]
    canned = {m: cohort.generate(cohort.members[m], GenerateRequest(prompts=prompts, n=G, seed=1)) for m in names}
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=canned[req.url.host[:-5]]))
    pool = aioredis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    r = aioredis.Redis(connection_pool=pool)
    sync = redis.Redis.from_url(url)
    async with httpx.AsyncClient(transport=transport) as http:
        store = RoundStore(r, cfg.run_id, stream_maxlen=1000, stats_maxlen=1000, marker_ttl_s=3600)
        client, state = MemberClient(http, settings.http, 10), LearntState(cfg.reward, names)
        driver = RoundDriver(cfg, settings, store, client, source, AggregatorMetrics(), state)
        await driver.start()
        for _ in range(3):  # warm-up
            await driver.run_round()
        sends0, cmds0 = CountingConnection.sends, _commands(sync)
        t0, c0 = time.perf_counter(), time.process_time()
        total = 0
        for _ in range(rounds):
            res = await driver.run_round()
            assert res.status == "ok", res
            total += res.samples
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        trips = (CountingConnection.sends - sends0) / rounds
        cmds = (_commands(sync) - cmds0) / rounds
    await r.aclose()
    sync.close()
    return total / elapsed, total / cpu, trips, cmds


async def main(rounds: int) -> None:
    results = {}
    with LocalRedis(appendonly=False) as server:
        print(
            f"{'N':>3} {'G':>2} {'B':>3} {'samples/round':>13} {'samples/s':>10} {'samples/cpu-s':>13} "
            f"{'rounds/s':>8} {'redis trips/round':>17} {'redis cmds/round':>16}"
        )
        for n in (2, 4, 8, 16):
            sps, cpu_sps, trips, cmds = await bench_n(server.url, n, rounds)
            results[n] = sps
            per_round = n * B * G
            print(
                f"{n:>3} {G:>2} {B:>3} {per_round:>13} {sps:>10.0f} {cpu_sps:>13.0f} {sps / per_round:>8.1f} "
                f"{trips:>17.1f} {cmds:>16.1f}"
            )
    print(f"RESULT samples_per_s_n4={results[4]:.0f} scaling_n16_over_n2={results[16] / results[2]:.2f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    asyncio.run(main(p.parse_args().rounds))
