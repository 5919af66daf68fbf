"""``POST /v1/weights``: hot-swap a server's weights to a newer version, from files; and the in-memory
path, ``POST /v1/weights/transfer`` (join the member's weight group) then ``POST /v1/weights/broadcast``
(take one version from it)."""

from typing import Literal

from pydantic import Field

from ._base import WireInt, WireModel, WireRequest

WeightFormat = Literal["full", "lora"]
WeightTransfer = Literal["files", "broadcast"]
GroupBackend = Literal["gloo", "nccl"]

_DTYPE = r"^(float(16|32|64)|bfloat16|u?int(8|16|32|64)|bool)$"
SEGMENT_NAME = r"^corl-weights-[A-Za-z0-9_.-]{1,128}$"


class SharedSegment(WireModel):
    """A file in the trainer host's ``/dev/shm`` and the token its header holds: a replica on the same
    host reads the weights from it instead of the group's sockets (gloo groups only)."""

    name: str = Field(pattern=SEGMENT_NAME, description="File name in /dev/shm (no directory).")
    token: str = Field(pattern=r"^[0-9a-f]{32}$", description="Random; the file's header holds it.")


class WeightUpdateRequest(WireRequest):
    version: WireInt = Field(ge=1, description="Must be greater than the version now serving (else 409).")
    uri: str = Field(
        min_length=1,
        pattern=r"^[^\x00]+$",  # no path holds a NUL byte
        description="Directory in save_pretrained layout (adapter layout for lora).",
    )
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 over the bytes of every *.safetensors file in the directory, in sorted file-name order.",
    )
    xxh3_128: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="XXH3-128 over the same bytes as sha256. When given, the server checks this one instead "
        "(~20 GB/s on one core against sha256's ~1.5): it guards against torn or corrupted files as well, and "
        "neither is a signature (the admin token and the weights store are the guard).",
    )
    format: WeightFormat = "full"


class WeightUpdateResponse(WireModel):
    weight_version: int = Field(ge=0)
    previous_version: int = Field(ge=0)
    swap_seconds: float = Field(ge=0.0, description="Load, verify and swap time.")


class WeightTransferRequest(WireRequest):
    """Join the member's weight group (the trainer's rendezvous); the answer comes once every rank has
    joined, or 503 at the timeout. A new group replaces the one the server was in."""

    group_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Names this group; fresh per group.")
    master_address: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9.:_-]+$",
        description="Host name or address of the trainer's rendezvous (TCPStore); 404 when it does not answer.",
    )
    master_port: WireInt = Field(ge=1, le=65535)
    rank_offset: WireInt = Field(
        ge=1,
        le=65535,
        description="This replica's first rank (rank 0 is the trainer); its engine's workers take the next ones.",
    )
    world_size: WireInt = Field(
        ge=2, le=65536, description="Ranks in the group: the trainer and every replica's workers."
    )
    backend: GroupBackend = Field(description="gloo (CPU tensors) or nccl (CUDA tensors).")
    timeout_s: float = Field(
        default=60.0,
        gt=0.0,
        le=3600.0,
        description="Every collective of the group fails after this long without its peers (then the server "
        "keeps or restores its previous version and leaves the group).",
    )
    shared_probe: SharedSegment | None = Field(
        default=None,
        description="A probe file of the trainer's: the answer's shared_memory says whether this server can read "
        "it (then it is on the trainer's host, and versions may come through shared memory).",
    )


class WeightTransferResponse(WireModel):
    group_id: str
    ranks: list[int] = Field(description="The ranks this replica holds (one per engine worker).")
    weight_version: int = Field(ge=0)
    dtype: str = Field(description="The serving dtype: the trainer sends floating-point tensors in it.")
    shared_memory: bool = Field(
        default=False, description="It read the join's shared_probe and can take versions through shared memory."
    )


class TensorMeta(WireModel):
    name: str = Field(min_length=1, max_length=512, description="State-dict name.")
    dtype: str = Field(pattern=_DTYPE, description="torch dtype name, e.g. bfloat16.")
    shape: list[WireInt] = Field(max_length=16)


class WeightBroadcastRequest(WireRequest):
    """Take ``version`` from the weight group as the trainer broadcasts it: the manifest is checked
    before a byte moves (409 stale, 422 not this model's tensors), then the tensors arrive in manifest
    order, each checked by its fingerprint, and the version flips; the answer comes after the flip.
    A failed transfer leaves (or restores) the previous version: 422 for bytes that arrived changed,
    503 for a failed or timed-out collective."""

    version: WireInt = Field(ge=1, description="Must be greater than the version now serving (else 409).")
    group_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="The group it comes through (else 409).")
    tensors: list[TensorMeta] = Field(min_length=1, description="The manifest: what is sent, in sending order.")
    uri: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[^\x00]+$",
        description="Where the trainer writes this version's files afterwards (the durable copy): a server that "
        "must restore a version it took by broadcast reloads it from there.",
    )
    segment: SharedSegment | None = Field(
        default=None,
        description="The trainer's shared-memory segment holding this version: when every replica of the group "
        "can map it, each copies the tensors from there (same host), else they come through the group.",
    )
