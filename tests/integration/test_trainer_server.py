"""Acceptance: a trainer fed from a real Redis publishes weights the member's real server hot-swaps:
the server reports the higher weight_version and its outputs change; a replica that was down when a
version was published is brought to the newest one once it answers again."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed
from test_trainer_helpers import make_batches, make_config, pending_count, xadd

from corl.embedded.processes import corl_command
from corl.redis_server import free_port
from corl.trainer.loop import Trainer
from corl.trainer.settings import TrainerSettings

torch.set_num_threads(1)
TOKEN = "test-admin-token"
PROMPTS = ["1+2=", "13+4=", "20+22="]


def _generate(url: str) -> tuple[int, list[float]]:
    resp = httpx.post(
        f"{url}/v1/generate", json={"prompts": PROMPTS, "n": 1, "max_tokens": 4, "temperature": 0.0}, timeout=60
    )
    resp.raise_for_status()
    body = resp.json()
    return body["weight_version"], [lp for r in body["results"] for s in r["samples"] for lp in s["logprobs"]]


def _info_version(url: str) -> int:
    return int(httpx.get(f"{url}/v1/info", timeout=10).json()["weight_version"])


@pytest.mark.slow
def test_published_weights_are_served(tmp_path: Path, tiny_model_dir: Path, redis_url: str) -> None:
    pytest.importorskip("corl.services.model.testing")
    from corl.services.model.settings import ServerSettings
    from corl.services.model.testing import running_server

    run_id = "s" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    down_port = free_port()
    settings = ServerSettings(model_dir=str(tiny_model_dir), name="a", admin_token=TOKEN, num_threads=1)
    with running_server(settings) as url:
        version0, logprobs0 = _generate(url)
        assert version0 == 0
        down_url = f"http://127.0.0.1:{down_port}"
        cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, servers=[url, down_url], lr=1e-2)
        for b in make_batches(tiny_model_dir, run_id, 3):
            xadd(client, b)
        trainer = Trainer(
            cfg,
            "a",
            TrainerSettings(
                consumer="c1",
                block_ms=50,
                admin_token=TOKEN,  # type: ignore[call-arg]
                sync_every_s=0.01,
                publish_attempts=2,
            ),
        )
        trainer.setup()
        state = trainer.run(max_steps=3)
        assert state.weight_version == 3
        assert pending_count(client, run_id) == 0

        version, logprobs = _generate(url)
        assert version == 3 == _info_version(url)
        assert logprobs != pytest.approx(logprobs0, abs=1e-4), "the server's outputs did not change"
        assert down_url in trainer.pusher.behind

        # The second replica comes up (a real `corl serve model` process) serving version 0 ...
        env = {**os.environ, "CORL_ADMIN_TOKEN": TOKEN, "CORL_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            corl_command("serve", "model", "--model", str(tiny_model_dir), "--name", "a", "--port", str(down_port)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for attempt in Retrying(
                stop=stop_after_delay(120),
                wait=wait_fixed(0.2),
                reraise=True,
                retry=retry_if_exception_type((httpx.TransportError, AssertionError)),
            ):
                with attempt:
                    assert httpx.get(f"{down_url}/readyz", timeout=5).status_code == 200
            assert _info_version(down_url) == 0
            # ... and the trainer's idle sync pushes it the newest version.
            trainer.run(idle_exit_s=0.3)
            assert _info_version(down_url) == 3
            assert down_url not in trainer.pusher.behind
            assert _generate(down_url)[1] == pytest.approx(logprobs, abs=1e-4)
        finally:
            proc.terminate()
            proc.wait(30)
            trainer.close()
