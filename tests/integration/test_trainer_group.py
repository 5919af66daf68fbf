"""A member's trainer group (``torchrun --nproc-per-node 2``, gloo on CPU) takes the same update as one
process: the same loss, grad norm, gradients and new weights, under ``ddp`` and ``fsdp2``, with the
micro-batches split unevenly over the ranks (one rank runs a zero-weighted stand-in), for a loss
normalised per row (grpo, dr_grpo) and one normalised per micro-batch (bnpo). Wrong rows on a rank
or a wrong loss scale changes the gradients, which are compared element by element."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from trainer_group_step import main as one_process_step

from corl.models.sampling import sample
from corl.proto import SamplingSettings
from corl.trainer.testing import batch_from_samples

SCRIPT = Path(__file__).with_name("trainer_group_step.py")
LR = 1e-3
PROMPTS = ["12+7=", "3+30=", "45+5=", "8+61="]


def write_batch(model_dir: Path, out: Path, max_tokens: int = 6) -> Path:
    """16 sampled answers (4 prompts x 4), rewards varied within every group: 16 rows with signal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = sample(model, tok, PROMPTS, n=4, max_tokens=max_tokens, seed=0)
    sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=max_tokens, stop=[])
    batch = batch_from_samples(results, PROMPTS, sampling=sampling, rewards=lambda p, j: float((p + j) % 3 == 0))
    path = out / "batch.json"
    path.write_text(batch.model_dump_json())
    return path


def write_config(
    model_dir: Path, out: Path, strategy: str, loss_type: str, micro_batch: int, lora: bool = False, **distributed: Any
) -> Path:
    cfg: dict[str, Any] = {
        "run_id": "group-parity",
        "members": [
            {"name": "a", "model": str(model_dir), "servers": ["http://127.0.0.1:1"], "trainer_processes": 2},
            {"name": "b", "model": str(model_dir), "servers": ["http://127.0.0.1:2"], "role": "frozen"},
        ],
        "training": {
            "lr": LR,
            "loss_type": loss_type,
            "micro_batch_size": micro_batch,
            "grad_clip": 1e9,  # gradients compared as computed, not clipped
            "distributed": {"strategy": strategy, **distributed},
            "lora": {"r": 4, "alpha": 8} if lora else None,
        },
    }
    path = out / f"{strategy}-{loss_type}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def group_step(config: Path, batch: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [*cmd, str(SCRIPT), str(config), "a", str(batch), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]


def read(out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return json.loads((out / "stats.json").read_text()), load_file(out / "tensors.safetensors")


def assert_same_update(one: Path, group: Path, start: dict[str, torch.Tensor]) -> None:
    (s1, t1), (sg, tg) = read(one), read(group)
    assert s1["names"] == sg["names"] and s1["names"]
    assert sg["loss"] == pytest.approx(s1["loss"], rel=1e-4, abs=1e-5)  # on-policy: about 0
    assert sg["grad_norm"] == pytest.approx(s1["grad_norm"], rel=1e-4)
    assert s1["grad_norm"] > 0
    # Float sums in another order (30 layers deep for SmolLM2) differ by ~1e-5 of the gradient; a rank
    # with the wrong rows or a wrong scale is off by its whole share (tens of percent).
    diff = sum(float(((tg[f"grad/{n}"] - t1[f"grad/{n}"]) ** 2).sum()) for n in s1["names"]) ** 0.5
    assert diff < 1e-4 * s1["grad_norm"], f"gradients differ by {diff / s1['grad_norm']:.2e} of their norm"
    moved = False
    for name in s1["names"]:
        g1, gg = t1[f"grad/{name}"], tg[f"grad/{name}"]
        torch.testing.assert_close(gg, g1, rtol=1e-3, atol=2e-4 * float(g1.abs().max()) + 1e-12, msg=name)
        # Adam's first step moves each weight by about lr * sign(grad): the new weights agree except
        # where a gradient is within float noise of zero.
        before = start.get(name.replace("base_model.model.", "").replace(".base_layer", ""))
        if before is None:  # a LoRA adapter's weight: compared against its one-process twin alone
            before = t1[f"weight/{name}"] * 0
        d1, dg = t1[f"weight/{name}"] - before, tg[f"weight/{name}"] - before
        moved = moved or bool(d1.abs().max() > 0)
        off = ((d1 - dg).abs() > 0.1 * LR).float().mean()
        assert off < 1e-3, f"{name}: {float(off):.2%} of the weights moved differently"
    assert moved, "the update changed nothing"
    # Published the same: the group gathers its shards (or the adapter) and rank 0 writes them.
    [p1], [pg] = (list((d / "weights" / "a").glob("v*")) for d in (one, group))
    files = sorted(f.name for f in p1.glob("*.safetensors"))
    assert files and files == sorted(f.name for f in pg.glob("*.safetensors"))
    for f in files:
        w1, wg = load_file(p1 / f), load_file(pg / f)
        assert w1.keys() == wg.keys()
        for k in w1:
            off = ((w1[k] - wg[k]).abs() > 0.1 * LR).float().mean()
            assert off < 1e-3, f"published {k}: {float(off):.2%} differ"


def initial_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_parity(
    model_dir: Path, tmp_path: Path, strategy: str, loss_type: str, micro_batch: int, lora: bool = False
) -> None:
    batch = write_batch(model_dir, tmp_path)
    config = write_config(model_dir, tmp_path, strategy, loss_type, micro_batch, lora)
    one_process_step(config, "a", batch, tmp_path / "one")
    group_step(config, batch, tmp_path / "group")
    assert_same_update(tmp_path / "one", tmp_path / "group", initial_weights(model_dir))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
def test_a_two_rank_group_takes_the_single_process_update_tiny(
    tiny_model_dir: Path, tmp_path: Path, strategy: str, loss_type: str
) -> None:
    # 16 rows in micro-batches of 6: three micro-batches, two on rank 0 and one (+ a stand-in) on rank 1.
    check_parity(tiny_model_dir, tmp_path, strategy, loss_type, micro_batch=6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_two_rank_group_trains_and_publishes_a_lora_adapter_like_one_process(
    tiny_model_dir: Path, tmp_path: Path, strategy: str
) -> None:
    check_parity(tiny_model_dir, tmp_path, strategy, "dr_grpo", micro_batch=6, lora=True)


def test_fsdp2_in_bf16_mixed_precision_stays_near_the_fp32_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    batch = write_batch(tiny_model_dir, tmp_path)
    one_process_step(write_config(tiny_model_dir, tmp_path, "ddp", "grpo", 6), "a", batch, tmp_path / "one")
    group_step(
        write_config(tiny_model_dir, tmp_path, "fsdp2", "grpo", 6, mixed_precision="bf16"), batch, tmp_path / "bf16"
    )
    (s1, t1), (sb, tb) = read(tmp_path / "one"), read(tmp_path / "bf16")
    assert sb["grad_norm"] == pytest.approx(s1["grad_norm"], rel=2e-2)  # bf16 forward, fp32 reduction
    diff = sum(float(((tb[f"grad/{n}"] - t1[f"grad/{n}"]) ** 2).sum()) for n in s1["names"]) ** 0.5
    assert 0 < diff < 5e-2 * s1["grad_norm"]  # close, and not fp32 (the policy took effect)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_two_rank_group_takes_the_single_process_update_smol(
    smol_cohort: Path, tmp_path: Path, strategy: str
) -> None:
    check_parity(smol_cohort / "smollm2", tmp_path, strategy, "dr_grpo", micro_batch=4)
