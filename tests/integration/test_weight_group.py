"""A member's weight-transfer group on gloo over loopback (each rank a thread here): one version
reaches every receiver byte for byte; a refusal stops it before a byte moves and leaves the group
usable; bytes changed on the way are named; a rank that leaves or never comes fails the others fast
or at the timeout, never later."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

from corl.transfer import FingerprintMismatch, GroupSpec, TransferError, TransferGroup, TransferRefused
from corl.transfer import group as group_module

NAMES = ["embed", "bias", "big", "empty"]


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(64, 16, generator=g),
        torch.randn(16, generator=g).to(torch.bfloat16),
        torch.randn(300_000, generator=g),  # several pieces at the test's piece size
        torch.empty(0),
    ]


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)


def _groups(store: dist.TCPStore, world: int, timeout_s: float = 10.0) -> list[TransferGroup]:
    gid = uuid.uuid4().hex
    specs = [GroupSpec(gid, "127.0.0.1", store.port, r, world, "gloo", timeout_s) for r in range(world)]
    # One store client per rank, as each process has its own (a shared client would serialise the waits).
    clients = [dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=10)) for _ in specs]
    out = run_ranks(*(partial(TransferGroup.join, spec, client) for spec, client in zip(specs, clients, strict=True)))
    assert all(isinstance(g, TransferGroup) for g in out), f"not every rank joined: {out}"
    return out


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_module, "PIECE_BYTES", 100_000)  # the big tensor goes in 12 pieces


def test_every_receiver_gets_the_version_byte_for_byte(store: dist.TCPStore) -> None:
    trainer, a, b = _groups(store, 3)
    for version, seed in ((1, 0), (2, 1)):  # the group carries version after version
        sent = _tensors(seed)
        got = [[torch.full_like(t, 7) for t in sent] for _ in range(2)]
        results = run_ranks(
            partial(trainer.send, version, sent),
            partial(a.receive, version, NAMES, got[0]),
            partial(b.receive, version, NAMES, got[1]),
        )
        assert results == [sum(t.numel() * t.element_size() for t in sent), None, None]
        for dests in got:
            assert all(torch.equal(x, y) for x, y in zip(sent, dests, strict=True))
    for g in (trainer, a, b):
        g.close()


def test_a_refusal_moves_no_byte_and_keeps_the_group(store: dist.TCPStore) -> None:
    trainer, a, b = _groups(store, 3)
    sent, dests = _tensors(0), [torch.zeros_like(t) for t in _tensors(0)]
    results = run_ranks(lambda: trainer.send(5, sent), lambda: a.receive(5, NAMES, dests), lambda: b.refuse(5))
    assert all(isinstance(r, TransferRefused) and r.ranks == [2] for r in results)
    assert all(not d.any() for d in dests if d.numel()), "a refused version moved bytes"
    other = [torch.zeros_like(t) for t in sent]
    results = run_ranks(
        partial(trainer.send, 6, sent), partial(a.receive, 6, NAMES, dests), partial(b.receive, 6, NAMES, other)
    )
    assert results[1:] == [None, None] and torch.equal(other[2], sent[2])


class _Corrupting(TransferGroup):
    """The sender's side with one byte of one piece flipped after its fingerprint was taken."""

    flipped = False

    def _broadcast(self, tensor: torch.Tensor) -> Any:
        if not self.flipped and tensor.numel() == 100_000 // 4:
            tensor = tensor.clone()
            tensor.view(torch.uint8)[123] ^= 0x10
            self.flipped = True
        return super()._broadcast(tensor)


def test_changed_bytes_are_named(store: dist.TCPStore) -> None:
    trainer, a = _groups(store, 2)
    trainer.__class__ = _Corrupting
    sent, dests = _tensors(0), [torch.zeros_like(t) for t in _tensors(0)]
    results = run_ranks(lambda: trainer.send(1, sent), lambda: a.receive(1, NAMES, dests))
    assert isinstance(results[1], FingerprintMismatch) and results[1].names == ["big"]
    assert not trainer.broken and not a.broken  # every collective completed: the group is still usable


def test_a_rank_that_leaves_fails_the_others_fast(store: dist.TCPStore) -> None:
    trainer, a, b = _groups(store, 3, timeout_s=30)
    sent = _tensors(0)
    b.close()  # a replica that is gone: its connections close
    t0 = time.monotonic()
    results = run_ranks(lambda: trainer.send(1, sent), lambda: a.receive(1, NAMES, [torch.zeros_like(t) for t in sent]))
    assert isinstance(results[0], TransferError) and trainer.broken
    trainer.close()  # what the trainer does on a failure: the survivors' collectives end too
    assert time.monotonic() - t0 < 10, "a lost peer was waited for until the timeout"


def test_a_rank_that_never_comes_fails_the_others_at_the_timeout(store: dist.TCPStore) -> None:
    trainer, a = _groups(store, 2, timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(TransferError):
        trainer.send(1, _tensors(0))  # rank 1 is alive but never takes part
    assert time.monotonic() - t0 < 10
    a.close()
