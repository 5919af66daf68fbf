"""The vLLM side of the in-memory weight path: a worker extension (vLLM's ``worker_extension_cls``)
that each engine worker mixes in, so the weight group lives where the weights do (vLLM's worker
processes), not in the server process.

GPU only, and not run inside vLLM here (no GPU, no vLLM in this environment): ``engine_kwargs``
names the class only for an engine on CUDA, where the group is NCCL; its calls are tested on the CPU
over gloo with stand-in workers (``tests/integration/test_vllm_transfer_worker.py``). Every worker of
a tensor-parallel engine joins as its own rank (``rank_offset`` + its rank), receives every tensor
whole and hands it to the model's ``load_weights``, which keeps the worker's shard and fuses what
vLLM fuses (``qkv_proj``): the checkpoint's names and shapes, as for files. A tensor is loaded as
soon as it has arrived (one buffer at a time, never a second copy of the model), so a fingerprint
mismatch or a failed collective leaves the model partly overwritten: the backend then reloads the
previous version from its files (``VLLMBackend._reload``). Called through ``collective_rpc`` with
plain arguments (they are pickled to the workers).
"""

from __future__ import annotations

from typing import Any

import torch

from corl.transfer import GroupSpec, TransferGroup, TransferRefused, dtype_of, open_store

WORKER_EXTENSION = f"{__name__}.TransferWorker"


class TransferWorker:
    """Mixed into each vLLM worker: ``self.device``, ``self.rank`` and ``self.model_runner`` are the
    worker's own."""

    _corl_group: TransferGroup | None = None
    device: Any
    rank: int
    model_runner: Any

    def corl_join_group(self, spec: dict[str, Any]) -> int:
        """Join the member's weight group as rank ``rank_offset + self.rank``; returns that rank."""
        self.corl_leave_group()
        rank = int(spec["rank_offset"]) + int(getattr(self, "rank", 0))
        group_spec = GroupSpec(
            spec["group_id"],
            spec["master_address"],
            int(spec["master_port"]),
            rank,
            int(spec["world_size"]),
            spec["backend"],
            float(spec["timeout_s"]),
        )
        if torch.device(self.device).type == "cuda":
            torch.cuda.set_device(self.device)
        self._corl_group = TransferGroup.join(group_spec, open_store(group_spec, master=False), self.device)
        return rank

    def corl_leave_group(self) -> None:
        group, self._corl_group = self._corl_group, None
        if group is not None:
            group.close()

    def corl_refuse(self, version: int) -> None:
        """This worker's no in the agree step (the backend refused the manifest or the version)."""
        group = self._require_group()
        try:
            group.refuse(version)
        except TransferRefused:
            pass

    def corl_receive(self, version: int, manifest: list[tuple[str, str, list[int]]]) -> None:
        """Take ``version``: every tensor into a buffer of its own as its turn comes, loaded at once.
        Raises what ``TransferGroup.receive`` raises (the backend restores from files); a failed
        collective also leaves the group."""
        group = self._require_group()
        names = [name for name, _, _ in manifest]
        model = self.model_runner.model

        def buffers() -> Any:
            for _, dtype, shape in manifest:
                yield torch.empty(shape, dtype=dtype_of(dtype), device=self.device)

        def load(i: int, tensor: torch.Tensor) -> None:
            model.load_weights(weights=[(names[i], tensor)])

        try:
            group.receive(version, names, buffers(), load)
        except Exception:
            if group.broken:
                self.corl_leave_group()
            raise
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    def _require_group(self) -> TransferGroup:
        if self._corl_group is None:
            raise RuntimeError("this vLLM worker is in no weight group")
        return self._corl_group
