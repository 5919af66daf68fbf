"""A trainer trains only on batches it can trust: finite rewards and log-probs, token ids it has
embeddings for. Anything else fails validation (or the vocabulary check) and is dropped, never stepped on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from corl.proto import GradedBatch

pytestmark = pytest.mark.security


def batch(**sample: object) -> dict:
    s = {"sample_id": "s", "response": "r", "response_token_ids": [1], "logprobs": [-0.5], "finish_reason": "stop",
         "weight_version": 0, "reward": 1.0, **sample}  # fmt: skip
    return {
        "batch_id": "b", "run_id": "r", "round": 0, "member": "m", "reward_mode": "peer_pool", "created_at": 0.0,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4, "stop": []},
        "groups": [{"group_id": "g", "prompt": "p", "prompt_token_ids": [1], "samples": [s]}],
        "diagnostics": {"mean_reward": 0, "label_rate": 0, "distinct_answers": 0, "answer_entropy": 0,
                        "mean_response_tokens": 0},
    }  # fmt: skip


def test_a_well_formed_batch_validates() -> None:
    assert GradedBatch.model_validate_json(json.dumps(batch())).groups[0].samples[0].reward == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        {"reward": float("nan")},
        {"reward": float("inf")},
        {"logprobs": [float("nan")]},
        {"logprobs": [float("-inf")]},
        {"logprobs": [1000.0]},
        {"response_token_ids": [-1]},
    ],
    ids=["nan-reward", "inf-reward", "nan-logprob", "inf-logprob", "positive-logprob", "negative-token"],
)
def test_non_finite_or_impossible_values_are_refused(bad: dict) -> None:
    raw = json.dumps(batch(**bad))  # Python's encoder writes NaN and Infinity; the trainer must not take them
    with pytest.raises(ValidationError):
        GradedBatch.model_validate_json(raw)


def test_token_ids_outside_the_vocabulary_are_named() -> None:
    from corl.trainer.policy import PolicyTrainer as Policy

    model = SimpleNamespace(get_input_embeddings=lambda: torch.nn.Embedding(50, 4))
    policy = SimpleNamespace(model=model)
    ok = GradedBatch.model_validate_json(json.dumps(batch(response_token_ids=[49])))
    assert Policy.tokens_outside_vocab(policy, ok) is None  # type: ignore[arg-type]
    bad = GradedBatch.model_validate_json(json.dumps(batch(response_token_ids=[50])))
    assert "50 outside the vocabulary (50)" in str(Policy.tokens_outside_vocab(policy, bad))  # type: ignore[arg-type]


def test_an_adapters_checksum_covers_its_config(tmp_path) -> None:
    """A LoRA adapter's scale lives in adapter_config.json: a rewritten config is refused like a rewritten tensor."""
    import json as _json

    from safetensors.torch import save_file

    from corl.services.model.backends import weights
    from corl.services.model.backends.base import WeightLoadError
    from corl.weights_store import digest

    save_file({"a.lora_A.weight": torch.zeros(2, 4)}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "adapter_config.json").write_text(_json.dumps({"r": 2, "lora_alpha": 4}))
    sha = digest(tmp_path)
    weights.verify_adapter(str(tmp_path), sha)
    (tmp_path / "adapter_config.json").write_text(_json.dumps({"r": 2, "lora_alpha": 4000}))
    with pytest.raises(WeightLoadError, match="sha256"):
        weights.verify_adapter(str(tmp_path), sha)


def test_a_lora_version_recorded_before_the_config_was_hashed_still_resumes(tmp_path) -> None:
    """A run published before the checksum covered adapter_config.json resumes: its intact record is
    upgraded; a record that matches neither definition is announced as it is (and refused)."""
    import json as _json

    from safetensors.torch import save_file

    from corl.weights_store import digest, digest_files, recorded_digest, safetensors_files

    save_file({"a.lora_A.weight": torch.zeros(2, 4)}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "adapter_config.json").write_text(_json.dumps({"r": 2, "lora_alpha": 4}))
    old = digest_files(safetensors_files(tmp_path))
    assert recorded_digest(tmp_path, old) == digest(tmp_path) != old
    assert recorded_digest(tmp_path, digest(tmp_path)) == digest(tmp_path)
    assert recorded_digest(tmp_path, "0" * 64) == "0" * 64
