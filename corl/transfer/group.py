"""One member's weight-transfer group on torch.distributed, and the protocol of one version.

The group is a process group of its own (not torch's default group, which a trainer group already
uses): rank 0 is the trainer (the sender), each server replica takes the next ranks. The trainer
hosts the rendezvous (a ``TCPStore``); every group gets a fresh id, its keys a prefix of their own,
so a group rebuilt after a failure never meets the old one. gloo on the CPU (tested here), NCCL
between GPUs (the same calls, CUDA tensors; not run here).

One version, on every rank in the same order:

1. *agree*: each rank states the version and whether it takes it (an all-gather of two numbers). A
   receiver that refused (a stale version, a manifest that is not its model's) says no here, before a
   byte moves; then no rank sends or receives, and the group stays usable.
2. *tensors*: rank 0 broadcasts each tensor in manifest order, in pieces of at most 32 MiB with a few in
   flight (gloo then keeps two connections busy); receivers land them straight in their destination.
3. *fingerprints*: rank 0 broadcasts the fingerprint of each tensor as it sent it; a receiver compares
   them with its own of what arrived (``fingerprint``).

On one host (``shared``): when rank 0 offers a shared-memory segment holding the version and every
receiver mapped it, step 2 is each receiver copying from its map, all at once, or (``adopt``) taking
the segment's pages as its weights without a copy (``borrow``); a last all-gather tells rank 0 that
every receiver is done reading and which segments each still holds as weights (rank 0 writes no later
version into those).

Any failed or timed-out collective raises ``TransferError``: the group is then unusable on every rank
and is closed (which makes the others' pending collectives fail at once instead of at their timeout).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from .fingerprint import FingerprintKind, fingerprint
from .shared import Layout, SharedMemoryError, SharedRef, attach, borrow, open_segment, segment_id, sizes_of, views

log = logging.getLogger(__name__)

GroupBackend = Literal["gloo", "nccl"]
PIECE_BYTES = 32 << 20
IN_FLIGHT = 4
GLOO_CONNECTIONS = 2  # gloo devices per group: ops alternate between them, two TCP streams per peer
HELD_REPORT = 4  # segments a receiver reports holding; more reads as "every one" (-1)
BORROWED_MAPS = 4  # a receiver's maps of recent segments, kept for the next version through each


class TransferError(RuntimeError):
    """A collective failed or timed out: the group is unusable (every rank closes it)."""


class TransferRefused(RuntimeError):
    """A rank said no to this version in the agree step; nothing was sent. ``ranks``: who refused."""

    def __init__(self, version: int, ranks: list[int]):
        super().__init__(f"version {version} refused by rank(s) {ranks}: nothing was sent")
        self.ranks = ranks


class FingerprintMismatch(ValueError):
    """Tensors that arrived with other bytes than were sent (``names``)."""

    def __init__(self, names: list[str]):
        super().__init__(f"{len(names)} tensor(s) arrived with a different fingerprint: {names[:5]}")
        self.names = names


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def fingerprint_kind(backend: GroupBackend) -> FingerprintKind:
    return "wsum-64" if backend == "nccl" else "xxh3-64"


def local_address(towards: str) -> str:
    """This host's address on the route to ``towards`` (a host name or address): what a peer there
    can reach us at. No packet is sent (a UDP socket's connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(towards), 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@dataclass(frozen=True)
class GroupSpec:
    group_id: str
    master_address: str
    master_port: int
    rank: int
    world_size: int
    backend: GroupBackend
    timeout_s: float

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)


def open_store(spec: GroupSpec, master: bool) -> dist.TCPStore:
    """The rendezvous: the trainer hosts it (``master``; port 0 picks a free one), receivers connect."""
    return dist.TCPStore(
        spec.master_address,
        spec.master_port,
        None,
        master,
        spec.timeout,
        wait_for_workers=False,
    )


