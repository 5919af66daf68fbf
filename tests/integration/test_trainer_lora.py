"""LoRA mode: only the adapter is published (format 'lora'), the real server applies it, and a
restarted trainer resumes the adapter and its optimizer from the checkpoint."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch
from test_trainer_helpers import make_batches, make_config, xadd

from corl.trainer.loop import Trainer
from corl.trainer.settings import TrainerSettings

torch.set_num_threads(1)
TOKEN = "lora-token"


def _greedy(url: str) -> tuple[int, list[float]]:
    body = httpx.post(
        f"{url}/v1/generate", json={"prompts": ["1+2=", "20+22="], "max_tokens": 4, "temperature": 0.0}, timeout=60
    ).json()
    return body["weight_version"], [lp for r in body["results"] for s in r["samples"] for lp in s["logprobs"]]


def test_lora_adapter_is_published_served_and_resumed(tmp_path: Path, tiny_model_dir: Path, redis_url: str) -> None:
    pytest.importorskip("corl.services.model.testing")
    from corl.services.model.settings import ServerSettings
    from corl.services.model.testing import running_server

    run_id = "l" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    with running_server(
        ServerSettings(model_dir=str(tiny_model_dir), name="a", admin_token=TOKEN, num_threads=1)
    ) as url:
        _, before = _greedy(url)
        cfg = make_config(
            tmp_path, tiny_model_dir, redis_url, run_id, servers=[url], lr=2e-2, beta=0.05, lora={"r": 4, "alpha": 8}
        )
        batches = make_batches(tiny_model_dir, run_id, 3)
        for b in batches[:2]:
            xadd(client, b)
        settings = TrainerSettings(consumer="c1", block_ms=50, admin_token=TOKEN)  # type: ignore[call-arg]
        trainer = Trainer(cfg, "a", settings)
        trainer.setup()
        assert trainer.run(max_steps=2).weight_version == 2
        trainer.close()
        published = tmp_path / "weights" / "a" / "v000002"
        names = {p.name for p in published.iterdir()}
        assert {"SHA256", "adapter_config.json", "adapter_model.safetensors"} <= names
        assert [n for n in names if n.endswith(".safetensors")] == ["adapter_model.safetensors"]
        version, after = _greedy(url)
        assert version == 2
        assert after != pytest.approx(before, abs=1e-4), "the served outputs did not change"

        xadd(client, batches[2])
        resumed = Trainer(cfg, "a", settings)
        resumed.setup()
        assert resumed.state.step == 2
        assert resumed.run(max_steps=3).weight_version == 3
        resumed.close()
        assert _greedy(url)[0] == 3
