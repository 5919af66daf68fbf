"""Same-host weight transfer through shared memory: a gloo group's tensors step without the sockets.

When every replica of a member's weight group runs on the trainer's host (and sees its ``/dev/shm``),
the trainer's CPU snapshot lives in one shared-memory file, a *segment*: the snapshot is taken straight
into it, and each receiver copies the tensors from its own mapping of the same pages into its spare
weights, all replicas at once. Loopback TCP (gloo's broadcast) moves 0.6-1.4 GB/s per replica on this
machine against a memcpy's ~5 GB/s. The rest of the protocol is the group's: the agree step, the
sender's fingerprints, the receivers' checks; only the bytes take the shorter road.

- ``Probe``: at a join the trainer writes a small file with a random token; a replica that can read it
  back is on this host (and in this ``/dev/shm``); the trainer offers segments only when all can.
- ``Segment``: the trainer's file, sized for one snapshot (``posix_fallocate``: a full ``/dev/shm``
  fails here, not as a SIGBUS later), mapped shared; unlinked once every replica has mapped it, so
  the memory goes with the last process that maps it, a crash included.
- ``attach``: a receiver's read-only map of a segment, checked by its token and size, to copy from.
- ``borrow``: a receiver's private (copy-on-write) map of a segment, whose ``views`` become its
  weights without a copy. A segment whose pages a receiver's weights are is *held*: its trainer must
  not write the next version into it, and does not, because each receiver reports what it holds at
  the end of every version (the group's last all-gather) and the trainer keeps a pool of segments,
  writing each version into one no receiver holds. The receiver keeps its map: the next version
  through that segment is in pages it has already mapped. Nothing writes into a borrowed page (the
  model server gives a slot memory of its own first); a write would copy the page for that process
  alone, and the fingerprints of the next version through that map would then not match.

Paths are only ever ``SHARED_DIR/corl-weights-*``: a request cannot name another file.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import secrets
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from corl.proto.weights import SEGMENT_NAME

log = logging.getLogger(__name__)

SHARED_DIR = Path("/dev/shm")
PREFIX = "corl-weights-"
_NAME = re.compile(SEGMENT_NAME)
_MAGIC = b"corl-weights-segment-1\n"
_HEADER = 4096  # magic and token; the tensors start page-aligned
_ALIGN = 64
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: page tables filled at the map, not by a fault per page
# MAP_POPULATE on a writable private map would copy every page (it faults them in for writing):
# a borrowed map is filled for reading instead (Linux 5.14+; older kernels fault per page as read).
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
Layout = Sequence[tuple[torch.dtype, Sequence[int]]]  # each tensor's dtype and shape, in order
_MADE: list[tuple[weakref.ref[mmap.mmap], int, int]] = []  # a trainer's own maps: (map, first address, size)


class SharedMemoryError(RuntimeError):
    """The segment could not be made or read (no room, no such file, not ours)."""


@dataclass(frozen=True)
class SharedRef:
    """What a receiver is told: the segment's file name in ``SHARED_DIR`` and its token."""

    name: str
    token: str

    @property
    def path(self) -> Path:
        if not _NAME.match(self.name):
            raise SharedMemoryError(f"not a weight segment name: {self.name!r}")
        return SHARED_DIR / self.name


