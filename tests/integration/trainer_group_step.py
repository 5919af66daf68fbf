"""One update of a member on a saved graded batch, as one process or as one rank of a trainer group
(run by ``torchrun``); rank 0 (or the one process) writes the loss, grad norm, gradients and new
weights, gathered whole, and publishes the weights (or adapter) to a weights store, for
``test_trainer_group`` to compare. Not a test module itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from corl.config import load_config
from corl.proto import GradedBatch
from corl.trainer.policy import PolicyTrainer
from corl.trainer.publish import WeightsStore
from corl.trainer.sharding import Sharding, launched_world_size


def _whole(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # FSDP2 shards are DTensors: gathering is a collective
    return (full() if full else t).detach().cpu().clone()


def main(config: Path, member: str, batch_file: Path, out: Path) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config)
    batch = GradedBatch.model_validate_json(batch_file.read_text())
    sharding = Sharding(cfg.training.distributed) if launched_world_size() > 1 else None
    device = torch.device("cpu")
    if sharding:
        sharding.init(device)
    policy = PolicyTrainer(cfg, member, device, sharding=sharding)
    stats = policy.step(batch)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    grads = {n: _whole(p.grad) for n, p in policy.model.named_parameters() if p.requires_grad}
    weights = {n: _whole(p) for n, p in policy.model.named_parameters() if p.requires_grad}
    # Published as the trainer publishes: gathered whole (or the adapter) and written by rank 0 alone.
    policy.save_weights(WeightsStore(out / "weights", member) if sharding is None or sharding.leader else None, 1)
    if sharding is None or sharding.leader:
        out.mkdir(parents=True, exist_ok=True)
        save_file({f"grad/{n}": g for n, g in grads.items()} | {f"weight/{n}": w for n, w in weights.items()},
                  out / "tensors.safetensors")  # fmt: skip
        (out / "stats.json").write_text(json.dumps({"loss": stats.loss, "grad_norm": stats.grad_norm, "names": names}))
    policy.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
