"""Real processes on loopback: a Redis, two `corl serve model` members of the tiny cohort, and the
aggregator's own CLI; three rounds must leave well-formed graded batches in each member's stream."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from corl import redis_keys as keys
from corl.embedded.processes import corl_command, terminate
from corl.health import running, wait_healthy
from corl.proto import DashboardView, GradedBatch, OpenRLHFRewardResponse, RunStats
from corl.redis_server import free_port

pytestmark = pytest.mark.slow
ENV = {
    **os.environ,
    "CORL_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "CORL_LOG_LEVEL": "WARNING",
    "CORL_AGGREGATOR_REWARD_SERVER__ENABLED": "true",  # it serves an outside trainer's rewards too
}


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    wait_healthy(f"{url}/readyz", timeout_s, alive=running(proc), interval_s=0.2)


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=ENV, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture
def members(tiny_model_dir: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    urls, procs = {}, []
    try:
        for name in ("alpha", "beta"):
            port = free_port()
            serve = corl_command("serve", "model", "--model", str(tiny_model_dir), "--name", name, "--port", str(port))
            procs.append(start(serve, tmp_path / f"{name}.log"))
            urls[name] = f"http://127.0.0.1:{port}"
        for proc, url in zip(procs, urls.values(), strict=True):
            wait_ready(url, proc)
        yield urls
    finally:
        for proc in procs:
            terminate(proc, 30)


def test_three_rounds_with_real_model_servers(
    members: dict[str, str], redis_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    run = "integ-cohort"
    config = tmp_path / "cohort.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": run,
                "redis_url": redis_url,
                "members": [{"name": n, "model": str(tiny_model_dir), "servers": [u]} for n, u in members.items()],
                "rounds": {
                    "prompts_per_round": 2,
                    "samples_per_prompt": 4,
                    "max_tokens": 4,
                    "max_rounds": 3,
                    "max_pending_batches": 10,
                    "request_timeout_s": 60,
                },
                "reward": {"mode": "peer_label"},
            }
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = "import typer; from corl.cli.serve_aggregator import aggregator; typer.run(aggregator)"
    proc = start([sys.executable, "-c", cli, "--config", str(config), "--port", str(port)], tmp_path / "agg.log")
    try:
        wait_ready(url, proc, 60)
        for attempt in Retrying(
            stop=stop_after_delay(240),
            wait=wait_fixed(0.5),
            reraise=True,
            retry=retry_if_exception_type(AssertionError),
        ):
            with attempt:
                assert proc.poll() is None, (tmp_path / "agg.log").read_text()
                stats = RunStats.model_validate_json(httpx.get(f"{url}/v1/runs/{run}/stats", timeout=10).content)
                assert stats.next_round == 3
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        # The same process serves outside trainers and the live dashboard, from the real members.
        body = {"query": ["12+34=46", "12+34=9"], "prompts": ["12+34="] * 2, "labels": ["46", "46"]}
        reward = OpenRLHFRewardResponse.model_validate_json(
            httpx.post(f"{url}/get_reward", json=body, timeout=60).raise_for_status().content
        )
        view = DashboardView.model_validate_json(httpx.get(f"{url}/v1/runs/{run}/dashboard", timeout=10).content)
        page = httpx.get(f"{url}/dashboard", timeout=10)
    finally:
        terminate(proc, 30)
    assert len(reward.rewards) == 2 and reward.weight_versions == dict.fromkeys(members, 0)
    assert [m.weight_version for m in view.members] == [0] * len(members) and len(view.rounds) == 3
    assert page.status_code == 200 and "dashboard/assets/uPlot.iife.min.js" in page.text
    assert [r.round for r in stats.rounds] == [0, 1, 2] and all(r.missing == [] for r in stats.rounds)
    assert 'corl_aggregator_batches_total{member="alpha"} 3.0' in metrics
    r: Any = redis.Redis.from_url(redis_url)
    for name in members:
        entries = r.xrange(keys.batches_stream(run, name))
        batches = [GradedBatch.model_validate_json(fields[b"batch"]) for _, fields in entries]
        assert [b.round for b in batches] == [0, 1, 2] and {b.member for b in batches} == {name}
        for b in batches:
            assert len(b.samples()) == 2 * 4 and b.batch_id == f"{run}-r{b.round:07d}-{name}"
            for g, s in b.samples():
                assert s.weight_version == 0 and 1 <= len(s.response_token_ids) <= 4
                assert len(s.logprobs) == len(s.response_token_ids) and all(lp <= 0 for lp in s.logprobs)
                assert g.prompt_token_ids and 0.0 <= s.reward <= 1.0
        groups = r.xinfo_groups(keys.batches_stream(run, name))
        assert [g["name"] for g in groups] == [keys.TRAINER_GROUP.encode()]
