"""One rank of a member's trainer group on torch.distributed (``torchrun --nproc-per-node N``).

Every rank holds the whole graded batch and cuts it into the same micro-batches a single process
would; rank r takes micro-batches r, r+N, ... . Each micro-batch's loss keeps its single-process
scale (its share of the whole batch, the whole batch's token count), so the gradients summed over
the ranks are the single-process gradient: DDP and FSDP2 average over the ranks, so each rank's loss
is multiplied by N first. Ranks short of a micro-batch run a zero-weighted one, because every
forward and backward of a sharded model is a collective that all ranks must join (for the same
reason each micro-batch makes the same forward passes, ``response_logps(same_passes=True)``).

``ddp``: ``DistributedDataParallel``, gradients all-reduced on the last backward of the step.
``fsdp2``: ``fully_shard`` on each decoder layer and on the root (parameters, gradients and optimizer
state sharded), with its mixed-precision and CPU-offload policies.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from corl.config import DistributedConfig

log = logging.getLogger(__name__)

Chunk = tuple[slice, int]  # rows of the packed batch, response positions to compute


@dataclass(frozen=True)
class LocalChunk:
    rows: slice
    length: int
    weight: float  # 1.0: this rank's share of the batch; 0.0: a stand-in that keeps the collectives in step


def launched_world_size() -> int:
    """Processes in this trainer's group as torchrun set it up (1: a plain single process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def split_chunks(chunks: list[Chunk], rank: int, world: int) -> list[LocalChunk]:
    """Rank ``rank``'s micro-batches: every ``world``-th one from ``rank``, padded with zero-weight
    stand-ins so that every rank runs the same number (``ceil(len(chunks) / world)``, at least 1)."""
    mine = [LocalChunk(sl, length, 1.0) for sl, length in chunks[rank::world]]
    rounds = max(1, -(-len(chunks) // world))
    stand_in = LocalChunk(slice(0, 1), 1, 0.0)
    return mine + [stand_in] * (rounds - len(mine))


def default_micro_batch(rows: int, world: int) -> int:
    """With ``micro_batch_size`` unset a single process takes the batch at once; a group of ``world``
    takes one micro-batch per rank."""
    return max(1, -(-rows // world))


class Sharding:
    """This process's place in its trainer group, and the torch.distributed calls the update needs."""

    def __init__(self, cfg: DistributedConfig, timeout_s: float = 1800.0):
        self.cfg = cfg
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.timeout = timedelta(seconds=timeout_s)

    @property
    def leader(self) -> bool:
        """Rank 0: the one rank that talks to Redis, the servers and the weights store."""
        return self.rank == 0

    def device(self, requested: str) -> torch.device:
        """cuda:LOCAL_RANK on GPUs (one device per rank), else the CPU."""
        if requested in ("auto", "cuda") and torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu" if requested == "auto" else requested)

    def init(self, device: torch.device) -> None:
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=self.timeout)
        log.info("rank %d of %d joined the %s group (%s)", self.rank, self.world, self.cfg.strategy, backend)

    def close(self) -> None:
        """Leave the group once every rank is done with it (a rank's last collective may still run)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    # -- the model ---------------------------------------------------------------------------------

    def wrap(self, model: Any, device: torch.device) -> Any:
        """The module the forward passes go through: a DDP wrapper, or ``model`` itself sharded in place."""
        if self.cfg.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            # Buffers are the same on every rank (loaded from one directory): no broadcast per forward.
            return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.cfg.mixed_precision]
        kw: dict[str, Any] = {"mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)}
        if self.cfg.cpu_offload:
            if device.type != "cuda":
                raise ValueError("training.distributed.cpu_offload keeps a GPU group's shards in CPU memory: "
                                 "this group computes on the CPU already")  # fmt: skip
            kw["offload_policy"] = CPUOffloadPolicy()
        for layer in decoder_layers(model):
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model

    def shard_frozen(self, model: Any) -> Any:
        """A reference model (forward only): sharded like the policy under fsdp2, whole under ddp."""
        if self.cfg.strategy != "fsdp2":
            return model
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model

    @contextlib.contextmanager
    def gradient_sync(self, forward_model: Any, sync: bool) -> Iterator[None]:
        """Reduce gradients over the ranks on this backward (the step's last) or only accumulate them."""
        if self.cfg.strategy == "ddp":
            with contextlib.nullcontext() if sync else forward_model.no_sync():
                yield
        else:
            forward_model.set_requires_gradient_sync(sync)
            yield

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor
        return float(full() if full else norm)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Each figure summed over the ranks (each rank's share is already scaled to the whole batch)."""
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return dict(zip(keys, t.tolist(), strict=True))

    def full_state_dict(self, model: Any) -> dict[str, Any] | None:
        """The whole model's (or adapter-wrapped model's) state dict on the leader, in CPU memory; a
        collective under fsdp2 (every rank calls it), local under ddp (every rank holds it all)."""
        if self.cfg.strategy == "ddp":
            return None if not self.leader else {k: v.detach().cpu() for k, v in model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.leader:
            return None
        # A tied weight (GPT-2's lm_head is its embedding) comes back as a second, separate tensor;
        # save_pretrained writes it once, as it does for an unsharded model.
        own = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        return {k: v for k, v in sd.items() if k in own}

    # -- the command channel -----------------------------------------------------------------------

    def broadcast(self, obj: Any = None) -> Any:
        """The leader's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks (transformers names their classes in ``_no_split_modules``), the
    units FSDP2 gathers one at a time."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]
