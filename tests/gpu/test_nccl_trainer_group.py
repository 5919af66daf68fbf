"""A member's trainer group on GPUs (marker ``gpu``; ``bench/gpu_check.sh`` runs it where there are 2):
two ranks under ``torchrun``, one GPU each, joined over NCCL, take the same update as one process on one
GPU (loss and grad norm), for DDP and FSDP2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("nccl_group_step.py")
PROMPTS = ["12+7=", "3+30=", "45+5=", "8+61="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    from transformers import AutoModelForCausalLM

    from corl.cohort.presets import get_preset
    from corl.models.tokenizer import build_char_tokenizer

    out = tmp_path_factory.mktemp("llama")
    (spec,) = [m for m in get_preset("tiny").members if m.family == "llama"]
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(spec.build_config(tok)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _batch(model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.models.sampling import sample
    from corl.proto import SamplingSettings
    from corl.trainer.testing import batch_from_samples

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = sample(model, tok, PROMPTS, n=4, max_tokens=6, seed=0)
    sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=6, stop=[])
    batch = batch_from_samples(results, PROMPTS, sampling=sampling, rewards=lambda p, j: float((p + j) % 3 == 0))
    path = out / "batch.json"
    path.write_text(batch.model_dump_json())
    return path


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_over_nccl_take_the_one_gpu_update(model_dir: Path, tmp_path: Path, strategy: str) -> None:
    config = tmp_path / "cohort.yaml"
    # trainer.gpus: 2 makes the member's trainer a group of 2 ranks (trainer_processes follows).
    member = {"name": "a", "model": str(model_dir), "servers": ["http://127.0.0.1:1"], "trainer": {"gpus": 2}}
    config.write_text(
        yaml.safe_dump(
            {
                "members": [member, {"name": "b", "model": str(model_dir), "servers": ["http://127.0.0.1:2"]}],
                "training": {"lr": 1e-3, "grad_clip": 1e9, "distributed": {"strategy": strategy, "backend": "nccl"}},
            }
        )
    )
    batch = _batch(model_dir, tmp_path)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [sys.executable, str(SCRIPT), str(config), str(batch), str(tmp_path / "one")],
        capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": "0"}, timeout=600,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-5000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    group = subprocess.run(
        [*cmd, str(SCRIPT), str(config), str(batch), str(tmp_path / "group")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert group.returncode == 0, group.stdout[-3000:] + group.stderr[-5000:]
    s1 = json.loads((tmp_path / "one" / "stats.json").read_text())
    sg = json.loads((tmp_path / "group" / "stats.json").read_text())
    assert sg["backend"] == "nccl" and sg["device"] == "cuda:0"
    assert s1["grad_norm"] > 0
    assert sg["grad_norm"] == pytest.approx(s1["grad_norm"], rel=1e-3)
    assert sg["loss"] == pytest.approx(s1["loss"], rel=1e-3, abs=1e-4)
    print(f"RESULT nccl_group_{strategy} grad_norm_one={s1['grad_norm']:.6f} grad_norm_group={sg['grad_norm']:.6f}")
