"""The weight group's same-host road (``corl.transfer.shared``), each rank a thread on gloo: a version
in the trainer's shared-memory segment reaches every receiver byte for byte without the sockets, and
version after version through the same map; a receiver that cannot map it sends the whole version the
socket way; bytes that differ from what the trainer fingerprinted are named; the segment is only ever
a ``corl-weights-*`` file in /dev/shm, its token checked, its memory alive after the unlink, and a
dead trainer's file swept."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

from corl.transfer import FingerprintMismatch, GroupSpec, TransferGroup, shared

NAMES = ["embed", "bias", "big", "empty"]

pytestmark = pytest.mark.skipif(not shared.available(), reason="no writable /dev/shm")


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(64, 16, generator=g),
        "bias": torch.randn(17, generator=g).to(torch.bfloat16),  # 34 bytes: the next tensor is realigned
        "big": torch.randn(300_000, generator=g),
        "empty": torch.empty(0),
    }


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)


def _groups(store: dist.TCPStore, world: int) -> list[TransferGroup]:
    gid = uuid.uuid4().hex
    specs = [GroupSpec(gid, "127.0.0.1", store.port, r, world, "gloo", 10.0) for r in range(world)]
    clients = [dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=10)) for _ in specs]
    return run_ranks(*(partial(TransferGroup.join, s, c) for s, c in zip(specs, clients, strict=True)))


@pytest.fixture
def segment() -> Iterator[shared.Segment]:
    seg = shared.Segment.create("test-member", _tensors(0))
    yield seg
    seg.unlink()


def _fill(seg: shared.Segment, seed: int) -> dict[str, torch.Tensor]:
    for name, t in _tensors(seed).items():
        seg.views[name].copy_(t)
    return seg.views


def test_receivers_copy_each_version_from_the_segment(store: dist.TCPStore, segment: shared.Segment) -> None:
    trainer, a, b = _groups(store, 3)
    assert segment.ref.path.exists() and segment.ref.path.parent == shared.SHARED_DIR
    for version, seed in ((1, 1), (2, 2)):  # the second version through the maps made for the first
        sent = _fill(segment, seed)
        got = [[torch.full_like(t, 7) for t in sent.values()] for _ in range(2)]
        results = run_ranks(
            partial(trainer.send, version, list(sent.values()), local=True),
            partial(a.receive, version, NAMES, got[0], segment=segment.ref),
            partial(b.receive, version, NAMES, got[1], segment=segment.ref),
        )
        assert results[1:] == [None, None] and trainer.last_local, results
        for dests in got:
            assert all(torch.equal(x, y) for x, y in zip(_tensors(seed).values(), dests, strict=True))
        segment.unlink()  # what the trainer does after the first version: the maps stay valid
    assert not segment.ref.path.exists()


def test_one_receiver_without_a_map_sends_the_version_through_the_sockets(
    store: dist.TCPStore, segment: shared.Segment
) -> None:
    trainer, a, b = _groups(store, 3)
    sent = _fill(segment, 3)
    got = [[torch.zeros_like(t) for t in sent.values()] for _ in range(2)]
    wrong = shared.SharedRef(segment.ref.name, "0" * 32)  # b reads a token that is not the file's
    results = run_ranks(
        partial(trainer.send, 1, list(sent.values()), local=True),
        partial(a.receive, 1, NAMES, got[0], segment=segment.ref),
        partial(b.receive, 1, NAMES, got[1], segment=wrong),
    )
    assert results[1:] == [None, None] and not trainer.last_local
    for dests in got:
        assert all(torch.equal(x, y) for x, y in zip(_tensors(3).values(), dests, strict=True))


class _TornRead(TransferGroup):
    """A receiver whose map shows one byte of ``big`` other than the trainer wrote (a torn read)."""

    def _map(self, segment: shared.SharedRef, dests: list[torch.Tensor]) -> list[torch.Tensor] | None:
        sources = super()._map(segment, dests)
        assert sources is not None
        torn = sources[2].clone()
        torn[123] ^= 0x10
        return [*sources[:2], torn, *sources[3:]]


def test_bytes_other_than_the_trainer_fingerprinted_are_named(store: dist.TCPStore, segment: shared.Segment) -> None:
    trainer, a = _groups(store, 2)
    a.__class__ = _TornRead
    sent = _fill(segment, 4)
    dests = [torch.zeros_like(t) for t in sent.values()]
    results = run_ranks(
        partial(trainer.send, 1, list(sent.values()), local=True),
        partial(a.receive, 1, NAMES, dests, segment=segment.ref),
    )
    assert trainer.last_local and isinstance(results[1], FingerprintMismatch) and results[1].names == ["big"]
    assert not trainer.broken and not a.broken  # every collective completed: the group is still usable


def test_a_map_outlives_the_file_and_a_receiver_reads_nothing_else(segment: shared.Segment) -> None:
    sizes = [t.numel() * t.element_size() for t in segment.views.values()]
    sources = shared.attach(segment.ref, sizes)
    segment.unlink()
    written = _fill(segment, 5)
    assert torch.equal(sources[2], written["big"].view(torch.uint8))  # the trainer's pages, after the unlink
    with pytest.raises(shared.SharedMemoryError):
        shared.attach(segment.ref, sizes)  # the file is gone
    for name in ("../etc/passwd", "corl-weights-a/../../x", "other-file"):
        with pytest.raises(shared.SharedMemoryError, match="not a weight segment name"):
            shared.attach(shared.SharedRef(name, segment.ref.token), sizes)


def test_a_receiver_checks_the_token_and_the_size(segment: shared.Segment) -> None:
    sizes = [t.numel() * t.element_size() for t in segment.views.values()]
    with pytest.raises(shared.SharedMemoryError, match="token"):
        shared.attach(shared.SharedRef(segment.ref.name, "f" * 32), sizes)
    with pytest.raises(shared.SharedMemoryError, match="bytes"):
        shared.attach(segment.ref, [*sizes[:-1], 4096])
    probe = shared.Probe("test-member")
    try:
        assert shared.visible(probe.ref) and not shared.visible(shared.SharedRef(probe.ref.name, "a" * 32))
    finally:
        probe.remove()
    assert not shared.visible(probe.ref)


def test_a_full_shared_memory_fails_at_creation_and_leaves_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = set(shared.SHARED_DIR.glob("corl-weights-full-member-*"))
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(shared.SharedMemoryError, match="no room"):
        shared.Segment.create("full-member", _tensors(0))
    assert set(shared.SHARED_DIR.glob("corl-weights-full-member-*")) == before


def test_a_dead_trainers_segment_is_swept_by_the_next() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = shared.SHARED_DIR / f"corl-weights-sweep-member-{int(dead.stdout)}-v-0000"
    left.write_bytes(b"x")
    mine = shared.SHARED_DIR / f"corl-weights-sweep-member-{os.getpid()}-v-0001"
    mine.write_bytes(b"x")
    seg = shared.Segment.create("sweep-member", _tensors(0))
    try:
        assert not left.exists() and mine.exists()  # a live process's file stays
    finally:
        seg.unlink()
        mine.unlink()


def test_a_link_planted_under_a_segment_name_is_not_followed(segment: shared.Segment) -> None:
    link = shared.SHARED_DIR / f"corl-weights-planted-{os.getpid()}"
    link.symlink_to(segment.ref.path)  # the right header and token behind it: only the link is wrong
    try:
        sizes = [t.numel() * t.element_size() for t in segment.views.values()]
        assert shared.attach(segment.ref, sizes)  # the segment itself maps
        with pytest.raises(shared.SharedMemoryError, match="cannot open"):
            shared.attach(shared.SharedRef(link.name, segment.ref.token), sizes)
    finally:
        link.unlink()
