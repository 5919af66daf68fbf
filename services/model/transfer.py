"""The model server's side of the in-memory weight path (``corl.transfer``): joining the member's
weight group (``POST /v1/weights/transfer``) and taking one version from it as the trainer broadcasts
(``POST /v1/weights/broadcast``). The backend does the work; this layer checks the request against
the server (ready, the files' directory inside the weights store, the group it is in) and counts."""

from __future__ import annotations

import asyncio
import logging
import socket

from corl.proto import (
    SharedSegment,
    WeightBroadcastRequest,
    WeightTransferRequest,
    WeightTransferResponse,
    WeightUpdateResponse,
)
from corl.services.errors import ConflictError, ServiceError
from corl.transfer import GroupSpec, shared

from .backends.base import (
    BackendError,
    GroupUnsupportedError,
    RendezvousNotFoundError,
    StaleVersionError,
    TransferAbortedError,
    WeightLoadError,
)
from .serving import ModelServing

log = logging.getLogger(__name__)

_PROBE_S = 5.0  # the trainer's rendezvous answers at once when it is there


async def _reachable(host: str, port: int, timeout_s: float) -> None:
    """404 unless a TCP connection to the rendezvous opens: a group at an address this server cannot
    reach is not there for it (name resolution included, so it is bounded on its own)."""

    def probe() -> None:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass

    try:
        await asyncio.wait_for(asyncio.to_thread(probe), timeout_s + 1.0)
    except (OSError, TimeoutError, UnicodeError, ValueError) as err:
        raise RendezvousNotFoundError(f"no weight group rendezvous answers at {host}:{port}: {err}") from None


def _ref(segment: SharedSegment) -> shared.SharedRef:
    return shared.SharedRef(segment.name, segment.token)


class WrongGroupError(ConflictError):
    """The broadcast names a weight group this server is not in (409): the trainer rebuilds the group."""

    default_field = "group_id"


class WeightTransferServing:
    def __init__(self, serving: ModelServing) -> None:
        self.serving = serving

    async def join(self, req: WeightTransferRequest) -> WeightTransferResponse:
        self.serving.require_ready()
        backend = self.serving.backend
        dtype = backend.transfer_dtype()
        if dtype is None or req.backend not in backend.transfer_backends():
            takes = ", ".join(backend.transfer_backends()) or "files only"
            raise GroupUnsupportedError(f"this {backend.kind} server cannot join a {req.backend} group ({takes})")
        await _reachable(req.master_address, req.master_port, min(req.timeout_s, _PROBE_S))
        spec = GroupSpec(
            req.group_id,
            req.master_address,
            req.master_port,
            req.rank_offset,
            req.world_size,
            req.backend,
            req.timeout_s,
        )
        ranks = await backend.join_weight_group(spec)
        probe = req.shared_probe
        local = probe is not None and backend.takes_shared_memory() and shared.visible(_ref(probe))
        log.info("joined weight group %s as rank(s) %s of %d%s", req.group_id, ranks, req.world_size,
                 " (on the trainer's host: shared memory)" if local else "")  # fmt: skip
        return WeightTransferResponse(
            group_id=req.group_id, ranks=ranks, weight_version=backend.weight_version, dtype=dtype, shared_memory=local
        )

    async def receive(self, req: WeightBroadcastRequest) -> WeightUpdateResponse:
        self.serving.require_ready()
        if req.uri is not None:
            self._check_in_store(req.uri)
        backend, metrics = self.serving.backend, self.serving.metrics
        if backend.weight_group != req.group_id:
            raise WrongGroupError(f"this server is in weight group {backend.weight_group}, not {req.group_id}")
        previous = backend.weight_version
        manifest = [(t.name, t.dtype, tuple(t.shape)) for t in req.tensors]
        try:
            segment = _ref(req.segment) if req.segment is not None else None
            seconds = await backend.receive_weights(req.version, manifest, req.uri, segment)
        except (StaleVersionError, TransferAbortedError) as err:
            metrics.weight_updates.labels("conflict").inc()
            log.warning("weight broadcast %d not taken: %s", req.version, err)
            raise
        except WeightLoadError as err:
            metrics.weight_updates.labels("invalid").inc()
            log.warning("weight broadcast %d refused: %s", req.version, err)
            raise
        except ServiceError as err:
            metrics.weight_updates.labels("error").inc()
            log.warning("weight broadcast %d failed (%s); version %d serves", req.version, err, backend.weight_version)
            raise
        except Exception as err:  # an engine failure is the server's, not the caller's
            metrics.weight_updates.labels("error").inc()
            log.exception("weight broadcast %d failed", req.version)
            raise BackendError(f"weight broadcast failed: {type(err).__name__}: {err}") from err
        metrics.weight_updates.labels("ok").inc()
        metrics.weight_version.set(req.version)
        metrics.last_swap_duration.set(seconds)
        metrics.weight_transfer_seconds.labels(backend.name).observe(seconds)
        log.info("weights %d -> %d by broadcast in %.3fs", previous, req.version, seconds)
        return WeightUpdateResponse(weight_version=req.version, previous_version=previous, swap_seconds=seconds)

    def _check_in_store(self, uri: str) -> None:
        """The files' directory must be one a file update could name (403 outside the weights store)."""
        self.serving._check_in_store(uri)  # the one rule for where weights may come from
