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


def test_a_bfloat16_member_trains_its_float32_adapter_on_a_bfloat16_base(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str
) -> None:
    """The frozen base stays in the dtype it is stored in (half the memory for a bf16 member); the
    adapter, the only trained weights, is float32 and moves."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.trainer.policy import PolicyTrainer

    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(bf16)
    cfg = make_config(tmp_path, bf16, redis_url, "bf", lr=2e-2, lora={"r": 4, "alpha": 8})
    policy = PolicyTrainer(cfg, "a", torch.device("cpu"))
    frozen = {p.dtype for p in policy.model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}
    assert {p.dtype for p in policy.params} == {torch.float32}
    start = [p.detach().clone() for p in policy.params]
    policy.step(make_batches(bf16, "bf", 1)[0])
    assert any(not torch.equal(p, s) for p, s in zip(policy.params, start, strict=True))
