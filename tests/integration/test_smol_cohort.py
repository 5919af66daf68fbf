"""The real two-family cohort end to end on CPU: each member is served by the transformers backend
with its own rendering (SmolLM2's ChatML template, Gemma's BOS + plain template), answers a GSM8K-style
question, takes one trainer step on its own served samples (SmolLM2 fully, Gemma with LoRA, both
micro-batched with gradient checkpointing), and the server hot-swaps to the published weights."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from corl.models.sampling import Completion, PromptCompletions
from corl.proto import PromptFormat, SamplingSettings

pytestmark = pytest.mark.slow

TOKEN = "smol-admin-token"
QUESTION = "Natalia has 3 apples and buys 5 more. How many apples does she have now?"
# What a math task sends: the chat template where a member has one, else the plain template.
FORMAT = PromptFormat(
    chat=True,
    system="Solve the problem. End with: The answer is <number>.",
    template="{system}\n\nQuestion: {prompt}\nAnswer:",
)


def _generate(url: str, **body: Any) -> dict[str, Any]:
    request = {"prompts": [QUESTION], "format": FORMAT.model_dump(), **body}
    r = httpx.post(f"{url}/v1/generate", json=request, timeout=900)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("member", ["smollm2", "gemma3"])
def test_smol_member_serves_trains_and_hot_swaps(member: str, smol_cohort: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from corl.config import parse_config
    from corl.services.model.settings import ServerSettings
    from corl.services.model.testing import running_server
    from corl.trainer.policy import PolicyTrainer
    from corl.trainer.publish import WeightsStore
    from corl.trainer.testing import batch_from_samples

    torch.set_num_threads(2)
    model_dir = smol_cohort / member
    tok = AutoTokenizer.from_pretrained(model_dir)
    settings = ServerSettings(
        _env_file=None,  # type: ignore[call-arg]
        model_dir=str(model_dir),
        name=member,
        admin_token=TOKEN,
        num_threads=2,
        max_tokens=64,
        request_timeout_s=900.0,  # generous: a shared 2-core CI machine can be many times slower than idle
    )
    t0 = time.perf_counter()
    with running_server(settings, ready_timeout_s=600) as url:
        load_s = time.perf_counter() - t0
        greedy = _generate(url, max_tokens=40, temperature=0.0)
        result = greedy["results"][0]
        prompt_text = str(tok.decode(result["prompt_token_ids"]))
        answer = result["samples"][0]["text"]
        if member == "smollm2":  # ChatML, with the task's instruction as the system message
            assert prompt_text.startswith("<|im_start|>system\nSolve the problem.")
            assert prompt_text.endswith("<|im_start|>assistant\n")
            assert "8" in answer, answer
        else:  # a base model: BOS once, then the plain template
            assert result["prompt_token_ids"][0] == tok.bos_token_id
            assert result["prompt_token_ids"][1] != tok.bos_token_id
            assert prompt_text.endswith("Question: " + QUESTION + "\nAnswer:")
            assert answer.strip(), "empty completion"

        t1 = time.perf_counter()
        sampled = _generate(url, n=4, max_tokens=12, temperature=1.0, seed=0)
        sample_s = time.perf_counter() - t1
        samples = sampled["results"][0]["samples"]
        assert len(samples) == 4 and all(len(s["token_ids"]) == len(s["logprobs"]) > 0 for s in samples)

        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=12, stop=[])
        completions = [Completion(s["text"], s["token_ids"], s["logprobs"], s["finish_reason"]) for s in samples]
        batch = batch_from_samples(
            [PromptCompletions(sampled["results"][0]["prompt_token_ids"], completions)],
            [QUESTION],
            sampling=sampling,
            member=member,
        )
        lora = {"r": 8, "alpha": 16} if member == "gemma3" else None
        cfg = parse_config(
            {
                "run_id": "smol-test",
                "members": [
                    {"name": member, "model": str(model_dir), "servers": [url]},
                    {"name": "peer", "model": str(model_dir), "servers": [url]},
                ],
                "training": {"lr": 1e-5, "micro_batch_size": 2, "gradient_checkpointing": True, "lora": lora},
            }
        )
        t2 = time.perf_counter()
        trainer = PolicyTrainer(cfg, member, torch.device("cpu"))
        assert trainer.model.config.use_cache is False  # set with gradient checkpointing
        stats = trainer.step(batch)
        step_s = time.perf_counter() - t2
        assert stats.sequences == 4 and math.isfinite(stats.loss) and stats.grad_norm > 0

        pub = WeightsStore(tmp_path / "weights", member).save(trainer.model, trainer.tokenizer, 1, trainer.format)
        del trainer
        r = httpx.post(
            f"{url}/v1/weights",
            json=pub.request().model_dump(mode="json"),
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=600,
        )
        assert r.status_code == 200, r.text
        assert _generate(url, max_tokens=4, temperature=0.0)["weight_version"] == 1
    print(
        f"\n{member}: server ready {load_s:.1f}s, sampling 4x12 tokens {sample_s:.1f}s, "
        f"trainer load + step {step_s:.1f}s ({pub.format}), greedy: {answer!r}"
    )