def available() -> bool:
    """Whether this host has a shared-memory directory this process can write."""
    return SHARED_DIR.is_dir() and os.access(SHARED_DIR, os.W_OK | os.X_OK)


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each tensor's byte offset in a segment, and the segment's size (tensors 64-byte aligned)."""
    offsets, at = [], _HEADER
    for n in sizes:
        offsets.append(at)
        at += -(-n // _ALIGN) * _ALIGN
    return offsets, at


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _safe(member: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", member)[:64]


def _sweep(member: str) -> None:
    """Remove this member's segments left by trainers that died before unlinking them (the name holds the pid)."""
    for f in SHARED_DIR.glob(f"{PREFIX}{member}-*"):
        try:
            pid = int(f.name.removeprefix(f"{PREFIX}{member}-").split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                f.unlink(missing_ok=True)  # another user's file in the sticky /dev/shm: left alone
            except OSError:
                continue
            log.info("removed %s, left by a trainer that is gone", f)
        except (ValueError, OSError):
            continue


def _new_file(member: str, kind: str, size: int) -> tuple[SharedRef, mmap.mmap]:
    token = secrets.token_hex(16)
    ref = SharedRef(f"{PREFIX}{_safe(member)}-{os.getpid()}-{kind}-{secrets.token_hex(4)}", token)
    fd = os.open(ref.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    except OSError as err:
        os.close(fd)
        ref.path.unlink(missing_ok=True)
        raise SharedMemoryError(f"no room for {size} bytes in {SHARED_DIR}: {err}") from None
    os.close(fd)
    mm[: len(_MAGIC) + 32] = _MAGIC + token.encode()
    return ref, mm


def _read_header(ref: SharedRef) -> tuple[int, int]:
    """(fd, size) of a segment whose header holds ``ref``'s token; ``SharedMemoryError`` otherwise."""
    try:
        fd = os.open(ref.path, os.O_RDONLY | os.O_NOFOLLOW)  # a link planted in /dev/shm is not followed
    except OSError as err:
        raise SharedMemoryError(f"cannot open {ref.path}: {err}") from None
    head = os.pread(fd, len(_MAGIC) + 32, 0)
    if head != _MAGIC + ref.token.encode():
        os.close(fd)
        raise SharedMemoryError(f"{ref.path} is not the segment its token names")
    return fd, os.fstat(fd).st_size


class Probe:
    """A header-only file: whoever reads its token back shares this host's ``/dev/shm``."""

    def __init__(self, member: str):
        self.ref, mm = _new_file(member, "probe", _HEADER)
        mm.close()

    def remove(self) -> None:
        self.ref.path.unlink(missing_ok=True)


def visible(ref: SharedRef) -> bool:
    """A receiver's answer to a ``Probe``: the file is there and holds the token."""
    try:
        fd, _ = _read_header(ref)
    except SharedMemoryError:
        return False
    os.close(fd)
    return True


@dataclass
class Segment:
    """The trainer's snapshot in shared memory: ``views`` (name -> tensor) are what it snapshots into."""

    ref: SharedRef
    views: dict[str, torch.Tensor]
    linked: bool = True

    @classmethod
    def create(cls, member: str, like: Mapping[str, torch.Tensor]) -> Segment:
        """A segment with room for tensors of ``like``'s names, dtypes and shapes (CPU, contiguous)."""
        _sweep(_safe(member))
        offsets, size = layout([_nbytes(t) for t in like.values()])
        ref, mm = _new_file(member, "v", size)
        raw = torch.frombuffer(mm, dtype=torch.uint8)
        _MADE[:] = [m for m in _MADE if m[0]() is not None]
        _MADE.append((weakref.ref(mm), raw.data_ptr(), size))
        views = {
            name: raw[at : at + _nbytes(t)].view(t.dtype).view(t.shape)
            for (name, t), at in zip(like.items(), offsets, strict=True)
        }
        return cls(ref, views)  # the views hold the map

    @property
    def id(self) -> int:
        return segment_id(self.ref.name)

    def fits(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Same names, dtypes and shapes, in the same order."""
        pairs = zip(tensors.values(), self.views.values(), strict=False)
        return list(tensors) == list(self.views) and all(t.dtype == v.dtype and t.shape == v.shape for t, v in pairs)

    def holds(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """``tensors`` are this segment's views (a snapshot taken straight into it)."""
        return self.fits(tensors) and all(t.data_ptr() == self.views[n].data_ptr() for n, t in tensors.items())

    def unlink(self) -> None:
        """Remove the file; every mapping (this one, the receivers') stays valid until dropped."""
        if self.linked:
            self.ref.path.unlink(missing_ok=True)
            self.linked = False


def segment_id(name: str) -> int:
    """A segment's name as a positive 63-bit number: what a receiver reports it holds."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def in_segment(tensors: Mapping[str, torch.Tensor] | None) -> bool:
    """``tensors`` lie in a segment this process made (a trainer must then not reuse them as it would
    its own buffers: a receiver may hold those pages as its weights)."""
    first = next(iter(tensors.values()), None) if tensors else None
    if first is None:
        return False
    at = first.data_ptr()
    return any(start <= at < start + size for mm, start, size in _MADE if mm() is not None)


def open_segment(ref: SharedRef, sizes: Sequence[int]) -> int:
    """A descriptor of ``ref`` checked against the manifest's byte ``sizes`` (a receiver that keeps it
    can map the segment again after its trainer unlinked the file). ``SharedMemoryError`` when it is
    not there, not the token's, or not of that layout."""
    fd, actual = _read_header(ref)
    size = layout(sizes)[1]
    if actual != size:
        os.close(fd)
        raise SharedMemoryError(f"{ref.path} holds {actual} bytes, the manifest {size}")
    return fd


def sizes_of(like: Layout) -> list[int]:
    return [torch.Size(shape).numel() * dtype.itemsize for dtype, shape in like]


def borrow(fd: int) -> torch.Tensor:
    """A private map of the open segment ``fd`` as one byte tensor (``views`` cuts it up): the
    trainer's pages, read without a copy, and what it writes there later; a write through it copies
    the page for this process only."""
    try:
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as err:
        raise SharedMemoryError(f"cannot map the segment: {err}") from None
    try:
        mm.madvise(_POPULATE_READ)
    except (OSError, ValueError):
        pass  # each page is then mapped by its first read
    return torch.frombuffer(mm, dtype=torch.uint8)


def views(raw: torch.Tensor, like: Layout) -> list[torch.Tensor]:
    """Tensors of ``like``'s dtypes and shapes on a segment's bytes ``raw`` (``borrow``)."""
    sizes = sizes_of(like)
    offsets, _ = layout(sizes)
    return [
        raw[at : at + n].view(dtype).view(tuple(shape))
        for (dtype, shape), at, n in zip(like, offsets, sizes, strict=True)
    ]


def attach(ref: SharedRef, sizes: Sequence[int]) -> list[torch.Tensor]:
    """A receiver's read-only (private) map of ``ref``: one byte tensor per tensor of ``sizes`` (the
    manifest's byte sizes, in order). ``SharedMemoryError`` when it is not there, not the token's, or
    not of that layout."""
    offsets, size = layout(sizes)
    fd = open_segment(ref, sizes)
    try:
        # The trainer's pages, as it writes them; mapped in at once (not a fault per page on the first copy).
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    with warnings.catch_warnings():  # a read-only buffer: these tensors are only ever copied from
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(mm, dtype=torch.uint8)
    return [raw[at : at + n] for at, n in zip(offsets, sizes, strict=True)]
