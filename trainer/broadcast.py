"""The trainer's side of the in-memory weight path (``corl.transfer``): the member's weight group.

This process is rank 0 and hosts the group's rendezvous; every replica that answers joins as the next
ranks (``POST /v1/weights/transfer``; a vLLM replica with tensor parallelism takes one rank per
worker). One version goes by ``send``: ``POST /v1/weights/broadcast`` to every replica of the group at
once, then the tensors through the group, which the replicas receive concurrently; it returns each
replica's outcome. Whatever fails (a replica that refuses, dies, hangs past ``transfer_timeout_s``),
no replica serves half a version, and those not at ``ok`` are for the caller to bring up from the
version's files. A failed collective closes the group; it is built again, from the replicas that
answer, at a publish ``transfer_rejoin_s`` later. A replica that takes files only (409 on the join),
or refused the manifest (422: not this member's model), is left out of later groups.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlparse

import httpx
import torch
import torch.distributed as dist
from pydantic import ValidationError

from corl import transfer as xfer
from corl.proto import GroupBackend, WeightTransferResponse

from .metrics import TrainerMetrics
from .publish import PushOutcome
from .settings import TrainerSettings

log = logging.getLogger(__name__)

_MARGIN_S = 15.0  # HTTP answers come once the collectives end: their timeout plus this
POOL = 3  # shared-memory segments per group: two held by the replicas (serving, spare) and one to write


class WeightBroadcaster:
    """The member's weight group seen from its trainer (rank 0)."""

    def __init__(
        self,
        member: str,
        servers: Sequence[str],
        http: httpx.Client,
        headers: dict[str, str],
        settings: TrainerSettings,
        device: torch.device,
        metrics: TrainerMetrics,
        ranks_per_replica: int = 1,
    ):
        """``ranks_per_replica``: the workers of each replica's engine (vLLM's tensor-parallel size)."""
        self.member, self.servers = member, [s.rstrip("/") for s in servers]
        self.http, self.headers, self.settings, self.metrics = http, headers, settings, metrics
        backend = settings.transfer_backend
        self.backend: GroupBackend = ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend
        self.device = device if self.backend == "nccl" else torch.device("cpu")
        self.ranks_per_replica = ranks_per_replica
        self.group: xfer.TransferGroup | None = None
        self.replicas: list[str] = []  # the group's replicas, in rank order
        self.dtype: torch.dtype | None = None  # the replicas' serving dtype: floating tensors are sent in it
        self.local = False  # every replica of the group is on this host: versions go through ``segments``
        self.segments: list[xfer.shared.Segment] = []  # each holds one version; replicas may hold it as weights
        self.held: frozenset[int] | None = frozenset()  # the segments' ids replicas hold (None: every one)
        self.excluded: set[str] = set()
        self._store: dist.TCPStore | None = None
        self._address = ""
        self._last_join = -float("inf")
        self._failed_joins = 0  # in a row: each doubles the wait before the next try (up to 64x)
        self._pool = ThreadPoolExecutor(2 * len(self.servers) + 1, thread_name_prefix="corl-broadcast")

    @property
    def timeout_s(self) -> float:
        return self.settings.transfer_timeout_s

    # -- the group -----------------------------------------------------------------------------------

    def wants_join(self) -> bool:
        """No group, or one without a replica that could join; and the last try is ``transfer_rejoin_s`` old."""
        candidates = set(self.servers) - self.excluded
        if not candidates or (self.group is not None and candidates <= set(self.replicas)):
            return False
        wait = self.settings.transfer_rejoin_s * 2 ** min(self._failed_joins, 6)
        return time.monotonic() - self._last_join >= wait

    def join(self) -> bool:
        """Build the group anew with every replica that answers now; True when at least one joined.
        Returns as soon as a replica says no (the half-built group then times out on its own, in the
        background); at most ``transfer_timeout_s`` plus a short liveness probe per replica."""
        self.close_group()
        self._last_join = time.monotonic()
        self._failed_joins += 1  # until it succeeds
        live = [u for u in self.servers if u not in self.excluded and self._alive(u)]
        if not live:
            return False
        store = self._rendezvous(live[0])
        probe = self._probe()
        try:
            return self._join(live, store, probe)
        finally:
            if probe is not None:
                probe.remove()

    def _probe(self) -> xfer.shared.Probe | None:
        """A file in /dev/shm whose token a replica on this host reads back at the join (gloo groups)."""
        if self.backend != "gloo" or not self.settings.transfer_shared_memory or not xfer.shared.available():
            return None
        try:
            return xfer.shared.Probe(self.member)
        except (OSError, xfer.shared.SharedMemoryError) as err:
            log.info("%s: no shared-memory probe (%s): versions go through the group's sockets", self.member, err)
            return None

    def _join(self, live: list[str], store: dist.TCPStore, probe: xfer.shared.Probe | None) -> bool:
        gid = f"{self.member}-{uuid.uuid4().hex[:12]}"
        world = 1 + len(live) * self.ranks_per_replica
        spec = xfer.GroupSpec(gid, self._address, store.port, 0, world, self.backend, self.timeout_s)
        built: Future[xfer.TransferGroup] = Future()

        def own_rank() -> None:  # a daemon thread: a rendezvous that cannot complete must not hold an exit up
            try:
                built.set_result(xfer.TransferGroup.join(spec, store, self.device))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting side
                built.set_exception(err)

        threading.Thread(target=own_rank, name="corl-weight-group", daemon=True).start()
        posts = [
            self._pool.submit(self._post_join, u, gid, 1 + i * self.ranks_per_replica, world, probe)
            for i, u in enumerate(live)
        ]
        wait([*posts, built], timeout=self.timeout_s + _MARGIN_S, return_when=FIRST_EXCEPTION)
        try:
            answers = [f.result(timeout=0) for f in posts]
            group = built.result(timeout=0)
        except Exception as err:  # noqa: BLE001 - a replica said no, or the group did not form in time
            log.warning("%s: weight group not built (%s): versions go by files", self.member, err)
            built.add_done_callback(_close_built)
            return False
        dtypes = {a.dtype for a in answers}
        if len(dtypes) != 1:
            log.error("%s: replicas serve different dtypes %s: versions go by files", self.member, dtypes)
            group.close()
            return False
        self.group, self.replicas, self.dtype = group, live, xfer.dtype_of(dtypes.pop())
        self.local = probe is not None and all(a.shared_memory for a in answers)
        self._failed_joins = 0
        log.info("%s: weight group %s: %s (%s, %s%s)", self.member, gid, live, self.backend,
                 xfer.dtype_name(self.dtype), ", shared memory" if self.local else "")  # fmt: skip
        return True

    def close_group(self) -> None:
        group, self.group, self.replicas, self.local = self.group, None, [], False
        self._drop_segments()
        if group is not None:
            group.close()  # the replicas' pending collectives fail at once; they leave it on their next call

    def close(self) -> None:
        self.close_group()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._store = None

    def _rendezvous(self, first: str) -> dist.TCPStore:
        if self._store is None:
            host = urlparse(first).hostname or "127.0.0.1"
            self._address = self.settings.transfer_address or xfer.local_address(host)
            spec = xfer.GroupSpec("", self._address, self.settings.transfer_port, 0, 1, self.backend, self.timeout_s)
            self._store = xfer.open_store(spec, master=True)
        return self._store

    def _alive(self, url: str) -> bool:
        try:
            return self.http.get(f"{url}/v1/info", timeout=5.0).status_code == 200
        except Exception:  # noqa: BLE001 - whatever it is, the replica is not one to wait for
            return False

    def _post_join(
        self, url: str, gid: str, rank: int, world: int, probe: xfer.shared.Probe | None
    ) -> WeightTransferResponse:
        """``url``'s answer to the join, once the group has formed; raises ``_NotJoined`` otherwise."""
        body = {
            "group_id": gid,
            "master_address": self._address,
            "master_port": self._rendezvous(url).port,
            "rank_offset": rank,
            "world_size": world,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }
        if probe is not None:
            body["shared_probe"] = {"name": probe.ref.name, "token": probe.ref.token}
        try:
            resp = self.http.post(
                f"{url}/v1/weights/transfer", json=body, headers=self.headers, timeout=self.timeout_s + _MARGIN_S
            )
        except Exception as err:  # noqa: BLE001 - unreachable, or an answer that is no answer
            raise _NotJoined(f"{url}: {err!r}") from None
        if _files_only(resp):
            self.excluded.add(url)
        if resp.status_code != 200:
            raise _NotJoined(f"{url}: {resp.status_code} {resp.text[:300]}")
        try:
            return WeightTransferResponse.model_validate(resp.json())
        except (ValueError, ValidationError) as err:
            raise _NotJoined(f"{url}: {err}") from None

    # -- one version ---------------------------------------------------------------------------------

    def send(self, version: int, snapshot: dict[str, torch.Tensor], uri: str | None) -> dict[str, PushOutcome]:
        """Broadcast ``snapshot`` (name -> CPU tensor, in sending order) as ``version``: ``ok`` for each
        replica that now serves it; the others (and the replicas outside the group) need the files."""
        group = self.group
        if group is None:
            return {}
        manifest = [{"name": n, "dtype": xfer.dtype_name(t.dtype), "shape": list(t.shape)} for n, t in snapshot.items()]
        body: dict[str, Any] = {"version": version, "group_id": group.group_id, "tensors": manifest, "uri": uri}
        segment = self._segment_for(snapshot)
        if segment is not None:
            snapshot = segment.views
            body["segment"] = {"name": segment.ref.name, "token": segment.ref.token}
        t0 = time.perf_counter()
        posts = {u: self._pool.submit(self._post_broadcast, u, body) for u in self.replicas}
        sent, refused = 0, False
        try:
            sent = group.send(version, self._on_device(snapshot.values()), local=segment is not None)
            if segment is not None:
                self._segment_used(segment, group.last_local, group.last_held)
        except xfer.TransferRefused:
            refused = True  # nothing moved; the group stays whole
        except xfer.TransferError as err:
            log.warning("%s: broadcast of version %d failed: %s", self.member, version, err)
            self.close_group()
        answers = {u: _answer(f) for u, f in posts.items()}
        outcomes: dict[str, PushOutcome] = {}
        for url, (status, text) in answers.items():
            if status == 200:
                outcomes[url] = "ok"
            elif status == 422 and refused:  # the manifest is not this replica's model
                self.excluded.add(url)
                outcomes[url] = "rejected"
            elif status in (409, 422):
                outcomes[url] = "rejected"
            else:  # 503 (it left the group) or no answer at all
                outcomes[url] = "unreachable"
            if status != 200:
                log.warning("%s: replica %s did not take version %d: %s %s", self.member, url, version, status, text)
        if any(o == "unreachable" for o in outcomes.values()) or self.excluded & set(self.replicas):
            self.close_group()  # a replica left it (or must not be in it): the next publish builds it anew
        seconds = time.perf_counter() - t0
        if sent:
            self.metrics.labels(self.metrics.weight_broadcast_seconds).observe(seconds)
            self.metrics.labels(self.metrics.weight_broadcast_bytes).inc(sent)
        got = sorted(u for u, o in outcomes.items() if o == "ok")
        log.info("%s: version %d broadcast to %s in %.3fs (%d bytes)", self.member, version, got, seconds, sent)
        return outcomes

    # -- the shared-memory segments (replicas on this host) ------------------------------------------
    # Replicas take a version's pages as their weights, without a copy, and keep them while that
    # version serves and while it is their spare. So a version goes into a segment no replica holds (a
    # pool of ``POOL``: in steady state each replica holds the last two, and the third is free), and the
    # trainer learns what each holds at the end of every version. A segment a replica may still hold is
    # never written again: when none is free, one is retired (unlinked and let go; the replicas' maps stay
    # valid) and a fresh one takes its place.

    def staging(self, previous: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """Where the next snapshot should be taken into: a free segment's views where one fits
        ``previous`` (the last snapshot), so that a version is in shared memory without a copy; else
        ``previous`` (its memory already touched), unless it lies in a segment (a replica may hold it)."""
        segment = self._free(previous) if previous is not None else None
        if segment is not None:
            return segment.views
        return None if xfer.shared.in_segment(previous) else previous

    def _free(self, like: dict[str, torch.Tensor]) -> xfer.shared.Segment | None:
        held = self.held
        if held is None:
            return None
        return next((s for s in self.segments if s.id not in held and s.fits(like)), None)

    def _segment_for(self, snapshot: dict[str, torch.Tensor]) -> xfer.shared.Segment | None:
        """The segment holding ``snapshot`` (a free one copied into, or a new one, as needed); None: the sockets."""
        if not self.local:
            return None
        segment = next((s for s in self.segments if s.holds(snapshot)), None)
        if segment is not None:
            return segment
        # A group's first versions; and every version of a sharded trainer, whose snapshot is gathered anew.
        segment = self._free(snapshot)
        if segment is None:
            self._retire(snapshot)
            made = self._fill(snapshot)
            if not made:
                return None
            segment = made[0]
        for name, t in snapshot.items():
            segment.views[name].copy_(t)
        return segment

    def _fill(self, like: dict[str, torch.Tensor]) -> list[xfer.shared.Segment]:
        """New segments up to ``POOL`` (all at once: their pages are paid for here, in the background of
        a group's first version, not in a later training step); none, and the sockets, if none could be
        made."""
        made: list[xfer.shared.Segment] = []
        while len(self.segments) < POOL:
            try:
                made.append(xfer.shared.Segment.create(self.member, like))
            except (OSError, xfer.shared.SharedMemoryError) as err:
                log.warning("%s: no room for another shared-memory segment (%s)", self.member, err)
                break
            self.segments.append(made[-1])
        if not made:
            log.warning("%s: no shared-memory segment: versions go through the sockets", self.member)
            self.local = False
            self._drop_segments()
        return made

    def _retire(self, like: dict[str, torch.Tensor]) -> None:
        """Make room for a new segment: those of another layout go, and the oldest when the pool is full."""
        keep = [s for s in self.segments if s.fits(like)]
        for s in [s for s in self.segments if s not in keep] + keep[: max(0, len(keep) - POOL + 1)]:
            s.unlink()
            self.segments.remove(s)

    def _segment_used(self, segment: xfer.shared.Segment, local: bool, held: frozenset[int] | None) -> None:
        """After a send that offered ``segment``: every replica has opened it (``local``), so the file can
        go (the memory stays while mapped or open), and ``held`` says what they keep; or one could not
        map it, and the group keeps to the sockets."""
        if local:
            segment.unlink()
            self.held = held
            return
        log.warning("%s: a replica could not map the shared-memory segment: versions go through the sockets",
                    self.member)  # fmt: skip
        self.local = False
        self._drop_segments()

    def _drop_segments(self) -> None:
        segments, self.segments, self.held = self.segments, [], frozenset()
        for s in segments:
            s.unlink()

    def _on_device(self, tensors: Any) -> Iterator[torch.Tensor]:
        """Each tensor on the group's device as its turn comes (NCCL: one host-to-device copy at a time)."""
        for t in tensors:
            yield t.to(self.device, non_blocking=True) if t.device != self.device else t

    def _post_broadcast(self, url: str, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(
            f"{url}/v1/weights/broadcast", json=body, headers=self.headers, timeout=2 * self.timeout_s + _MARGIN_S
        )


def _files_only(resp: httpx.Response) -> bool:
    """A join's answer that will not change: the replica cannot be in such a group (409 on its backend),
    or has no such route (an older server). Not a rendezvous it could not reach (404 on the address)."""
    if resp.status_code == 405:
        return True
    if resp.status_code not in (404, 409):
        return False
    try:
        field = resp.json()["error"].get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        field = None
    return field == "backend" if resp.status_code == 409 else field != "master_address"


def _close_built(built: Future[xfer.TransferGroup]) -> None:
    """A group that formed after all, too late: leave it."""
    if built.exception() is None:
        built.result().close()


class _NotJoined(Exception):
    """A replica that did not join the weight group (unreachable, refused, or files only)."""


def _answer(post: Future[httpx.Response]) -> tuple[int | None, str]:
    try:
        resp = post.result()
    except Exception as err:  # noqa: BLE001 - no answer: the replica is behind either way
        return None, repr(err)
    return resp.status_code, resp.text[:300]
