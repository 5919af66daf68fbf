"""The weight group's same-host road (``corl.transfer.shared``), each rank a thread on gloo: a version
in the trainer's shared-memory segment reaches every receiver byte for byte without the sockets, and
version after version through the same map; a receiver that cannot map it sends the whole version the
socket way; bytes that differ from what the trainer fingerprinted are named; the segment is only ever
a ``corl-weights-*`` file in /dev/shm, its token checked, its memory alive after the unlink, and a
dead trainer's file swept. A receiver that borrows the segment takes its pages as weights without
a copy, and the trainer learns which segments receivers hold and never writes those."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from functools import partial

import httpx
import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

from corl.trainer import broadcast
from corl.trainer.broadcast import WeightBroadcaster
from corl.trainer.metrics import TrainerMetrics
from corl.trainer.settings import TrainerSettings
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


def _layout(tensors: dict[str, torch.Tensor]) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    return [(t.dtype, tuple(t.shape)) for t in tensors.values()]


class _Replica:
    """A receiver that keeps its weights as the model server does: the version serving and the one before."""

    def __init__(self, group: TransferGroup) -> None:
        self.group = group
        self.slots: list[tuple[str, list[torch.Tensor]]] = []

    def take(self, version: int, segment: shared.Segment) -> None:
        pages = self.group.borrow(segment.ref, _layout(segment.views))
        assert pages is not None

        def adopt(views: Sequence[torch.Tensor]) -> set[str]:
            self.slots = [(segment.ref.name, list(views)), *self.slots[:1]]
            return {name for name, _ in self.slots}

        self.group.receive(version, NAMES, pages, segment=segment.ref, adopt=adopt)


@pytest.fixture
def pool() -> Iterator[list[shared.Segment]]:
    segments = [shared.Segment.create("test-member", _tensors(0)) for _ in range(3)]
    yield segments
    for s in segments:
        s.unlink()


def test_receivers_take_the_pages_and_the_trainer_learns_which_they_hold(
    store: dist.TCPStore, pool: list[shared.Segment]
) -> None:
    trainer, a, b = _groups(store, 3)
    replicas = [_Replica(a), _Replica(b)]
    # Each version into a segment no replica holds: 0, 1, 2, then 0 again once the replicas let it go.
    for version, (at, holding) in enumerate([(0, {0}), (1, {0, 1}), (2, {1, 2}), (0, {2, 0})], start=1):
        sent = _fill(pool[at], version)
        results = run_ranks(
            partial(trainer.send, version, list(sent.values()), local=True),
            *(partial(r.take, version, pool[at]) for r in replicas),
        )
        assert results[1:] == [None, None] and trainer.last_local, results
        assert trainer.last_held == {pool[i].id for i in holding}
        for r in replicas:  # serving this version, and the one before as the spare
            for seed, (_, slot) in zip((version, version - 1), r.slots, strict=False):
                assert all(torch.equal(x, y) for x, y in zip(_tensors(seed).values(), slot, strict=True))
    serving = replicas[0].slots[0][1][2]
    # No copy: the replica's weights are the trainer's pages (which the trainer never writes while held) ...
    pool[0].views["big"][7] += 1.0
    assert serving[7] == pool[0].views["big"][7]
    # ... and a write of the replica's own reaches neither the trainer nor the other replica.
    serving[8] = 123.0
    assert pool[0].views["big"][8] != 123.0 and replicas[1].slots[0][1][2][8] != 123.0


def test_a_borrowed_version_with_changed_bytes_is_not_taken(store: dist.TCPStore, pool: list[shared.Segment]) -> None:
    trainer, a = _groups(store, 2)
    sent = _fill(pool[0], 6)
    pages = a.borrow(pool[0].ref, _layout(pool[0].views))
    assert pages is not None
    pages[2][123] += 1.0  # this receiver's page only (copy on write): what it would take differs
    taken: list[Sequence[torch.Tensor]] = []

    def adopt(views: Sequence[torch.Tensor]) -> set[str]:
        taken.append(views)
        return {pool[0].ref.name}

    results = run_ranks(
        partial(trainer.send, 1, list(sent.values()), local=True),
        partial(a.receive, 1, NAMES, pages, segment=pool[0].ref, adopt=adopt),
    )
    assert isinstance(results[1], FingerprintMismatch) and results[1].names == ["big"] and not taken
    assert trainer.last_held == frozenset()  # nothing taken, nothing held
    assert torch.equal(pool[0].views["big"], _tensors(6)["big"]) and not trainer.broken  # the receiver's own write
    # That map is dropped: the next version through the segment is read from a fresh one (of the file
    # the receiver keeps open: the trainer has unlinked it), and taken.
    pool[0].unlink()
    sent = _fill(pool[0], 7)
    pages = a.borrow(pool[0].ref, _layout(pool[0].views))
    assert pages is not None
    results = run_ranks(
        partial(trainer.send, 2, list(sent.values()), local=True),
        partial(a.receive, 2, NAMES, pages, segment=pool[0].ref, adopt=adopt),
    )
    assert results[1] is None and len(taken) == 1 and trainer.last_held == {pool[0].id}
    assert all(torch.equal(x, y) for x, y in zip(_tensors(7).values(), taken[0], strict=True))


def test_the_trainer_never_writes_a_segment_a_replica_may_hold() -> None:
    b = WeightBroadcaster(
        "test-member", ["http://127.0.0.1:9"], httpx.Client(), {}, TrainerSettings(admin_token="t"),
        torch.device("cpu"), TrainerMetrics("test-member"),
    )  # fmt: skip
    b.local = True
    try:
        first = b._segment_for(_tensors(1))  # a group's first version: the pool is made, one filled
        assert first is not None and len(b.segments) == broadcast.POOL
        for held in (frozenset(s.id for s in b.segments), None):  # every one held, or not known
            b.held = held
            before = {s.id: {n: v.clone() for n, v in s.views.items()} for s in b.segments}
            assert b.staging(first.views) is None  # a snapshot in a segment is not written in place
            private = _tensors(2)
            assert b.staging(private) is private
            fresh = b._segment_for(private)
            assert fresh is not None and fresh.id not in before and len(b.segments) == broadcast.POOL
            # The oldest was let go (the replicas' maps stay valid) and none was written.
            for s in [first, *b.segments[:-1]] if held is not None else b.segments[:-1]:
                assert all(torch.equal(v, before[s.id][n]) for n, v in s.views.items())
        b.held = frozenset({b.segments[0].id, b.segments[1].id})
        assert b.staging(first.views) is b.segments[2].views  # free: written in place
    finally:
        b.close()
