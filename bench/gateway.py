"""Benchmark: what the harvesting gateway adds to an agent's call, against calling the member directly.

Three processes on loopback: a fake OpenAI-compatible member (``FakeUpstream`` under uvicorn: a reply
after ``--upstream-ms`` of "generation", a stream spreading it over 4 pieces), the gateway (``corl serve
gateway``, harvesting every request into a real Redis, redaction on) and this client. Latency: requests
one at a time, alternating direct and through the gateway (so both see the same machine load),
non-streamed and streamed (to the last byte); added = gateway percentile - direct percentile.
Throughput: ``--clients`` concurrent clients for ``--seconds``, direct and through the gateway; the
gateway is no bottleneck when its requests/s match the member's.

    python bench/gateway.py [--requests 400] [--clients 64] [--seconds 10] [--upstream-ms 20]

Also measured: the gateway process's own CPU time per request (harvesting included), which is what it
adds on an idle core whatever else the machine runs; and the load average (a busy machine's latencies
include waiting for a core at every hop). ``dropped`` leaves out duplicates (the streamed series asks
the same conversations again).

Last line: ``RESULT added_p50_ms=<x> added_p99_ms=<y> stream_added_p50_ms=... stream_added_p99_ms=...
gateway_cpu_ms=... member_cpu_ms=... stream_gateway_cpu_ms=... direct_rps=... gateway_rps=... throughput_ratio=...
gateway_busy=... client_busy=... load_avg=... harvested=... dropped=...`` (``*_busy``: the share of one
core the gateway and this client used during the gateway's throughput run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from corl.embedded.processes import die_with_parent
from corl.health import wait_healthy
from corl.redis_server import LocalRedis, free_port

TOKEN = "bench-cohort-token-0123456789"
UPSTREAM = """
import sys, uvicorn
from corl.services.gateway.testing import FakeUpstream
fake = FakeUpstream("m", delay_s=float(sys.argv[2]), record=False)
uvicorn.run(fake.asgi(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def body(i: int, stream: bool) -> bytes:
    messages = [
        {"role": "system", "content": "You are a support agent. Answer briefly."},
        {"role": "user", "content": f"Order {i}: my card 4111-1111-1111-1111 was charged twice, what now?"},
    ]
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 64, "stream": stream}).encode()


async def one(c: httpx.AsyncClient, url: str, content: bytes) -> float:
    t0 = time.perf_counter()
    async with c.stream("POST", url, content=content, headers={"content-type": "application/json"}) as r:
        async for _ in r.aiter_raw():
            pass
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
    return time.perf_counter() - t0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


async def latency(direct: str, gateway: str, n: int, stream: bool) -> tuple[list[float], list[float]]:
    d, g = [], []
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        for i in range(20):  # warm both paths' connections
            await one(c, direct, body(i, stream))
            await one(c, gateway, body(i, stream))
        for i in range(n):
            first, second = (direct, gateway) if i % 2 else (gateway, direct)  # alternate who goes first
            a = await one(c, first, body(i, stream))
            b = await one(c, second, body(i, stream))
            d.append(a if first == direct else b)
            g.append(b if first == direct else a)
    return d, g


