"""One update of member ``a`` on a saved graded batch, on CUDA: as one process, or as one rank of a
trainer group over NCCL (run by ``torchrun``, one GPU per rank); rank 0 writes the loss, the grad norm
and the backend the group used, for ``test_nccl_trainer_group``. Not a test module itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from corl.config import load_config
from corl.proto import GradedBatch
from corl.trainer.policy import PolicyTrainer
from corl.trainer.sharding import Sharding, launched_world_size


def main(config: Path, batch_file: Path, out: Path) -> None:
    cfg = load_config(config)
    batch = GradedBatch.model_validate_json(batch_file.read_text())
    sharding = Sharding(cfg.training.distributed) if launched_world_size() > 1 else None
    device = sharding.device("auto") if sharding else torch.device("cuda", 0)
    if sharding:
        sharding.init(device)
    policy = PolicyTrainer(cfg, "a", device, sharding=sharding)
    stats = policy.step(batch)
    backend = dist.get_backend() if dist.is_initialized() else "none"
    if sharding is None or sharding.leader:
        out.mkdir(parents=True, exist_ok=True)
        record = {"loss": stats.loss, "grad_norm": stats.grad_norm, "backend": backend, "device": str(device)}
        (out / "stats.json").write_text(json.dumps(record))
    policy.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
