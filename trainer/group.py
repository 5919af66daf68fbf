"""A member's trainer group: rank 0 runs the trainer loop (Redis, servers, weights store); the other
ranks follow it. Every call that touches the model is broadcast to the followers before the leader
makes it, and every rank then makes the same call (a step, a publish, a checkpoint: collectives).

A rank that dies takes the group down with it: torchrun stops the other ranks and exits non-zero,
and the restart policy (``corl run --restart``, compose, Helm) starts the group again from its
newest checkpoint. Nothing is acknowledged before a checkpoint holds it, so no batch is lost or
applied twice (the single-process guarantee, for the group).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from corl.config import CohortConfig
from corl.proto import GradedBatch
from corl.transfer import dtype_name, dtype_of

from .checkpoint import Checkpointer, TrainerState
from .policy import PolicyTrainer, StepStats, resolve_device
from .publish import Published, WeightsStore
from .settings import TrainerSettings
from .sharding import Sharding

log = logging.getLogger(__name__)

KEEPALIVE_S = 60.0  # an idle leader tells its followers it is there, well inside the group's timeout


def check_group_size(cfg: CohortConfig, member: str, world: int) -> None:
    """The group torchrun started must be the one the config asks for (checkpoints are per size)."""
    want = cfg.member(member).trainer_processes
    if world != want:
        raise ValueError(
            f"member {member!r} has trainer_processes: {want}, but this trainer group has {world} processes "
            f"(torchrun --nproc-per-node {want})"
        )


class GroupLeader:
    """Rank 0's policy: each call goes to the followers first, then is made here."""

    def __init__(self, policy: PolicyTrainer, sharding: Sharding):
        self.policy, self.sharding = policy, sharding
        self.format = policy.format
        self._sent = time.monotonic()

    def _send(self, command: str, arg: Any = None) -> None:
        self.sharding.broadcast((command, arg))
        self._sent = time.monotonic()

    def tokens_outside_vocab(self, batch: GradedBatch) -> str | None:
        return self.policy.tokens_outside_vocab(batch)  # every rank holds the same vocabulary

    def step(self, batch: GradedBatch) -> StepStats:
        self._send("step", batch.model_dump_json())
        return self.policy.step(batch)

    def save_weights(self, store: WeightsStore, version: int) -> Published:
        self._send("weights", version)
        pub = self.policy.save_weights(store, version)
        assert pub is not None  # the leader writes
        return pub

    def weights_snapshot(
        self, dtype: torch.dtype, into: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor] | None:
        self._send("snapshot", dtype_name(dtype))  # the whole weights are gathered by every rank
        return self.policy.weights_snapshot(dtype, into)

    def save_snapshot(self, store: WeightsStore, version: int, snapshot: dict[str, torch.Tensor]) -> Published:
        return self.policy.save_snapshot(store, version, snapshot)  # the leader's own write: no collective

    def save_checkpoint(self, checkpointer: Checkpointer, state: TrainerState) -> Path:
        self._send("checkpoint", asdict(state))
        return self.policy.save_checkpoint(checkpointer, state)

    def keepalive(self) -> None:
        if time.monotonic() - self._sent > KEEPALIVE_S:
            self._send("noop")

    def close(self) -> None:
        try:
            self._send("stop")
        finally:
            self.policy.close()


def follow(policy: PolicyTrainer, sharding: Sharding, checkpointer: Checkpointer) -> int:
    """A follower rank: make the leader's calls until it says stop; return the steps taken.

    SIGTERM and SIGINT are ignored here: the leader stops the group (after its last checkpoint), and
    torchrun kills what is left if it does not."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    steps = 0
    try:
        while True:
            command, arg = sharding.broadcast()
            if command == "step":
                policy.step(GradedBatch.model_validate_json(arg))
                steps += 1
            elif command == "weights":
                policy.save_weights(None, arg)
            elif command == "snapshot":
                policy.weights_snapshot(dtype_of(arg))
            elif command == "checkpoint":
                policy.save_checkpoint(checkpointer, TrainerState(**arg))
            elif command == "stop":
                return steps
            elif command != "noop":
                raise RuntimeError(f"unknown trainer-group command {command!r}")
    finally:
        policy.close()


def build_policy(
    cfg: CohortConfig, member: str, settings: TrainerSettings, ckpt: Path | None, sharding: Sharding | None
) -> PolicyTrainer | GroupLeader:
    """The member's policy, resumed from ``ckpt``: in one process, or this rank's part of its group
    (the leader's wrapped in a ``GroupLeader``)."""
    if sharding is None:
        policy = PolicyTrainer(cfg, member, resolve_device(settings.device), resume_from=ckpt)
        if ckpt is not None:
            Checkpointer.load_optimizer(ckpt, policy.optimizer)
        return policy
    device = sharding.device(settings.device)
    sharding.init(device)
    policy = PolicyTrainer(cfg, member, device, resume_from=ckpt, sharding=sharding)
    return GroupLeader(policy, sharding) if sharding.leader else policy


def run_follower(cfg: CohortConfig, member: str, settings: TrainerSettings, sharding: Sharding) -> int:
    """A follower rank's whole life: load the member (and the group's newest checkpoint), then follow."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    checkpointer = Checkpointer(cfg.checkpoints_dir, member, keep=settings.keep_checkpoints)
    policy = build_policy(cfg, member, settings, checkpointer.latest(), sharding)
    assert isinstance(policy, PolicyTrainer)
    return follow(policy, sharding, checkpointer)
