"""The vLLM worker extension of the weight path, on the CPU over gloo with stand-in workers (vLLM
itself needs a GPU for it): two workers of one tensor-parallel replica join as ranks 1 and 2, each
receives every tensor whole and hands it to its model's ``load_weights`` as it lands, one buffer at a
time; bytes changed on the way are named after the load (the backend then restores from files)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

from corl.services.model.backends.vllm_engine import EngineOptions, engine_kwargs
from corl.services.model.backends.vllm_transfer import WORKER_EXTENSION, TransferWorker
from corl.transfer import FingerprintMismatch, GroupSpec, TransferGroup


class _Model:
    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.loaded += [(n, t.clone()) for n, t in weights]


class _Worker(TransferWorker):
    def __init__(self, rank: int) -> None:
        self.device, self.rank = torch.device("cpu"), rank
        self.model_runner = SimpleNamespace(model=_Model())


def test_the_engine_names_the_extension_on_gpus_only() -> None:
    assert engine_kwargs("/m", EngineOptions(), on_gpu=True, lora=False)["worker_extension_cls"] == WORKER_EXTENSION
    assert "worker_extension_cls" not in engine_kwargs("/m", EngineOptions(), on_gpu=False, lora=False)


@pytest.mark.parametrize("corrupt", [False, True], ids=["intact", "corrupted"])
def test_every_worker_loads_every_tensor_as_it_lands(corrupt: bool) -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20), wait_for_workers=False)
    gid = uuid.uuid4().hex
    spec = {
        "group_id": gid,
        "master_address": "127.0.0.1",
        "master_port": store.port,
        "rank_offset": 1,
        "world_size": 3,
        "backend": "gloo",
        "timeout_s": 20.0,
    }
    workers = [_Worker(0), _Worker(1)]  # one replica, tensor parallel 2
    trainer_spec = GroupSpec(gid, "127.0.0.1", store.port, 0, 3, "gloo", 20.0)
    ranks = run_ranks(
        lambda: TransferGroup.join(trainer_spec, store), *(lambda w=w: w.corl_join_group(spec) for w in workers)
    )
    trainer = ranks[0]
    assert ranks[1:] == [1, 2]
    tensors = {"embed": torch.randn(40, 8), "q": torch.randn(8, 8), "bias": torch.randn(8).to(torch.bfloat16)}
    manifest = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors.items()]
    sent = list(tensors.values())
    if corrupt:
        original = trainer._broadcast

        def flip(t: torch.Tensor) -> Any:
            if t.numel() == 64:  # "q": changed after its fingerprint was taken
                t = t.clone()
                t.view(torch.uint8)[5] ^= 0x04
            return original(t)

        trainer._broadcast = flip
    results = run_ranks(lambda: trainer.send(7, sent), *(lambda w=w: w.corl_receive(7, manifest) for w in workers))
    for w, result in zip(workers, results[1:], strict=True):
        loaded = w.model_runner.model.loaded
        assert [n for n, _ in loaded] == list(tensors)  # loaded one by one, in manifest order
        if corrupt:
            assert isinstance(result, FingerprintMismatch) and result.names == ["q"]
        else:
            assert result is None
            assert all(torch.equal(t, got) for t, (_, got) in zip(sent, loaded, strict=True))
    for w in workers:
        w.corl_leave_group()
    trainer.close()