async def throughput(url: str, clients: int, seconds: float) -> float:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    done = 0
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60, limits=limits) as c:
        end = time.perf_counter() + seconds

        async def client(k: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < end:
                await one(c, url, body(k * 100_000 + i, stream=False))
                done += 1
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - t0
    return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="Requests per latency series (each path).")
    ap.add_argument("--clients", type=int, default=64, help="Concurrent clients of the throughput runs.")
    ap.add_argument("--seconds", type=float, default=10.0, help="Length of each throughput run.")
    ap.add_argument("--upstream-ms", type=float, default=20.0, help="The fake member's generation time.")
    ap.add_argument("--no-harvest", action="store_true", help="Forward only (gateway.harvest.enabled: false).")
    ap.add_argument("--out", type=Path, default=None, help="Also write the figures as JSON here.")
    args = ap.parse_args()

    procs: list[subprocess.Popen[bytes]] = []
    with LocalRedis() as redis_server, tempfile.TemporaryDirectory() as tmp:
        try:
            up_port, gw_port = free_port(), free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", UPSTREAM, str(up_port), str(args.upstream_ms / 1000)],
                    preexec_fn=die_with_parent(),
                )
            )
            direct = f"http://127.0.0.1:{up_port}"
            cfg = {
                "run_id": "bench",
                "redis_url": redis_server.url,
                "members": [
                    {"name": "m", "model": "unused", "servers": [direct]},
                    {"name": "other", "model": "unused", "servers": ["http://127.0.0.1:1"]},
                ],
                "gateway": {
                    "harvest": {
                        "enabled": not args.no_harvest,
                        "redact": {"patterns": [r"\b(?:\d{4}-){3}\d{4}\b"]},
                        "max_prompts": 100_000,
                    }
                },
            }
            cfg_path = Path(tmp) / "cohort.yaml"
            cfg_path.write_text(yaml.safe_dump(cfg))
            env = {**os.environ, "CORL_COHORT_TOKEN": TOKEN, "CORL_LOG_LEVEL": "WARNING"}
            cmd = [sys.executable, "-m", "corl", "serve", "gateway", "--config", str(cfg_path), "--port", str(gw_port)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent()))
            gateway = f"http://127.0.0.1:{gw_port}"
            wait_healthy(f"{direct}/readyz", 60)
            wait_healthy(f"{gateway}/readyz", 60)

            figures: dict[str, float] = {}
            for stream in (False, True):
                cpu0, up0 = cpu_s(procs[1].pid), cpu_s(procs[0].pid)
                d, g = asyncio.run(
                    latency(f"{direct}/v1/chat/completions", f"{gateway}/v1/chat/completions", args.requests, stream)
                )
                # The gateway's own CPU per request (harvesting included): what it adds on an idle core,
                # whatever else the machine is doing.
                served = args.requests + 20  # per series and path
                figures[f"{'stream_' if stream else ''}gateway_cpu_ms"] = 1000 * (cpu_s(procs[1].pid) - cpu0) / served
                # The member's own CPU per request (it answers both paths): the same web stack, for scale.
                member_cpu = 1000 * (cpu_s(procs[0].pid) - up0) / (2 * served)
                figures[f"{'stream_' if stream else ''}member_cpu_ms"] = member_cpu
                key = "stream_" if stream else ""
                for q in (50, 99):
                    figures[f"{key}direct_p{q}_ms"] = 1000 * pct(d, q)
                    figures[f"{key}gateway_p{q}_ms"] = 1000 * pct(g, q)
                    figures[f"{key}added_p{q}_ms"] = 1000 * (pct(g, q) - pct(d, q))
                print(
                    f"{'streamed' if stream else 'whole'}: direct p50 {figures[f'{key}direct_p50_ms']:.2f} ms "
                    f"p99 {figures[f'{key}direct_p99_ms']:.2f} ms; through the gateway p50 "
                    f"{figures[f'{key}gateway_p50_ms']:.2f} ms p99 {figures[f'{key}gateway_p99_ms']:.2f} ms; "
                    f"gateway CPU {figures[f'{key}gateway_cpu_ms']:.2f} ms per request (the member's own "
                    f"{figures[f'{key}member_cpu_ms']:.2f} ms)",
                    flush=True,
                )
            figures["direct_rps"] = asyncio.run(throughput(f"{direct}/v1/chat/completions", args.clients, args.seconds))
            gw0, me0, t0 = cpu_s(procs[1].pid), time.process_time(), time.perf_counter()
            figures["gateway_rps"] = asyncio.run(
                throughput(f"{gateway}/v1/chat/completions", args.clients, args.seconds)
            )
            wall = time.perf_counter() - t0
            figures["throughput_ratio"] = figures["gateway_rps"] / figures["direct_rps"]
            # Share of one core each process used meanwhile: the bottleneck is the one near 1.0 (or none,
            # when every process waits for a core the rest of the machine holds).
            figures["gateway_busy"] = (cpu_s(procs[1].pid) - gw0) / wall
            figures["client_busy"] = (time.process_time() - me0) / wall
            print(
                f"{args.clients} clients: direct {figures['direct_rps']:.0f} req/s, "
                f"through the gateway {figures['gateway_rps']:.0f} req/s (the gateway busy "
                f"{figures['gateway_busy']:.0%} of a core, this client {figures['client_busy']:.0%})",
                flush=True,
            )
            time.sleep(1.0)  # the harvest queue drains
            stats = httpx.get(f"{gateway}/v1/harvest/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
            figures["harvested"] = stats["harvested"]
            figures["duplicates"] = stats["dropped"].get("duplicate", 0)  # the streamed series asks the same
            figures["dropped"] = sum(v for k, v in stats["dropped"].items() if k != "duplicate")
            figures["load_avg"] = os.getloadavg()[0]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    if args.out:
        args.out.write_text(json.dumps({**figures, **vars(args), "out": None}, indent=2) + "\n")
    keys = ["added_p50_ms", "added_p99_ms", "stream_added_p50_ms", "stream_added_p99_ms", "gateway_cpu_ms"]
    keys += ["member_cpu_ms", "stream_gateway_cpu_ms", "direct_rps", "gateway_rps", "throughput_ratio"]
    keys += ["gateway_busy", "client_busy", "load_avg"]
    line = " ".join(f"{k}={figures[k]:.2f}" for k in keys)
    print(f"RESULT {line} harvested={figures['harvested']:.0f} dropped={figures['dropped']:.0f}")


if __name__ == "__main__":
    main()