class TransferGroup:
    """This process's rank in one weight-transfer group (build with ``join``)."""

    def __init__(self, spec: GroupSpec, pg: Any, device: torch.device):
        self.spec, self._pg, self.device = spec, pg, device
        self.kind = fingerprint_kind(spec.backend)
        self.broken = False
        self.last_local = False  # the sender's last version went through shared memory
        self.last_held: frozenset[int] | None = None  # after it: the segments receivers hold (None: any)
        self._segment: tuple[SharedRef, list[torch.Tensor]] | None = None  # a receiver's map of it
        self._maps: OrderedDict[SharedRef, _Borrowed] = OrderedDict()  # a receiver's segments (``borrow``)
        self._holding: frozenset[str] = frozenset()  # the segments its weights lie in, as ``adopt`` said

    @property
    def group_id(self) -> str:
        return self.spec.group_id

    @classmethod
    def join(cls, spec: GroupSpec, store: dist.Store, device: torch.device | None = None) -> TransferGroup:
        """Build this rank's side; blocks until every rank has joined, or the timeout (``TransferError``)."""
        prefixed = dist.PrefixStore(f"corl/{spec.group_id}", store)
        try:
            if spec.backend == "nccl":
                pg = _nccl_group(prefixed, spec)
                device = device or torch.device("cuda", torch.cuda.current_device())
            else:
                opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
                opts._timeout = spec.timeout
                host = local_address(spec.master_address)
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)] * GLOO_CONNECTIONS
                pg = dist.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, opts)
                device = torch.device("cpu")
        except (RuntimeError, ValueError) as err:
            raise TransferError(f"could not join weight group {spec.group_id}: {err}") from err
        log.info("joined weight group %s: rank %d of %d, %s", spec.group_id, spec.rank, spec.world_size, spec.backend)
        return cls(spec, pg, device)

    def close(self) -> None:
        """Leave the group; peers' pending collectives then fail at once. Idempotent."""
        pg, self._pg = self._pg, None
        self.broken = True
        self._segment = None
        while self._maps:
            self._maps.popitem()[1].close()
        if pg is not None:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - leaving a group that is already gone
                log.debug("abort of weight group %s failed", self.group_id, exc_info=True)

    # -- collectives ---------------------------------------------------------------------------------

    def _wait(self, work: Any) -> None:
        try:
            work.wait()
        except Exception as err:  # noqa: BLE001 - gloo and NCCL report a lost peer or a timeout as RuntimeError
            self.broken = True
            raise TransferError(f"weight group {self.group_id}: {err}") from err

    def _broadcast(self, tensor: torch.Tensor) -> Any:
        if self._pg is None:
            raise TransferError(f"weight group {self.group_id} is closed")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        try:
            return self._pg.broadcast([tensor], opts)
        except Exception as err:  # noqa: BLE001 - an op on a broken group fails when issued
            self.broken = True
            raise TransferError(f"weight group {self.group_id}: {err}") from err

    def agree(self, version: int, accept: bool, local: bool = False) -> bool:
        """Step 1: every rank's (version, yes/no, local); ``TransferRefused`` when any rank says no or the
        versions differ (a rank still on another version's call). True when every rank said local: the
        sender offers a shared-memory segment and every receiver mapped it (``shared``)."""
        if self._pg is None:
            raise TransferError(f"weight group {self.group_id} is closed")
        mine = torch.tensor([version, int(accept), int(local)], dtype=torch.int64, device=self.device)
        out = self._allgather(mine)
        said = [(int(t[0]), int(t[1]), int(t[2])) for t in out]
        refused = [r for r, (v, ok, _) in enumerate(said) if v != version or not ok]
        if refused:
            raise TransferRefused(version, refused)
        return all(loc for _, _, loc in said)

    def _allgather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(mine) for _ in range(self.spec.world_size)]
        try:
            work = self._pg.allgather([out], [mine])
        except Exception as err:  # noqa: BLE001
            self.broken = True
            raise TransferError(f"weight group {self.group_id}: {err}") from err
        self._wait(work)
        return out

    def _pipelined(
        self,
        tensors: Iterable[torch.Tensor],
        before: Callable[[int, torch.Tensor], None],
        after: Callable[[int, torch.Tensor], None],
    ) -> None:
        """Broadcast every tensor in pieces, a few in flight: ``before(i, t)`` as tensor i's pieces are
        about to go, ``after(i, t)`` once they all went (each overlaps the pieces still in flight). Each
        tensor is taken from ``tensors`` once, as its turn comes (a sender may make it then, a receiver
        allocate it then and let it go in ``after``)."""
        pending: deque[tuple[Any, tuple[int, torch.Tensor] | None]] = deque()
        for i, t in enumerate(tensors):
            if not t.is_contiguous():
                raise ValueError("weight broadcasts send and receive contiguous tensors")
            before(i, t)
            flat = t.view(-1)
            pieces = flat.split(max(1, PIECE_BYTES // t.element_size())) if flat.numel() else (flat,)
            for j, piece in enumerate(pieces):
                pending.append((self._broadcast(piece), (i, t) if j == len(pieces) - 1 else None))
                while len(pending) > IN_FLIGHT:
                    self._finish(*pending.popleft(), after)
        while pending:
            self._finish(*pending.popleft(), after)

    def _finish(self, work: Any, done: tuple[int, torch.Tensor] | None, after: Callable[..., None]) -> None:
        self._wait(work)
        if done is not None:
            after(*done)

    def send(self, version: int, tensors: Iterable[torch.Tensor], local: bool = False) -> int:
        """Rank 0: one version (steps 1-3); returns the bytes sent. Tensors on this group's device (an
        iterable may move each one there as its turn comes). ``local``: the tensors are the views of a
        shared-memory segment the receivers were told of; when every one of them mapped it, they copy
        from it instead of step 2 (``self.last_local`` says which way the version went)."""
        self.last_local = self.agree(version, True, local)
        prints: list[int] = []
        sent = 0

        def before(i: int, t: torch.Tensor) -> None:  # the fingerprint of what is sent, while earlier pieces fly
            nonlocal sent
            prints.append(fingerprint(t, self.kind))
            sent += t.numel() * t.element_size()

        if self.last_local:
            for i, t in enumerate(tensors):  # the receivers copy meanwhile
                before(i, t)
        else:
            self._pipelined(tensors, before, lambda i, t: None)
        self._wait(self._broadcast(torch.tensor(prints, dtype=torch.int64, device=self.device)))
        if self.last_local:  # every receiver has finished reading: a segment none holds may be written again
            said = self._allgather(torch.zeros(HELD_REPORT, dtype=torch.int64, device=self.device))[1:]
            ids = {int(i) for t in said for i in t.tolist() if i}
            self.last_held = None if -1 in ids else frozenset(ids)
        return sent

    def refuse(self, version: int) -> None:
        """A receiver's no to this version (step 1 only); raises ``TransferRefused`` as every rank does."""
        self.agree(version, False)

    def receive(
        self,
        version: int,
        names: Sequence[str],
        dests: Iterable[torch.Tensor],
        on_tensor: Callable[[int, torch.Tensor], None] | None = None,
        segment: SharedRef | None = None,
        adopt: Callable[[Sequence[torch.Tensor]], Collection[str]] | None = None,
    ) -> None:
        """A receiver: one version into ``dests`` (one per name: contiguous, this group's device, the
        manifest's dtypes and shapes; an iterable may allocate each as its turn comes); ``on_tensor(i,
        t)`` once tensor i is in (an engine loads it, then the buffer may go). ``FingerprintMismatch``
        names the tensors whose bytes differ from what was sent (found after all of them arrived).
        ``segment``: the trainer's shared-memory segment, copied from when every receiver can map it
        (``dests`` then a sequence, so that its layout is known before the first byte). ``adopt``:
        ``dests`` are this receiver's ``borrow`` of ``segment`` already, nothing is copied, and
        ``adopt(dests)`` takes them as the weights once their fingerprints match (not when they do
        not) and returns the names of the segments the receiver's weights now lie in: what this rank
        reports holding (rank 0 writes no later version into those)."""
        borrowed = dests if adopt is not None and isinstance(dests, Sequence) else None
        sources = None
        if borrowed is None and segment is not None and isinstance(dests, Sequence):
            sources = self._map(segment, dests)
        local = self.agree(version, True, borrowed is not None or sources is not None)
        prints: list[int] = [0] * len(names)

        def after(i: int, t: torch.Tensor) -> None:  # while the next pieces arrive
            prints[i] = fingerprint(t, self.kind)
            if on_tensor is not None:
                on_tensor(i, t)

        if local and borrowed is not None:  # the bytes are there: only their fingerprints to take
            for i, t in enumerate(borrowed):
                after(i, t)
        elif local and sources is not None:
            for i, (t, src) in enumerate(zip(dests, sources, strict=True)):
                t.view(-1).view(torch.uint8).copy_(src)
                after(i, t)
        else:
            self._pipelined(dests, lambda i, t: None, after)
        sent = torch.empty(len(names), dtype=torch.int64, device=self.device)
        self._wait(self._broadcast(sent))
        bad = [names[i] for i, (a, b) in enumerate(zip(prints, sent.tolist(), strict=True)) if a != b]
        if adopt is not None and borrowed is not None:
            kept = self._maps.get(segment) if segment is not None else None
            if kept is not None and (bad or not local):  # written through, or not what the trainer wrote:
                kept.raw = None  # the next version through this segment maps it anew
            if not bad:
                self._holding = frozenset(adopt(borrowed))
        if local:
            self._allgather(self._held_report())
        if bad:
            raise FingerprintMismatch(bad)

    def borrow(self, segment: SharedRef, like: Layout) -> list[torch.Tensor] | None:
        """Tensors of ``like``'s dtypes and shapes on this rank's private map of ``segment`` (for a
        ``receive`` with ``adopt``), or None where it cannot be mapped (the version then comes by
        copy or the sockets). The map is kept for the next version through the same segment (the
        trainer unlinks the file once every receiver has it, and writes later versions into it while
        no receiver holds it): its pages are then the new version's, already mapped."""
        try:
            kept = self._maps.get(segment)
            if kept is None:
                kept = self._maps[segment] = _Borrowed(open_segment(segment, sizes_of(like)))
                while len(self._maps) > BORROWED_MAPS:
                    self._maps.popitem(last=False)[1].close()
            self._maps.move_to_end(segment)
            if kept.raw is None:
                kept.raw = borrow(kept.fd)
            return views(kept.raw, like)
        except SharedMemoryError as err:
            log.warning("weight group %s: cannot borrow the shared segment, the bytes come another way: %s",
                        self.group_id, err)  # fmt: skip
            return None

    def _held_report(self) -> torch.Tensor:
        """The segments this rank's weights lie in, as ``HELD_REPORT`` ids (0: none; -1 first: more)."""
        ids = sorted(segment_id(name) for name in self._holding)
        report = ids if len(ids) <= HELD_REPORT else [-1]
        return torch.tensor(report + [0] * (HELD_REPORT - len(report)), dtype=torch.int64, device=self.device)

    def _map(self, segment: SharedRef, dests: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """This rank's map of ``segment`` (made once per segment), or None where it cannot be read."""
        if self._segment is not None and self._segment[0] == segment:
            return self._segment[1]
        try:
            sources = attach(segment, [t.numel() * t.element_size() for t in dests])
        except SharedMemoryError as err:
            log.warning("weight group %s: shared segment not usable, the bytes come by gloo: %s", self.group_id, err)
            return None
        self._segment = (segment, sources)
        return sources


@dataclass
class _Borrowed:
    """A receiver's open segment and its map (made at the first version through it, kept for the next)."""

    fd: int
    raw: torch.Tensor | None = None

    def close(self) -> None:
        os.close(self.fd)  # the map, and any weights on it, stay valid
        self.raw = None


def _nccl_group(store: dist.Store, spec: GroupSpec) -> Any:
    """A standalone NCCL process group (GPU builds of torch only)."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None or not torch.cuda.is_available():
        raise ValueError("an NCCL weight group needs CUDA and a torch built with NCCL")
    opts = nccl.Options()
    opts._timeout = spec.timeout
    return nccl(store, spec.rank, spec.world_size, opts)
