"""Process settings of one trainer (environment, prefix ``CORL_TRAINER_``); the run itself is the cohort config."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_TRAINER_", extra="ignore", populate_by_name=True)

    consumer: str | None = Field(
        default=None,
        description="Consumer name in the 'trainer' group; default '<member>-<hostname>', stable across restarts "
        "so a restarted trainer re-reads its own pending batches at once.",
    )
    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Prometheus endpoint; None: off.")
    metrics_host: str = "0.0.0.0"
    admin_token: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_ADMIN_TOKEN", "CORL_TRAINER_ADMIN_TOKEN"),
        description="Bearer token for the model servers' POST /v1/weights.",
    )
    device: str = Field(default="auto", description="'auto' (cuda when available), 'cpu', 'cuda', 'cuda:1', ...")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads.")
    block_ms: int = Field(default=1000, ge=1, description="XREADGROUP block while there is nothing to flush.")
    flush_idle_ms: int = Field(
        default=200, ge=1, description="With unpublished or unacknowledged steps: flush after this long idle."
    )
    claim_idle_ms: int = Field(default=60_000, ge=0, description="Pending entries idle this long are reclaimed.")
    claim_every_s: float = Field(default=30.0, gt=0)
    sync_every_s: float = Field(default=15.0, gt=0, description="Check replicas' weight_version this often when idle.")
    http_timeout_s: float = Field(default=60.0, gt=0, description="Per request to a model server.")
    publish_attempts: int = Field(default=4, ge=1)
    transfer_address: str | None = Field(
        default=None,
        description="Address the member's servers reach this trainer at for weight broadcasts (its rendezvous and "
        "gloo connections); None: this host's address on the route to the first server.",
    )
    transfer_port: int = Field(default=0, ge=0, le=65535, description="Rendezvous port of the weight group; 0: any.")
    transfer_backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="The weight group's backend; auto: nccl when the trainer is on a GPU, else gloo."
    )
    transfer_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Every collective of the weight group (and joining it) fails after this long without a peer: "
        "the longest a dead or hung replica holds a publish up. The version then goes by files.",
    )
    transfer_shared_memory: bool = Field(
        default=True,
        description="Replicas on this host (that read a probe file in /dev/shm at the join) take versions from a "
        "shared-memory copy of the snapshot instead of the group's sockets; false: always the sockets.",
    )
    transfer_rejoin_s: float = Field(
        default=30.0,
        ge=0,
        description="A weight group that could not be built (or lacks a replica) is tried again after this long; "
        "each failure in a row doubles it (up to 64 times): a network that never lets the servers reach the "
        "trainer costs a join's timeout ever more rarely.",
    )
    keep_checkpoints: int = Field(default=2, ge=1)
    group_timeout_s: float = Field(
        default=1800.0, gt=0, description="A trainer group's collectives wait this long for a rank before failing."
    )
    applied_ids_kept: int = Field(default=100_000, ge=100, description="Applied batch ids kept in checkpoints.")
    keep_acked: bool = Field(
        default=False,
        description="Keep acknowledged batches in the stream (audits, tests). Off: each is deleted once the "
        "checkpoint holding its step is durable, so Redis holds only what a trainer may still need.",
    )

    def consumer_name(self, member: str) -> str:
        return self.consumer or f"{member}-{socket.gethostname()}"
